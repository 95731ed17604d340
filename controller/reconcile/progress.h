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

struct Progress {
  int64_t step = -1;
  int64_t first_step = -1;  // rank 0's first reported step since the gang was added: where it resumed
  int epoch = 0;
  double loss = 0, samples_per_second = 0;
  int64_t switch_step = -1;  // the chosen switch step of a hybrid job; -1 until chosen
  std::vector<int> slow_ranks;  // the gang's stragglers as the ranks measured them; empty: none
  std::string slow_reason;      // why they are slow
  std::vector<RankExit> exits;  // failed ranks of the current round, in the order reported
};

}  // namespace tessera::reconcile
