#include "common/exchange_choice.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"

namespace tessera::cost {
namespace {

std::string seconds_text(double s) {
  const double r = s >= 1 ? std::round(s * 100) / 100 : std::round(s * 1000) / 1000;
  return detail::concat(r, " s");
}

std::string rate_text(double bits_per_second) {
  if (bits_per_second >= 1e9) return detail::concat(std::round(bits_per_second / 1e7) / 100, " Gbit/s");
  return detail::concat(std::round(bits_per_second / 1e4) / 100, " Mbit/s");
}

}  // namespace

std::string ExchangeOption::name() const {
  if (!hybrid) return strategy_name(dense);
  return detail::concat(strategy_name(sparse), " at density ", density, ", then ", strategy_name(dense));
}

double sparse_share(int64_t from, int64_t sparse_end, int64_t total) {
  if (total <= from) return 0.0;
  return std::clamp(static_cast<double>(sparse_end - from) / static_cast<double>(total - from), 0.0, 1.0);
}

ExchangeChoice choose_exchange(const ChoiceInput& in) {
  if (in.buckets.empty()) throw ConfigError("buckets", "the job has no gradients to exchange");
  if (in.nodes < 1 || in.local < 1)
    throw ConfigError("ranks", detail::concat(in.nodes, " nodes x ", in.local, " ranks"));
  if (!(in.sparse_share >= 0 && in.sparse_share <= 1))
    throw ConfigError("sparse_share", detail::concat(in.sparse_share, " is outside [0, 1]"));
  if (!(in.compute_s >= 0)) throw ConfigError("compute", detail::concat(in.compute_s, " s is not a time"));
  for (double d : in.densities)
    if (!(d > 0 && d <= 1)) throw ConfigError("densities", detail::concat(d, " is outside (0, 1]"));
  if (in.value_bytes != 4 && in.value_bytes != 2)
    throw ConfigError("value_bytes", detail::concat(in.value_bytes, " bytes a gradient value (expected 4 or 2)"));
  auto step = [&](Strategy s, double density) {
    return step_cost(in.buckets, s, density, in.nodes, in.local, in.machine, in.compute_s, 0, in.overlap, false,
                     in.value_bytes)
        .seconds;
  };
  ExchangeChoice out;
  // The dense strategies first: on a tie the earlier (the plain ring) stays chosen.
  ExchangeOption best_dense;
  for (Strategy s : {Strategy::kDense, Strategy::kTorus}) {
    ExchangeOption o;
    o.dense = s;
    o.dense_step = o.mean_step = step(s, 1);
    if (out.options.empty() || o.mean_step < best_dense.mean_step) best_dense = o;
    out.options.push_back(o);
  }
  out.chosen = best_dense;
  const bool exchanges = in.nodes * in.local > 1;
  std::optional<ExchangeOption> best_sparse;
  if (exchanges && in.sparse_share > 0) {
    for (Strategy s : {Strategy::kTopk, Strategy::kHitopk})
      for (double d : in.densities) {
        ExchangeOption o;
        o.hybrid = true;
        o.sparse = s;
        o.density = d;
        o.dense = best_dense.dense;
        o.sparse_step = step(s, d);
        o.dense_step = best_dense.dense_step;
        o.mean_step = in.sparse_share * o.sparse_step + (1 - in.sparse_share) * o.dense_step;
        out.options.push_back(o);
        if (!best_sparse || o.mean_step < best_sparse->mean_step) best_sparse = o;
      }
  }
  if (best_sparse && best_sparse->mean_step < (1 - in.sparse_margin) * best_dense.mean_step) out.chosen = *best_sparse;
  std::stable_sort(out.options.begin(), out.options.end(),
                   [](const ExchangeOption& a, const ExchangeOption& b) { return a.mean_step < b.mean_step; });

  // The reason: what was measured, and the chosen option's step against the best dense one's (or,
  // for a dense choice, against the fastest sparse phase).
  const Machine& mc = in.machine;
  std::string links = in.nodes > 1 && mc.wire_inter > 0
                          ? detail::concat("inter-node links ", in.measured ? "measured at " : "taken as ",
                                           rate_text(8 / mc.wire_inter))
                          : std::string("one node (no links between nodes)");
  if (!exchanges) return out.reason = "one rank: nothing to exchange", out;
  const ExchangeOption& c = out.chosen;
  if (c.hybrid) {
    out.reason = detail::concat(
        links, "; ", strategy_name(c.sparse), " at density ", c.density, " predicted ", seconds_text(c.sparse_step),
        " a step against ", strategy_name(best_dense.dense), " ", seconds_text(best_dense.dense_step), " (sparse for ",
        std::lround(in.sparse_share * 100), "% of the remaining steps, then ", strategy_name(c.dense), ")");
    return out;
  }
  const ExchangeOption* sparse = nullptr;
  for (const ExchangeOption& o : out.options)
    if (o.hybrid && (!sparse || o.sparse_step < sparse->sparse_step)) sparse = &o;
  if (sparse)
    out.reason = detail::concat(links, "; ", strategy_name(c.dense), " predicted ", seconds_text(c.dense_step),
                                " a step against ", strategy_name(sparse->sparse), " at density ", sparse->density, " ",
                                seconds_text(sparse->sparse_step), ": a sparse phase would not gain ",
                                std::lround(in.sparse_margin * 100), "% over the job");
  else
    out.reason =
        detail::concat(links, "; ", strategy_name(c.dense), " predicted ", seconds_text(c.dense_step), " a step; ",
                       in.sparse_allowed ? "no sparse phase is left (the dense epochs have begun)"
                                         : "the job allows no sparse phase (switchAtEpoch 0, auto's default with "
                                           "LARS momentum, or SGD momentum without momentumCorrection)");
  return out;
}

ExchangeChoice choose_for(const Calibration& c, int64_t from, int64_t sparse_end, int64_t total,
                          const std::vector<double>& densities, double sparse_margin) {
  ChoiceInput in;
  in.buckets = c.buckets;
  in.nodes = c.nodes, in.local = c.local;
  in.machine = c.machine;
  in.compute_s = c.compute_s;
  in.overlap = c.overlap;
  in.value_bytes = c.value_bytes;
  in.sparse_share = sparse_share(from, sparse_end, total);
  in.sparse_allowed = sparse_end > 0;
  in.densities = densities;
  in.sparse_margin = sparse_margin;
  return choose_exchange(in);
}

bool links_changed(const Calibration& before, const Calibration& now) {
  const double a = before.machine.wire_inter, b = now.machine.wire_inter;
  if (!(a > 0) || !(b > 0)) return (a > 0) != (b > 0);
  return b > 2 * a || b < a / 2;
}

std::string Calibration::summary() const {
  const Machine& m = machine;
  std::string s = nodes > 1 ? detail::concat("links between nodes ", rate_text(8 / std::max(m.wire_inter, 1e-15)),
                                             " (alpha ", std::lround(m.alpha_inter * 1e6), " us, CPU ",
                                             std::round(m.cpu_inter * 1e11) / 100, " ns a byte)")
                            : std::string("one node");
  if (local > 1)
    s += detail::concat("; inside a node ", std::round(1 / std::max(m.cpu_intra, 1e-15) / 1e7) / 100, " GB/s (alpha ",
                        std::lround(m.alpha_intra * 1e6), " us)");
  for (const auto& [d, sec] : m.selection)
    s += detail::concat("; top-k at density ", d, ": ", std::round(sec * 1e11) / 100, " ns a float");
  s += detail::concat("; a pass ", std::round(m.pass * 1e11) / 100, " ns a float, scatter-add ",
                      std::round(m.add * 1e10) / 10, " ns a pair");
  if (m.cores > 0) s += detail::concat("; all ", nodes * local, " ranks share ", m.cores, " cores");
  if (compute_s > 0) s += detail::concat("; compute ", std::lround(compute_s * 1e3), " ms a step");
  return s;
}

}  // namespace tessera::cost
