// tessera-controller: the Tessera operator on a Kubernetes cluster.
//
//   tessera-controller [--kubeconfig FILE] [--namespace NS] [--leader-elect] [--lease-namespace NS]
//                      [--health-addr HOST:PORT] [--rendezvous-listen HOST:PORT]
//                      [--rendezvous-advertise HOST:PORT] [--worker-image IMAGE]
//                      [--status-interval SECONDS] [--workers N] [--job-defaults FILE]
//                      --token-key-file FILE
//   tessera-controller --print-permissions [--leader-elect]
//
// Every --flag VALUE may also be written --flag=VALUE.
//
// Without --kubeconfig (or KUBECONFIG) it uses the pod's service account. It reconciles the
// TrainingJobs of one namespace (default: all), serves the workers' gRPC rendezvous on
// --rendezvous-listen (default 0.0.0.0:7070) and tells pods to reach it at --rendezvous-advertise
// (default: the listen address; in a cluster, the controller Service's DNS name and port).
// --health-addr serves /healthz (the process runs), /readyz (this process leads, with
// --leader-elect, and its caches are synced: the controller Service sends workers to it alone),
// /metrics (the controller's Prometheus metrics) and /targets (the running workers' metrics
// endpoints, for Prometheus' http_sd_configs). --print-permissions prints the RBAC rules the
// controller needs, as JSON, and exits. --job-defaults names a YAML file of TrainingJob spec fields
// (the cluster's GPU node pools: placement.nodeSelector, tolerations, topologyKeys; the local-SSD
// path: cache.localSSD.path; ...) that every job gets where its own spec leaves them unset.
// --token-key-file names the secret key (at least 32 bytes, the same for every replica; the Helm
// chart keeps one in a Secret) under which each job's rendezvous token is derived from its uid, so
// the controller never reads a Secret. Exit status: 0 stopped by SIGTERM or SIGINT, 1 leadership
// lost or a failure, 2 bad flags.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include <yaml-cpp/yaml.h>

#include "api/training_job.h"
#include "common/config_node.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/http_server.h"
#include "common/log.h"
#include "controller/kube/client.h"
#include "controller/kube/leader_election.h"
#include "controller/kube/operator.h"
#include "controller/metrics/controller_metrics.h"
#include "controller/reconcile/manifest.h"
#include "controller/reconcile/reconciler.h"

namespace tessera {
namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop = true; }

const char* kUsage =
    "usage: tessera-controller [--kubeconfig FILE] [--namespace NS] [--leader-elect] [--lease-namespace NS]\n"
    "                          [--health-addr HOST:PORT] [--rendezvous-listen HOST:PORT]\n"
    "                          [--rendezvous-advertise HOST:PORT] [--worker-image IMAGE]\n"
    "                          [--status-interval SECONDS] [--workers N] [--job-defaults FILE]\n"
    "                          --token-key-file FILE\n"
    "       tessera-controller --print-permissions [--leader-elect]\n";

struct Options {
  std::string kubeconfig, health_addr, lease_namespace;
  bool leader_elect = false, print_permissions = false;
  kube::OperatorOptions op;
};

// The spec fields every job gets where it leaves them unset, checked as a job's spec would be.
nlohmann::json load_job_defaults(const std::string& file) {
  nlohmann::json spec;
  try {
    spec = reconcile::yaml_to_json(YAML::LoadFile(file));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--job-defaults", file + ": " + e.what());
  }
  if (spec.is_null()) return nlohmann::json::object();
  if (!spec.is_object()) throw ConfigError("--job-defaults", file + ": must be a mapping of TrainingJob spec fields");
  // Every job names its own data (spec.dataset is required), so the defaults need not.
  nlohmann::json checked = spec;
  if (!checked.contains("dataset")) checked["dataset"] = {{"format", "synthetic"}};
  const nlohmann::json doc = {
      {"apiVersion", api::kApiVersion}, {"kind", api::kKind}, {"metadata", {{"name", "defaults"}}}, {"spec", checked}};
  const api::ParsedJob parsed = api::parse_training_job(ConfigNode::load_string(doc.dump(), file));
  if (!parsed.ok()) {
    std::vector<FieldProblem> problems = parsed.problems;
    for (auto& p : problems) p.field = file + ": " + p.field;
    throw ConfigError(problems);
  }
  return spec;
}

