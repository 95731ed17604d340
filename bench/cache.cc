#include "bench/bench.h"

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

#include "testing/fork_ranks.h"
#include "testing/process.h"
#include "worker/data/file_dataset.h"
#include "worker/train/trainer.h"

namespace tessera::bench {

int cache(int argc, char** argv) {
  double mbps = 50;
  int size = 64, samples = 32, epochs = 2, batch = 4, threads = 2;
  bool json = false;
  Flags flags(
      "tessera-bench cache",
      "usage: tessera-bench cache --remote-mbps R [--size W --samples N --epochs E --batch B --threads T] [--json]\n");
  flags.real("--remote-mbps", &mbps, Interval{0, 1e6, true, false})
      .integer("--size", &size, 8, 4096)
      .integer("--samples", &samples, 1, 1'000'000)
      .integer("--epochs", &epochs, 1, 100000)
      .integer("--batch", &batch, 1, 1 << 20)
      .integer("--threads", &threads, 1, 1024)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  if (!(mbps > 0)) throw ConfigError("--remote-mbps", "must be positive");
  const std::string dir = testing::make_temp_dir("tessera-cache-bench");
  JobConfig job = hdf5_job(dir, samples, size, batch, threads);
  job.data.remote_mbps = mbps;
  job.data.remote_latency_ms = 2;
  job.data.cache.memory_bytes = int64_t{4} << 30;

  nlohmann::json rows = nlohmann::json::array();
  auto run = [&](int n_epochs, const std::string& label) {
    job.training.epochs = n_epochs;
    Trainer trainer(job, nullptr);
    double wait = 0, total = 0;
    int64_t steps = 0;
    auto t0 = Clock::now();
    TieredCache::Counters before{};
    uint64_t remote_before = 0;
    trainer.on_step = [&](const StepRecord& r) {
      wait += r.data_s;
      total += r.data_s + r.forward_s + r.backward_s + r.comm_s + r.update_s;
      ++steps;
    };
    trainer.on_epoch = [&](const EpochRecord& e) {
      const auto c = trainer.cache()->counters();
      const double secs = ms_since(t0) / 1e3;
      uint64_t served = 0, hits[3];
      for (int t = 0; t < 3; ++t) {
        hits[t] = c.hits[t] - before.hits[t];
        served += hits[t];
      }
      const double bytes = static_cast<double>((c.bytes[0] + c.bytes[1] + c.bytes[2]) -
                                               (before.bytes[0] + before.bytes[1] + before.bytes[2]));
      nlohmann::json row = {{"run", label},
                            {"epoch", e.epoch},
                            {"steps", steps},
                            {"data_wait_fraction", wait / total},
                            {"read_mb_per_s", bytes / 1e6 / secs},
                            {"remote_mb", (trainer.remote_bytes_read() - remote_before) / 1e6},
                            {"hit_ratio_memory", double(hits[0]) / served},
                            {"hit_ratio_ssd", double(hits[1]) / served},
                            {"hit_ratio_remote", double(hits[2]) / served},
                            {"epoch_seconds", secs}};
      rows.push_back(row);
      if (!json)
        std::printf(
            "%-9s epoch %d: data wait %5.1f%% of step time, %7.1f MB/s of decoded blocks, %6.1f MB read remotely, "
            "hits: "
            "memory %.2f, SSD %.2f, remote %.2f\n",
            label.c_str(), e.epoch, 100 * wait / total, bytes / 1e6 / secs, row["remote_mb"].get<double>(),
            row["hit_ratio_memory"].get<double>(), row["hit_ratio_ssd"].get<double>(),
            row["hit_ratio_remote"].get<double>());
      before = c;
      remote_before = trainer.remote_bytes_read();
      wait = total = 0;
      steps = 0;
      t0 = Clock::now();
    };
    trainer.run();
  };
  if (!json)
    std::printf("CosmoFlow %d^3 from %d HDF5 samples, remote tier throttled to %.0f MB/s, batch %d, %d threads\n", size,
                samples, mbps, batch, threads);
  run(epochs, "first");
  run(1, "restarted");  // a new worker process: empty memory, the SSD tier from before
  std::filesystem::remove_all(dir);
  if (json) {
    nlohmann::json out = {
        {"bench", "cache"}, {"remote_mbps", mbps}, {"size", size}, {"samples", samples}, {"epochs", rows}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

// ---- placement ----

}  // namespace tessera::bench
