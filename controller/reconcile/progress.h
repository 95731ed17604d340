// What a job's workers last reported through the rendezvous (rank 0's heartbeat): kept by the
// rendezvous service, read by the reconcile. A plain value with no dependencies, so both can use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::reconcile {

// A rank that ended with a failure, as its pod's supervisor reported it (the pod goes on: the gang
// can restart in place).
struct RankExit {
  int replica = 0, slot = 0, exit_code = 0;
  std::string message;
  std::chrono::system_clock::time_point time;  // when it was reported
};

// communication.strategy auto: the controller's choice of gradient exchange for the gang, from the
// links and compute it measured (common/exchange_choice.h).
struct ExchangeDecision {
  int64_t version = 0;     // choices made for the job so far; 0: none yet
  int64_t from_step = -1;  // the first step every rank exchanges this way
  std::string sparse;      // the sparse phase's strategy until the switch step; empty: none
  double density = 1;
  std::string dense;                                      // the dense strategy (after the switch step, or throughout)
  std::string reason;                                     // one sentence: the measured links and the predicted steps
  std::vector<std::pair<std::string, double>> predicted;  // every option and its mean step, seconds, fastest first
  double inter_bits_per_second = 0;                       // the slowest link between nodes as measured; 0: one node
  double compute_s = 0;                                   // a step's compute as measured
};

struct Progress {
  int64_t step = -1;
  int64_t first_step = -1;  // rank 0's first reported step since the gang was added: where it resumed
  int epoch = 0;
  double loss = 0, samples_per_second = 0;
  int64_t switch_step = -1;     // the chosen switch step of a hybrid job; -1 until chosen
  std::vector<int> slow_ranks;  // the gang's stragglers as the ranks measured them; empty: none
  std::string slow_reason;      // why they are slow
  std::vector<RankExit> exits;  // failed ranks of the current round, in the order reported
  ExchangeDecision exchange;
};

}  // namespace tessera::reconcile
