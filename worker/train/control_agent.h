// ControlAgent: the worker's side of the controller's control plane (proto/tessera.proto). Before
// each step it reports its progress and learns the controller's decisions: for a hybrid job, the
// step at which every rank switches to the dense strategy. One per rank; used by one thread.
#pragma once

#include <memory>
#include <string>

#include "worker/comm/store.h"

namespace tessera {

class ControlAgent {
 public:
  // target: "host:port" of the controller's rendezvous service.
  ControlAgent(const std::string& target, std::string job, std::string token, int rank, Millis timeout);
  ~ControlAgent();

  // Reports the step about to run (with the previous step's loss and throughput); returns the switch
  // step, or -1 while none is chosen. Throws CommError when the controller refuses or cannot be
  // reached within the timeout.
  int64_t heartbeat(int64_t step, int epoch, int64_t steps_per_epoch, double loss, double samples_per_second);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
