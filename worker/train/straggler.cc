#include "worker/train/straggler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "common/error.h"

namespace tessera {
namespace {

constexpr uint32_t kProbeTag = 29;  // point-to-point tag of the link probe (the halo exchange uses 11)
// A link that carries the probe faster than this is not judged slow: at that pace a thread that
// waited for a core looks like a slow link (virtual nodes on one machine, shared cores).
constexpr double kNoiseSeconds = 1e-3;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string mb_per_s(double bytes, double seconds) {
  const double v = seconds > 0 ? bytes / seconds / 1e6 : 0;
  return detail::concat(std::round(v * 10) / 10, " MB/s");
}

std::string ms(double seconds) { return detail::concat(std::lround(seconds * 1e3), " ms"); }

std::string ranks_text(const Topology& t, int node) {
  const auto& r = t.node_ranks(node);
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}

}  // namespace

int tournament_rounds(int members) { return members < 2 ? 0 : members + members % 2 - 1; }

int tournament_partner(int members, int round, int member) {
  // The circle method: the last of an even number of seats stays put, the others turn one seat a
  // round; a seat past the members (an odd count) is a bye.
  const int seats = members + members % 2, turning = seats - 1;
  int partner;
  if (member == seats - 1) partner = round;
  else if (member == round) partner = seats - 1;
  else partner = ((2 * round - member) % turning + turning) % turning;
  return partner < members ? partner : -1;
}

std::vector<double> probe_node_links(CommGroups& groups, size_t bytes, int repeats) {
  const Topology& t = groups.topology;
  const int m = t.num_nodes();
  std::vector<double> seconds(static_cast<size_t>(m) * m, 0.0);
  if (m < 2) return seconds;
  if (t.placement(groups.rank).local_rank == 0) {
    Communicator& c = *groups.inter;  // the first rank of every node, in node order
    const int me = c.rank();
    std::vector<char> out(bytes, 1), in(bytes);
    char token = 0, got = 0;
    for (int round = 0; round < tournament_rounds(m); ++round) {
      const int peer = tournament_partner(m, round, me);
      if (peer < 0) continue;
      double best = INFINITY;
      for (int k = 0; k < repeats; ++k) {
        c.sendrecv(&token, 1, peer, &got, 1, peer, kProbeTag, Millis(0));  // both ends ready
        const auto t0 = std::chrono::steady_clock::now();
        c.sendrecv(out.data(), bytes, peer, in.data(), bytes, peer, kProbeTag, Millis(0));
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      seconds[static_cast<size_t>(me) * m + peer] = best;
    }
  }
  groups.world->allreduce(std::span<double>(seconds));
  // Each end timed its own receive: the link took the longer of the two.
  for (int a = 0; a < m; ++a)
    for (int b = a + 1; b < m; ++b)
      seconds[a * m + b] = seconds[b * m + a] = std::max(seconds[a * m + b], seconds[b * m + a]);
  return seconds;
}

double slowest_link(const std::vector<double>& node_seconds) {
  return node_seconds.empty() ? 0.0 : *std::max_element(node_seconds.begin(), node_seconds.end());
}

StragglerReport judge_stragglers(const Topology& t, const std::vector<double>& node_seconds, size_t bytes,
                                 const std::vector<double>& compute_seconds) {
  StragglerReport out;
  std::set<int> ranks;
  std::vector<std::string> why;
  const int m = t.num_nodes();
  if (m >= 3 && node_seconds.size() == static_cast<size_t>(m) * m) {
    for (int x = 0; x < m; ++x) {
      double fastest = INFINITY;  // x's fastest link, and the links between the other nodes
      std::vector<double> others;
      for (int a = 0; a < m; ++a)
        for (int b = a + 1; b < m; ++b) {
          const double s = node_seconds[a * m + b];
          if (a == x || b == x) fastest = std::min(fastest, s);
          else others.push_back(s);
        }
      const double typical = median(others);
      if (typical > 0 && fastest > 3 * typical && fastest > kNoiseSeconds) {
        for (int r : t.node_ranks(x)) ranks.insert(r);
        why.push_back(detail::concat("node ", t.node_name(x), " (", ranks_text(t, x),
                                     ") has a slow network: its links to the other nodes carry at most ",
                                     mb_per_s(bytes, fastest), ", the links between the other nodes ",
                                     mb_per_s(bytes, typical)));
      }
    }
  }
  const int world = static_cast<int>(compute_seconds.size());
  if (world >= 2) {
    for (int r = 0; r < world; ++r) {
      std::vector<double> others(compute_seconds);
      others.erase(others.begin() + r);
      const double typical = median(others);
      if (typical > 0 && compute_seconds[r] > 2 * typical) {
        ranks.insert(r);
        why.push_back(detail::concat("rank ", r, " (node ", t.placement(r).node, ") computes slowly: ",
                                     ms(compute_seconds[r]), " per step, the other ranks ", ms(typical)));
      }
    }
  }
  out.ranks.assign(ranks.begin(), ranks.end());
  for (size_t i = 0; i < why.size(); ++i) out.message += (i ? "; " : "") + why[i];
  return out;
}

size_t next_probe_bytes(double seconds_per_byte, size_t least) {
  constexpr double kProbeSeconds = 5e-3;
  constexpr size_t kMaxProbe = size_t{16} << 20, kGrain = size_t{64} << 10;
  const double fit = std::min(kProbeSeconds / std::max(seconds_per_byte, 1e-15), static_cast<double>(kMaxProbe));
  return std::clamp(static_cast<size_t>(fit) / kGrain * kGrain, least, std::max(least, kMaxProbe));
}

bool link_changed(double baseline_s, double now_s) {
  if (!(baseline_s > 0) || !(now_s > 0) || std::max(baseline_s, now_s) <= kNoiseSeconds) return false;
  return now_s > 2 * baseline_s || now_s < baseline_s / 2;
}

bool StragglerWatch::take_link_change() {
  if (!link_change_) return false;
  link_change_ = false;
  link_baseline_ = link_now_;
  link_changed_rounds_ = 0;
  return true;
}

StragglerWatch::StragglerWatch(CommGroups& groups, double interval_s, size_t bytes)
    : groups_(groups), interval_s_(interval_s), bytes_(bytes), link_bytes_(bytes) {}

bool StragglerWatch::after_step(double compute_s, double step_s) {
  compute_sum_ += compute_s;
  wall_sum_ += step_s;
  if (++steps_ < every_) return false;
  const int world = groups_.topology.world_size();
  // Links are judged against other links, so a gang of two nodes has none to judge; its one link is
  // still watched for a change.
  const int nodes = groups_.topology.num_nodes();
  const size_t probe_bytes = link_bytes_;
  const std::vector<double> probed = nodes >= 2 ? probe_node_links(groups_, probe_bytes, 2) : std::vector<double>{};
  const std::vector<double> links = nodes >= 3 ? probed : std::vector<double>{};
  double probe_s = 0;  // the slowest link's probe
  if (!probed.empty()) {
    probe_s = slowest_link(probed);
    link_now_ = probe_s / static_cast<double>(probe_bytes);
    // The first round's probe only sizes the next one (a short probe can pass in the shaper's burst);
    // the second sets the baseline; from then on, this probe's time against what it would have taken
    // at the baseline's rate.
    ++link_rounds_;
    if (link_rounds_ == 2) link_baseline_ = link_now_;
    const bool changed = link_rounds_ > 2 && link_changed(link_baseline_ * static_cast<double>(probe_bytes), probe_s);
    link_changed_rounds_ = changed ? link_changed_rounds_ + 1 : 0;
    if (link_changed_rounds_ >= 2) link_change_ = true;
    // the next probe: about 5 ms at this rate (the matrix is all-reduced: the same on every rank)
    link_bytes_ = next_probe_bytes(link_now_, bytes_);
  }
  // [each rank's compute per step..., the wall time of the round's steps, summed over ranks]
  std::vector<double> v(world + 1, 0.0);
  v[groups_.rank] = compute_sum_ / static_cast<double>(steps_);
  v[world] = wall_sum_;
  groups_.world->allreduce(std::span<double>(v));
  // The next round after about interval_s of training, from this round's pace, the same on every
  // rank; later where the probes (two tries of each tournament round) would take over 5% of it, but
  // never over 5 x interval_s (a link slowed that much costs the exchange far more than its probes).
  const double step_wall = v[world] / world / static_cast<double>(steps_);
  const double probes_s = 2.0 * probe_s * tournament_rounds(nodes);
  const double next_s = std::clamp(20 * probes_s, interval_s_, 5 * interval_s_);
  every_ = std::clamp<int64_t>(static_cast<int64_t>(next_s / std::max(step_wall, 1e-6)), 1, 10000);
  steps_ = 0;
  compute_sum_ = wall_sum_ = 0;
  v.pop_back();
  StragglerReport seen = judge_stragglers(groups_.topology, links, probe_bytes, v);
  agreeing_rounds_ = seen.ranks == pending_.ranks ? agreeing_rounds_ + 1 : 1;
  pending_ = std::move(seen);
  if (agreeing_rounds_ < 2) return false;
  // Confirmed: a change of who is slow is news; for the same ranks, only the figures are refreshed.
  const bool changed = pending_.ranks != report_.ranks;
  report_ = pending_;
  return changed;
}

}  // namespace tessera
