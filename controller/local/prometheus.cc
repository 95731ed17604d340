#include "controller/local/prometheus.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"

namespace tessera::local {
namespace {

// honor_labels: the series' own job and namespace labels (the TrainingJob's) are kept.
std::string prometheus_config(const std::string& controller) {
  return detail::concat(
      "# Written by tessera run.\n", "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n", "scrape_configs:\n",
      "  - job_name: tessera-controller\n    honor_labels: true\n    static_configs:\n      - targets: ['", controller,
      "']\n", "  - job_name: tessera-workers\n    honor_labels: true\n    http_sd_configs:\n", "      - url: http://",
      controller, "/targets\n        refresh_interval: 2s\n");
}

// Whether GET http://<host:port>/-/ready answers 200.
bool ready(const std::string& listen) {
  const auto colon = listen.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(listen.c_str() + colon + 1)));
  const std::string host = listen.substr(0, colon);
  if (inet_pton(AF_INET, host == "0.0.0.0" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  timeval timeout{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /-/ready HTTP/1.0\r\nHost: " + listen + "\r\n\r\n";
    char reply[64] = {0};
    ok = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()) &&
         ::recv(fd, reply, sizeof(reply) - 1, 0) > 12 && std::string(reply).find(" 200 ") != std::string::npos;
  }
  ::close(fd);
  return ok;
}

}  // namespace

LocalPrometheus::LocalPrometheus(const std::string& dir, const std::string& bin, const std::string& listen,
                                 const std::string& controller, std::function<void(const std::string&)> say)
    : dir_(dir), bin_(bin), say_(std::move(say)) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(dir) / "data");
  std::ofstream(fs::path(dir) / "prometheus.yml") << prometheus_config(controller);
  const std::string log = (fs::path(dir) / "prometheus.log").string();
  process_ = std::make_unique<Process>(
      std::vector<std::string>{bin, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
                               "--web.listen-address=" + listen},
      std::vector<std::string>{}, log);
  // The job starts once Prometheus serves: a run is never cut short of its own data. (Prometheus
  // applies new scrape targets every 5 s, so a worker's first samples come a few seconds after it starts.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!ready(listen)) {
    if (process_->poll()) throw Error(detail::concat("Prometheus exited at its start; see ", log));
    if (std::chrono::steady_clock::now() > deadline) {
      say_(detail::concat("Prometheus at http://", listen, " is not ready after 30 s; the job starts anyway (log ", log,
                          ")"));
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  say_(detail::concat("Prometheus at http://", listen, " (log ", log, ")"));
}

LocalPrometheus::~LocalPrometheus() {
  process_->stop(std::chrono::milliseconds(10000));
  say_(detail::concat("Prometheus stopped; its data stays in ", dir_, ": `", bin_, " --config.file=", dir_,
                      "/prometheus.yml --storage.tsdb.path=", dir_, "/data` serves it again"));
}

}  // namespace tessera::local
