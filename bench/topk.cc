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

#include "worker/compress/sparse.h"
#include "worker/compress/topk.h"

namespace tessera::bench {

// The memory-bandwidth floor: the cheapest useful read of every entry (largest magnitude).
uint32_t streaming_pass(const std::vector<float>& x) {
  uint32_t m = 0;
  for (float v : x) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    m = std::max(m, u & 0x7fffffffu);
  }
  return m;
}

std::vector<float> sorted_magnitudes(const std::vector<float>& x, const std::vector<uint32_t>& idx) {
  std::vector<float> m;
  for (uint32_t i : idx) m.push_back(std::fabs(x[i]));
  std::sort(m.begin(), m.end());
  return m;
}

int topk(int argc, char** argv) {
  int64_t size = 25600000;
  double density = 0.001;
  int repeat = 5;
  bool json = false;
  Flags flags("tessera-bench topk", "usage: tessera-bench topk --size D --density R [--repeat N] [--json]\n");
  flags.integer("--size", &size, 1, int64_t{1} << 32)
      .real("--density", &density, {0, 1, true, false})
      .integer("--repeat", &repeat, 1, 1000)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  const size_t d = static_cast<size_t>(size);
  const size_t k = topk_count(d, density);
  auto x = gaussian(d, 42);
  std::vector<double> pass, nth, ms;
  std::vector<uint32_t> exact_idx, ms_idx;
  MSTopK selector;
  volatile uint32_t sink = 0;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = Clock::now();
    sink = sink + streaming_pass(x);
    pass.push_back(ms_since(t0));
    t0 = Clock::now();
    exact_topk(x, k, exact_idx);
    nth.push_back(ms_since(t0));
    t0 = Clock::now();
    selector.select(x, k, ms_idx);
    ms.push_back(ms_since(t0));
  }
  const bool exact = sorted_magnitudes(x, exact_idx) == sorted_magnitudes(x, ms_idx);
  // The scatter-add of a sparse all-gather among 4 ranks: 4k pairs at uniformly random indices (the
  // top k of independent gradients) added into a zeroed bucket of d floats, one cache miss each.
  std::vector<SparseEntry> pairs(4 * k);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> at(0, static_cast<uint32_t>(d - 1));
  for (auto& e : pairs) e = {at(rng), 1.0f};
  std::vector<float> bucket(d);
  std::vector<double> scatter;
  for (int r = 0; r < repeat; ++r) {
    std::fill(bucket.begin(), bucket.end(), 0.0f);
    const auto t0 = Clock::now();
    scatter_add(bucket, pairs);
    scatter.push_back(ms_since(t0));
  }
  const double p = median(pass), n = median(nth), m = median(ms), sc = median(scatter);
  // The peer: torch.topk on as many floats, one thread (null without python3-torch).
  const nlohmann::json peer =
      python_peer(detail::concat("torch_topk.py --size ", d, " --density ", density, " --repeat ", repeat));
  const double torch_ms = peer.is_object() ? peer.value("torch_topk_ms", 0.0) : 0.0;
  if (json) {
    std::printf(
        "{\"bench\":\"topk\",\"size\":%zu,\"density\":%g,\"k\":%zu,\"repeat\":%d,\"pass_ms\":%.3f,"
        "\"nth_element_ms\":%.3f,\"mstopk_ms\":%.3f,\"mstopk_over_pass\":%.3f,\"mstopk_over_nth_element\":%.4f,"
        "\"passes\":%zu,\"candidates\":%zu,\"exact\":%s,\"scatter_pairs\":%zu,\"scatter_ms\":%.3f",
        d, density, k, repeat, p, n, m, m / p, m / n, selector.last().passes, selector.last().candidates,
        exact ? "true" : "false", pairs.size(), sc);
    if (torch_ms > 0) std::printf(",\"torch_topk_ms\":%.3f,\"mstopk_over_torch_topk\":%.4f", torch_ms, m / torch_ms);
    std::printf("}\n");
  } else {
    std::printf("top-k of %zu floats, k=%zu (density %g), median of %d, one thread\n", d, k, density, repeat);
    std::printf("  streaming pass   %9.3f ms  (%.1f GB/s)\n", p, d * 4 / p / 1e6);
    std::printf("  nth_element      %9.3f ms\n", n);
    std::printf("  MSTopK           %9.3f ms  = %.2fx pass, %.3fx nth_element, %s\n", m, m / p, m / n,
                exact ? "exact" : "NOT the true top-k");
    std::printf("  scatter-add      %9.3f ms  (%zu pairs, %.1f ns each)\n", sc, pairs.size(), sc * 1e6 / pairs.size());
    if (torch_ms > 0) {
      std::printf("  torch.topk       %9.3f ms  (MSTopK %.3fx)\n", torch_ms, m / torch_ms);
    } else {
      std::printf("  torch.topk: not measured (install python3-torch)\n");
    }
  }
  return exact ? 0 : 1;
}

// ---- exchange ----

}  // namespace tessera::bench