// The key jobs' tokens are derived under: the file's bytes, at least 32 of them (trailing white
// space aside, as `head -c 48 /dev/urandom | base64 > FILE` writes it).
std::string load_token_key(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError("--token-key-file", file + ": cannot read the file");
  std::string key((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  if (key.size() < 32)
    throw ConfigError("--token-key-file",
                      detail::concat(file, ": ", detail::count(static_cast<int64_t>(key.size()), "byte"),
                                     "; a key needs at least 32 (head -c 48 /dev/urandom | base64 > ", file, ")"));
  return key;
}

// Empty when --help was asked for (the usage is printed).
std::optional<Options> parse(int argc, char** argv) {
  Options o;
  std::string job_defaults, token_key_file;
  double status_interval = 5;
  Flags flags("tessera-controller", kUsage);
  flags.text("--kubeconfig", &o.kubeconfig, "KUBECONFIG")
      .text("--namespace", &o.op.namespace_)
      .toggle("--leader-elect", &o.leader_elect)
      .toggle("--print-permissions", &o.print_permissions)
      .text("--lease-namespace", &o.lease_namespace)
      .text("--health-addr", &o.health_addr)
      .text("--rendezvous-listen", &o.op.rendezvous_listen)
      .text("--rendezvous-advertise", &o.op.rendezvous_advertise)
      .text("--worker-image", &o.op.worker_image)
      .text("--job-defaults", &job_defaults)
      .text("--token-key-file", &token_key_file)
      .real("--status-interval", &status_interval, Interval{0.001, 86400, false, false})
      .integer("--workers", &o.op.workers, 1, 64);
  if (!flags.parse(argc, argv)) return std::nullopt;
  o.op.status_interval = std::chrono::milliseconds(static_cast<int64_t>(std::llround(status_interval * 1000)));
  if (!job_defaults.empty()) o.op.spec_defaults = load_job_defaults(job_defaults);
  if (!token_key_file.empty()) o.op.token_key = load_token_key(token_key_file);
  return o;
}

// The RBAC rules of required_permissions(), one per (group, resource, scope), as JSON.
void print_permissions(bool leader_election) {
  nlohmann::json rules = nlohmann::json::array();
  std::map<std::tuple<std::string, std::string, bool>, nlohmann::json> by;
  std::vector<std::tuple<std::string, std::string, bool>> order;
  for (const auto& p : kube::required_permissions(leader_election)) {
    const auto k =
        std::make_tuple(p.group, p.subresource.empty() ? p.resource : p.resource + "/" + p.subresource, p.namespaced);
    if (!by.count(k)) order.push_back(k);
    by[k].push_back(p.verb);
  }
  for (const auto& k : order)
    rules.push_back({{"apiGroups", {std::get<0>(k)}},
                     {"resources", {std::get<1>(k)}},
                     {"verbs", by[k]},
                     {"scope", std::get<2>(k) ? "namespace" : "cluster"}});
  std::printf("%s\n", rules.dump(2).c_str());
}

int run(int argc, char** argv) {
  const std::optional<Options> parsed = parse(argc, argv);
  if (!parsed) return 0;
  Options o = *parsed;
  if (o.print_permissions) {
    print_permissions(o.leader_elect);
    return 0;
  }
  if (o.op.token_key.empty())
    throw ConfigError("--token-key-file",
                      "required: the secret key jobs' rendezvous tokens are derived under, the same for every "
                      "controller replica (the Helm chart keeps one in a Secret)");
  set_log_tag("controller");
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  const kube::KubeConfig config =
      o.kubeconfig.empty() ? kube::KubeConfig::in_cluster() : kube::KubeConfig::from_file(o.kubeconfig);
  kube::KubeClient client(config);
  log_info("tessera-controller: API server ", config.server, " (", config.source, "), ",
           o.op.namespace_.empty() ? std::string("all namespaces") : "namespace " + o.op.namespace_);
  // The operator (and its rendezvous port) exists only in the leader: a standby is not ready, so
  // the Service sends the workers to the leader alone.
  // Declared before the operator, which writes to them until it is destroyed (first, at the end).
  ControllerMetrics metrics;
  metrics.set_leader(false);
  std::unique_ptr<kube::KubeOperator> op;
  std::mutex op_mu;
  auto ready = [&] {
    std::lock_guard<std::mutex> lock(op_mu);
    return op && op->ready();
  };
  o.op.metrics = &metrics;
  std::unique_ptr<HttpServer> http;
  if (!o.health_addr.empty()) {
    http = std::make_unique<HttpServer>(o.health_addr, "--health-addr");
    http->handle("/healthz", [] { return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}; });
    http->handle("/readyz", [&] {
      return ready() ? HttpResponse{200, "text/plain; charset=utf-8", "ok\n"}
                     : HttpResponse{503, "text/plain; charset=utf-8", "not leading, or caches not synced\n"};
    });
    http->handle("/metrics", [&] {
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", metrics.text()};
    });
    http->handle("/targets", [&] {
      std::lock_guard<std::mutex> lock(op_mu);
      return HttpResponse{200, "application/json",
                          http_sd_targets(op ? op->metrics_targets() : std::vector<MetricsTarget>{})};
    });
    log_info("serving /healthz, /readyz, /metrics and /targets on ", o.health_addr.substr(0, o.health_addr.rfind(':')),
             ":", http->port());
  }
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
  return tessera::run_command("tessera-controller", [&] {
    try {
      return tessera::run(argc, argv);
    } catch (const tessera::kube::Stopped& e) {
      tessera::log_info(e.what());  // SIGTERM before it could start: a clean stop
      return 0;
    }
  });
}
