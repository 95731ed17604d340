// ControlAgent: the worker's side of the controller's control plane (proto/tessera.proto). Before
// each step it reports its progress (and the gang's stragglers, if any) and learns the controller's
// decisions: for a hybrid job, the step at which every rank switches to the dense strategy. One per
// rank; used by one thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "worker/comm/store.h"
#include "worker/train/calibration.h"
#include "worker/train/straggler.h"

namespace tessera {

class ControlAgent {
 public:
  // target: "host:port" of the controller's rendezvous service.
  ControlAgent(const std::string& target, std::string job, std::string token, int rank, Millis timeout);
  ~ControlAgent();

  struct Report {
    int64_t step = 0;  // the step about to run
    int epoch = 0;
    int64_t steps_per_epoch = 0;
    double loss = 0, samples_per_second = 0;  // of the previous step
    StragglerReport stragglers;
    const GangCalibration* calibration = nullptr;  // communication.strategy auto: rank 0's, once
  };
  // communication.strategy auto: the controller's choice (proto/tessera.proto, HeartbeatResponse).
  struct ExchangePlan {
    int64_t from_step = -1;  // -1: none chosen yet
    std::string sparse;      // until the switch step; empty: none
    double density = 1;
    std::string dense;
    int64_t version = 0;
  };
  struct Answer {
    int64_t switch_step = -1;  // -1 while none is chosen
    ExchangePlan exchange;
  };
  // Reports progress; returns the controller's decisions. Throws CommError when the controller
  // refuses or cannot be reached within the timeout. Once `stop` is set (the rank was asked to stop:
  // its gang is suspended, deleted or moving, and the controller may no longer serve it), a
  // controller that does not answer within a second is not waited for: the answer has no decision,
  // and the gang agrees on its last step without it.
  Answer heartbeat(const Report& report, const std::atomic<bool>* stop = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
