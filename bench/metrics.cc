#include "bench/bench.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <atomic>

#include "common/http_server.h"
#include "testing/fork_ranks.h"
#include "worker/metrics/worker_metrics.h"
#include "worker/train/job_config.h"
#include "worker/train/trainer.h"

namespace tessera::bench {

long http_get_size(int port, const char* path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  long n = -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: bench\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      n = 0;
      char buf[65536];
      for (ssize_t r; (r = read(fd, buf, sizeof(buf))) > 0;) n += r;
    }
  }
  close(fd);
  return n;
}

// The cost of the worker's metrics, in one training run: the exporter (its updates every step, a
// scraper reading /metrics every --scrape-ms) is on for --block steps, off for the next --block,
// and so on, so drift and the machine's noise fall on both; the median step time of each, and
// the exporter's own work timed directly (updates per step, serialisation per scrape).
int metrics(int argc, char** argv) {
  int size = 32, samples = 64, epochs = 16, block = 4, batch = 4, threads = 2, scrape_ms = 100;
  bool json = false;
  Flags flags("tessera-bench metrics",
              "usage: tessera-bench metrics [--size W --samples N --epochs E --block K --batch B --threads T "
              "--scrape-ms M] [--json]\n");
  flags.integer("--size", &size, 8, 4096)
      .integer("--samples", &samples, 8, 1'000'000)
      .integer("--epochs", &epochs, 1, 100000)
      .integer("--block", &block, 1, 100000)
      .integer("--batch", &batch, 1, 1 << 20)
      .integer("--threads", &threads, 1, 1024)
      .integer("--scrape-ms", &scrape_ms, 1, 3'600'000)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  const std::string dir = testing::make_temp_dir("tessera-metrics-bench");
  JobConfig job = hdf5_job(dir, samples, size, batch, threads);
  job.training.epochs = epochs;
  job.checkpoint.path = dir + "/checkpoints";
  job.checkpoint.every_steps = 8;
  Trainer trainer(job, nullptr);
  WorkerMetrics m(WorkerIdentity{"bench", "default", "local-0", "bench-0-0", 0});
  HttpServer http("127.0.0.1:0", "--metrics-addr");
  double observe_s = 0, serialize_s = 0;
  long scrapes = 0;
  http.handle("/metrics", [&] {
    const auto t0 = Clock::now();
    HttpResponse r{200, "text/plain; version=0.0.4", m.text()};
    serialize_s += ms_since(t0) / 1e3;  // scrapes are served one at a time
    return r;
  });
  std::atomic<bool> on{false}, stop{false};
  std::thread scraper([&, port = http.port()] {
    while (!stop) {
      if (on && http_get_size(port, "/metrics") > 0) ++scrapes;
      std::this_thread::sleep_for(std::chrono::milliseconds(scrape_ms));
    }
  });
  std::vector<double> with, without;
  int64_t step = 0;
  trainer.on_step = [&](const StepRecord& r) {
    const auto t0 = Clock::now();
    if (on) m.observe(r, batch, trainer.cache());
    const double took = ms_since(t0) / 1e3;
    if (on) observe_s += took;
    const double s = r.data_s + r.forward_s + r.backward_s + r.comm_s + r.update_s + r.checkpoint_s + took;
    if (step >= 2 * block) (on ? with : without).push_back(s);  // the first blocks warm the cache
    ++step;
    on = (step / block) % 2 == 1;
  };
  trainer.run();
  stop = true;
  scraper.join();
  std::filesystem::remove_all(dir);
  const double a = median(with), b = median(without);
  const double overhead = (a - b) / b;
  const double observe_us = 1e6 * observe_s / std::max<size_t>(1, with.size());
  const double serialize_us = 1e6 * serialize_s / std::max<long>(1, scrapes);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"bench", "metrics"},
                                       {"size", size},
                                       {"batch", batch},
                                       {"threads", threads},
                                       {"steps_with", with.size()},
                                       {"steps_without", without.size()},
                                       {"block", block},
                                       {"scrape_ms", scrape_ms},
                                       {"scrapes", scrapes},
                                       {"step_seconds_with", a},
                                       {"step_seconds_without", b},
                                       {"overhead", overhead},
                                       {"observe_us_per_step", observe_us},
                                       {"serialize_us_per_scrape", serialize_us},
                                       {"observe_fraction_of_step", observe_us / 1e6 / b}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "metrics: median step %.2f ms with the exporter (%zu steps, %ld scrapes every %d ms), %.2f ms without (%zu "
        "steps): overhead %+.2f%%; the updates take %.1f us per step (%.4f%% of a step), a scrape's "
        "serialisation %.0f us\n",
        a * 1e3, with.size(), scrapes, scrape_ms, b * 1e3, without.size(), 100 * overhead, observe_us,
        100 * observe_us / 1e6 / b, serialize_us);
  }
  return 0;
}

}  // namespace tessera::bench
