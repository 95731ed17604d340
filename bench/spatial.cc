#include "bench/bench.h"

#include <omp.h>
#include <sys/resource.h>
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

#include "testing/fork_ranks.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/models/model.h"
#include "worker/spatial/layers.h"

namespace tessera::bench {

int spatial(int argc, char** argv) {
  ModelConfig mc;
  mc.name = "cosmoflow";
  mc.input_size = 128;
  int batch = 1, iters = 2;
  std::string splits_s = "1,2,4";
  bool json = false;
  Flags flags(
      "tessera-bench spatial",
      "usage: tessera-bench spatial --model cosmoflow --size W --splits 1,2,4 [--batch B --iters I] [--json]\n");
  flags.text("--model", &mc.name)
      .integer("--size", &mc.input_size, 8, 4096)
      .integer("--batch", &batch, 1, 1 << 20)
      .integer("--iters", &iters, 1, 100000)
      .text("--splits", &splits_s)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  if (mc.name != "cosmoflow") throw ConfigError("--model", "spatial parallelism is available for cosmoflow");
  std::vector<int> splits;
  for (size_t pos = 0; pos < splits_s.size();) {
    size_t comma = splits_s.find(',', pos);
    const std::string part = splits_s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1)
      throw ConfigError("--splits", "'" + splits_s + "' is not a list of positive integers");
    splits.push_back(static_cast<int>(v));
    pos = comma == std::string::npos ? splits_s.size() : comma + 1;
  }
  nlohmann::json results = nlohmann::json::array();
  double base_ms = 0, base_mem = 0;
  for (int S : splits) {
    const std::string dir = testing::make_temp_dir("tessera-spatial-bench");
    auto outcomes = testing::fork_ranks(
        S,
        [&](int r, std::string& report) {
          omp_set_num_threads(1);
          FileStore store(dir);
          std::unique_ptr<Communicator> comm;
          ModelConfig c = mc;
          if (S > 1) {
            std::vector<int> members(S);
            for (int i = 0; i < S; ++i) members[i] = i;
            GlooCommunicator::Options o;
            o.group = "spatial";
            o.timeout = Millis(600000);
            comm = GlooCommunicator::connect(store, r, members, o);
            c.spatial = SpatialGrid{S, 1, 1};
          }
          auto model = make_model(c, comm.get());
          Shape in = {batch, 4, mc.input_size, mc.input_size, mc.input_size};
          if (const Partition* p = model->input_partition())
            for (int d = 0; d < 3; ++d) in[2 + d] = p->owned(d).size();
          Tensor x = random_tensor(in, 10 + r);
          Tensor y = random_tensor({static_cast<int64_t>(model->held_samples(batch).size()), 4}, 20);
          auto params = model->params();
          auto step = [&] {
            for (Param* p : params) p->grad.zero();
            Tensor out = model->forward(x, true);
            LossResult l = model->loss(out, y);
            if (out.dim(0) == 0) l.grad = Tensor(out.shape());
            model->backward(l.grad);
          };
          auto halo = [&] {
            uint64_t b = 0;
            for (Layer* l : model->layers()) {
              if (auto* dc = dynamic_cast<DistConv*>(l)) b += dc->halo_bytes();
              if (auto* dp = dynamic_cast<DistPool*>(l)) b += dp->halo_bytes();
            }
            return b;
          };
          step();  // warm-up: primitives built, buffers allocated
          const int64_t before = live_tensor_bytes();
          reset_peak_tensor_bytes();
          const uint64_t halo0 = halo();
          if (comm) comm->barrier(Millis(0));
          auto t0 = Clock::now();
          for (int i = 0; i < iters; ++i) step();
          const double ms = ms_since(t0) / iters;
          struct rusage ru;
          getrusage(RUSAGE_SELF, &ru);
          report = detail::concat(ms, " ", peak_tensor_bytes() - before, " ", (halo() - halo0) / iters, " ",
                                  ru.ru_maxrss * 1024L);
          return 0;
        },
        std::chrono::minutes(10));
    std::filesystem::remove_all(dir);
    double worst_ms = 0, worst_mem = 0, rss = 0;
    uint64_t halo_bytes = 0;
    for (int r = 0; r < S; ++r) {
      if (outcomes[r].exit_code != 0)
        throw Error(detail::concat("spatial bench: rank ", r, " of ", S, " failed: ", outcomes[r].report));
      std::istringstream in(outcomes[r].report);
      double ms, mem, rs;
      uint64_t hb;
      in >> ms >> mem >> hb >> rs;
      worst_ms = std::max(worst_ms, ms);
      worst_mem = std::max(worst_mem, mem);
      rss = std::max(rss, rs);
      halo_bytes = std::max(halo_bytes, hb);
    }
    if (base_ms == 0) {
      base_ms = worst_ms;
      base_mem = worst_mem;
    }
    results.push_back({{"split", S},
                       {"ms_per_sample", worst_ms / batch},
                       {"peak_activation_bytes", worst_mem},
                       {"peak_rss_bytes", rss},
                       {"halo_bytes_per_step", halo_bytes},
                       {"time_vs_first", worst_ms / base_ms},
                       {"memory_vs_first", worst_mem / base_mem}});
    if (!json)
      std::printf(
          "split %d: %9.1f ms per sample (%.2fx), peak activations %8.1f MB per rank (%.2fx), halo %7.2f MB per "
          "step, peak RSS %7.1f MB\n",
          S, worst_ms / batch, worst_ms / base_ms, worst_mem / 1e6, worst_mem / base_mem, halo_bytes / 1e6, rss / 1e6);
  }
  if (json) {
    nlohmann::json out = {{"bench", "spatial"}, {"model", mc.name},      {"size", mc.input_size},
                          {"batch", batch},     {"threads_per_rank", 1}, {"splits", results}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

// ---- cache ----

// CosmoFlow on a generated HDF5 dataset of `samples` size^3 fields in dir (validation: one batch),
// read through the memory cache and an SSD tier in dir/ssd; Adam, quiet.

}  // namespace tessera::bench
