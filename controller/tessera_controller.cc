// tessera-controller: the Tessera operator on a Kubernetes cluster.
//
//   tessera-controller [--kubeconfig FILE] [--namespace NS] [--leader-elect] [--lease-namespace NS]
//                      [--health-addr HOST:PORT] [--rendezvous-listen HOST:PORT]
//                      [--rendezvous-advertise HOST:PORT] [--worker-image IMAGE]
//                      [--status-interval SECONDS] [--workers N]
//
// Without --kubeconfig (or KUBECONFIG) it uses the pod's service account. It reconciles the
// TrainingJobs of one namespace (default: all), serves the workers' gRPC rendezvous on
// --rendezvous-listen (default 0.0.0.0:7070) and tells pods to reach it at --rendezvous-advertise
// (default: the listen address; in a cluster, the controller Service's DNS name and port).
// --health-addr serves /healthz (the process runs) and /readyz (this process leads, with
// --leader-elect, and its caches are synced: the controller Service sends workers to it alone). Exit status: 0 stopped by SIGTERM or
// SIGINT, 1 leadership lost or a failure, 2 bad flags.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>

#include "controller/kube/client.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/operator.h"
#include "worker/core/error.h"
#include "worker/core/log.h"

namespace tessera {
namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop = true; }

const char* kUsage =
    "usage: tessera-controller [--kubeconfig FILE] [--namespace NS] [--leader-elect] [--lease-namespace NS]\n"
    "                          [--health-addr HOST:PORT] [--rendezvous-listen HOST:PORT]\n"
    "                          [--rendezvous-advertise HOST:PORT] [--worker-image IMAGE]\n"
    "                          [--status-interval SECONDS] [--workers N]\n";

struct Options {
  std::string kubeconfig, health_addr, lease_namespace;
  bool leader_elect = false;
  kube::OperatorOptions op;
};

// A minimal HTTP server for the kubelet's probes: GET /healthz and /readyz.
class HealthServer {
 public:
  HealthServer(const std::string& address, std::function<bool()> ready) : ready_(std::move(ready)) {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos) throw ConfigError("--health-addr", "'" + address + "' is not HOST:PORT");
    std::string host = address.substr(0, colon);
    const int port = std::atoi(address.c_str() + colon + 1);
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (host.empty() || host == "0.0.0.0") a.sin_addr.s_addr = INADDR_ANY;
    else if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
      throw ConfigError("--health-addr", "'" + host + "' is not an IPv4 address");
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd_, 16) != 0)
      throw ConfigError("--health-addr", "cannot listen on " + address + ": " + std::strerror(errno));
    thread_ = std::thread([this] { serve(); });
  }
  ~HealthServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void serve() {
    for (;;) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      char buf[1024];
      const ssize_t n = read(c, buf, sizeof(buf) - 1);
      std::string req(buf, n > 0 ? static_cast<size_t>(n) : 0);
      std::string code = "404 Not Found", body = "not found\n";
      if (req.rfind("GET /healthz", 0) == 0) code = "200 OK", body = "ok\n";
      else if (req.rfind("GET /readyz", 0) == 0) {
        if (ready_()) code = "200 OK", body = "ok\n";
        else code = "503 Service Unavailable", body = "caches not synced\n";
      }
      const std::string resp = "HTTP/1.1 " + code + "\r\nContent-Type: text/plain\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      [[maybe_unused]] ssize_t w = write(c, resp.data(), resp.size());
      close(c);
    }
  }
  int fd_ = -1;
  std::function<bool()> ready_;
  std::thread thread_;
};

Options parse(int argc, char** argv) {
  Options o;
  if (const char* k = std::getenv("KUBECONFIG"); k && *k) o.kubeconfig = k;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--kubeconfig") o.kubeconfig = value();
    else if (a == "--namespace") o.op.namespace_ = value();
    else if (a == "--leader-elect") o.leader_elect = true;
    else if (a == "--lease-namespace") o.lease_namespace = value();
    else if (a == "--health-addr") o.health_addr = value();
    else if (a == "--rendezvous-listen") o.op.rendezvous_listen = value();
    else if (a == "--rendezvous-advertise") o.op.rendezvous_advertise = value();
    else if (a == "--worker-image") o.op.worker_image = value();
    else if (a == "--status-interval") {
      const std::string v = value();
      char* end = nullptr;
      const double s = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || s <= 0) throw ConfigError(a, "'" + v + "' is not a positive number of seconds");
      o.op.status_interval = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
    } else if (a == "--workers") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 1 || n > 64) throw ConfigError(a, "'" + v + "' is not a number of threads in [1, 64]");
      o.op.workers = static_cast<int>(n);
    } else {
      throw ConfigError(a, std::string("unknown flag\n") + kUsage);
    }
  }
  return o;
}

int run(int argc, char** argv) {
  Options o = parse(argc, argv);
  set_log_tag("controller");
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  const kube::KubeConfig config = o.kubeconfig.empty() ? kube::KubeConfig::in_cluster() : kube::KubeConfig::from_file(o.kubeconfig);
  kube::KubeClient client(config);
  log_info("tessera-controller: API server ", config.server, " (", config.source, "), ",
           o.op.namespace_.empty() ? std::string("all namespaces") : "namespace " + o.op.namespace_);
  // The operator (and its rendezvous port) exists only in the leader: a standby is not ready, so
  // the Service sends the workers to the leader alone.
  std::unique_ptr<kube::KubeOperator> op;
  std::mutex op_mu;
  auto ready = [&] {
    std::lock_guard<std::mutex> lock(op_mu);
    return op && op->ready();
  };
  std::unique_ptr<HealthServer> health;
  if (!o.health_addr.empty()) health = std::make_unique<HealthServer>(o.health_addr, ready);
  auto make_operator = [&] {
    auto made = std::make_unique<kube::KubeOperator>(client, o.op);
    log_info("rendezvous on ", o.op.rendezvous_listen, ", advertised to workers as ", made->rendezvous_address());
    made->preflight(g_stop);
    std::lock_guard<std::mutex> lock(op_mu);
    op = std::move(made);
  };
  if (!o.leader_elect) {
    make_operator();
    op->run(g_stop);
    return 0;
  }
  kube::LeaderElectionOptions le;
  le.lease_namespace = !o.lease_namespace.empty() ? o.lease_namespace
                       : !o.op.namespace_.empty() ? o.op.namespace_
                                                  : config.default_namespace;
  kube::LeaderElector elector(client, le);
  std::thread operating;
  std::atomic<bool> stop_operating{false};
  std::exception_ptr failure;
  const bool lost = elector.run(
      [&] {
        operating = std::thread([&] {
          try {
            make_operator();
            op->run(stop_operating);
          } catch (...) {
            failure = std::current_exception();
            g_stop = true;
          }
        });
      },
      [&] { stop_operating = true; }, &g_stop);
  stop_operating = true;
  if (operating.joinable()) operating.join();
  if (failure) std::rethrow_exception(failure);
  if (lost) {
    log_warn("leadership lost: exiting so that a fresh process campaigns again");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera-controller", [&] { return tessera::run(argc, argv); });
}
