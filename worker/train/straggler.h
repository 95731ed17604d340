// Stragglers: the rank or node that holds a synchronous gang back. In a ring every rank waits for the
// slowest link and the slowest rank, so the step time alone cannot say who is slow; two measurements
// can:
// - links: the first rank of each node exchanges a probe of `bytes` with the first rank of every
//   other node, one pair at a time (a round-robin tournament), and times it. A node whose every link
//   is much slower than the links between the other nodes is the one whose network is slow. With
//   two nodes there is one link and no other to compare it with, so no node is named for it;
// - compute: each rank's forward, backward and update time, against the other ranks'.
// StragglerWatch runs both every two seconds of training or so, at steps every rank agrees on, and
// reports a rank only when two rounds in a row find it slow (and clears it after two rounds that do
// not), so a moment of noise on shared cores names no one. It also says when the links between nodes have
// changed (strategy auto chooses its exchange again).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "worker/comm/topology.h"

namespace tessera {

// The longest report message the controller takes (longer ones are cut).
inline constexpr size_t kSlowReasonBytes = 1024;

struct StragglerReport {
  std::vector<int> ranks;  // the slow ranks, ascending; empty: none
  std::string message;     // why, in a sentence per finding; empty: none
  bool operator==(const StragglerReport&) const = default;
};

// Pairs of the round-robin tournament among `members`: round r (0 <= r < rounds(members)) pairs each
// member with partner(members, r, i), or -1 when it sits the round out. Over all rounds every pair
// meets exactly once.
int tournament_rounds(int members);
int tournament_partner(int members, int round, int member);

// Times, in seconds, of one exchange of `bytes` each way between every two nodes (node_seconds[a * m
// + b], m nodes; the diagonal 0): the first rank of each node takes part, the fastest of `repeats`
// exchanges counts. Collective over the world: every rank calls it and gets the same matrix.
std::vector<double> probe_node_links(CommGroups& groups, size_t bytes, int repeats);
// The slowest link of such a matrix: its longest time (0 when empty).
double slowest_link(const std::vector<double>& node_seconds);

// The verdict from one round of measurements: node_seconds as probe_node_links gives it (empty: not
// measured), compute_seconds[r] rank r's compute per step. A node is slow when even its fastest link
// carries less than a third of the median of the links between other nodes, and takes over 1 ms for
// the probe (below that, scheduling noise); a rank when its compute takes over twice the median of
// the other ranks'.
StragglerReport judge_stragglers(const Topology& topology, const std::vector<double>& node_seconds, size_t bytes,
                                 const std::vector<double>& compute_seconds);

// The bytes of the watch's next link probe after a round measured `seconds_per_byte` on the slowest
// link: about 5 ms of it, in steps of 64 KiB, at least `least` and at most 16 MiB.
size_t next_probe_bytes(double seconds_per_byte, size_t least);

// Whether the slowest link between nodes changed: its probe now took more than twice, or less than
// half, the `baseline` time, and the longer of the two is over the noise floor (1 ms).
bool link_changed(double baseline_s, double now_s);

class StragglerWatch {
 public:
  // Measures about every `interval_s` seconds of training (the steps are agreed from the last
  // round's pace), less often where the probes would take over 5% of the training time (slow links),
  // but at least every 5 x interval_s.
  // A link's probe is at least `bytes`, and grows to take about 5 ms at the rate the last round
  // measured (at most 16 MiB): a probe far longer than scheduling noise and than the burst a link's
  // shaper lets through at once, so that a change of rate shows in its time.
  StragglerWatch(CommGroups& groups, double interval_s = 2.0, size_t bytes = size_t{256} << 10);

  // Every rank calls it after each step, with the step's compute (forward, backward, update) and
  // wall seconds. Collective on the steps of a round; returns true when the report changed.
  bool after_step(double compute_s, double step_s);
  const StragglerReport& report() const { return report_; }
  // Between two or more nodes: true once the slowest link has changed (link_changed) against the
  // second round's (the first sizes the probe) for two rounds in a row; from then on the rounds compare with the new
  // figure. Every rank gets the same answer on the same step (the probes are all-reduced).
  bool take_link_change();
  // The bytes the next round probes a link with.
  size_t link_probe_bytes() const { return link_bytes_; }

 private:
  CommGroups& groups_;
  double interval_s_;
  size_t bytes_;
  int64_t steps_ = 0, every_ = 4;          // steps since the last round; a round every `every_` steps
  double compute_sum_ = 0, wall_sum_ = 0;  // since the last round
  StragglerReport report_, pending_;       // confirmed; seen in the last round
  int agreeing_rounds_ = 0;                // rounds in a row that found `pending_`
  size_t link_bytes_;                      // the probe of the next round
  int link_rounds_ = 0;                    // rounds that probed the links
  double link_baseline_ = 0;               // the slowest link's seconds per byte the rounds compare with
  int link_changed_rounds_ = 0;            // rounds in a row that found it changed
  double link_now_ = 0;                    // the latest round's, seconds per byte
  bool link_change_ = false;
};

}  // namespace tessera
