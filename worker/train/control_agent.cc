#include "worker/train/control_agent.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "common/error.h"
#include "tessera.grpc.pb.h"
#include "worker/comm/grpc_channel.h"

namespace tessera {

struct ControlAgent::Impl {
  std::unique_ptr<v1::Rendezvous::Stub> stub;
  v1::JobAuth auth;
  int rank;
  Millis timeout;
};

ControlAgent::ControlAgent(const std::string& target, std::string job, std::string token, int rank, Millis timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->stub = v1::Rendezvous::NewStub(controller_channel(target));
  impl_->auth.set_job(std::move(job));
  impl_->auth.set_token(std::move(token));
  impl_->rank = rank;
  impl_->timeout = timeout;
}

ControlAgent::~ControlAgent() = default;

ControlAgent::Answer ControlAgent::heartbeat(const Report& report, const std::atomic<bool>* stop) {
  v1::HeartbeatRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_rank(impl_->rank);
  req.set_step(report.step);
  req.set_epoch(report.epoch);
  req.set_steps_per_epoch(report.steps_per_epoch);
  req.set_loss(report.loss);
  req.set_samples_per_second(report.samples_per_second);
  for (int r : report.stragglers.ranks) req.add_slow_ranks(r);
  req.set_slow_reason(report.stragglers.message.substr(0, kSlowReasonBytes));
  if (const GangCalibration* c = report.calibration) {
    v1::ExchangeCalibration& p = *req.mutable_calibration();
    const cost::Machine& m = c->machine;
    p.set_nodes(c->nodes);
    p.set_ranks_per_node(c->local);
    p.set_alpha_inter_s(m.alpha_inter);
    p.set_wire_inter_s_per_byte(m.wire_inter);
    p.set_cpu_inter_s_per_byte(m.cpu_inter);
    p.set_alpha_intra_s(m.alpha_intra);
    p.set_cpu_intra_s_per_byte(m.cpu_intra);
    p.set_shared_cores(m.cores);
    for (const auto& [d, s] : m.selection) p.add_selection_density(d), p.add_selection_s_per_float(s);
    p.set_pass_s_per_float(m.pass);
    p.set_add_s_per_pair(m.add);
    p.set_compute_s(c->compute_s);
    for (const cost::Bucket& b : c->buckets) p.add_bucket_floats(b.floats), p.add_bucket_ready(b.ready);
    p.set_overlap(c->overlap);
    p.set_value_bytes(c->value_bytes);
  }
  v1::HeartbeatResponse resp;
  // A controller that restarts (or hands over to another) is waited for, up to the timeout: every
  // rank waits at the same step, so the gang goes on with the switch step it will be told. Each try
  // lasts at most a second, so that a stop request is seen while waiting.
  using Clock = std::chrono::system_clock;
  const auto deadline = Clock::now() + impl_->timeout;
  auto stopping = [&] { return stop && stop->load(); };
  grpc::Status s;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    const auto try_deadline = std::min(deadline, Clock::now() + Millis(1000));
    ctx.set_deadline(try_deadline);
    s = impl_->stub->Heartbeat(&ctx, req, &resp);
    const bool retry =
        controller_may_return(s) || (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && try_deadline < deadline);
    if (s.ok() || !retry || stopping() || Clock::now() + Millis(200) >= deadline) break;
    std::this_thread::sleep_for(Millis(200));
  }
  // A stopping gang needs no decision: it ends with this step, and a switch step chosen now lies at
  // least two steps ahead, so the ranks that were told run this step's exchange as those that were not.
  if (!s.ok() && stopping()) return {};
  if (!s.ok())
    throw CommError(
        detail::concat("heartbeat of rank ", impl_->rank, " at step ", report.step, ": ", s.error_message()));
  Answer a;
  a.switch_step = resp.switch_step();
  a.exchange = {resp.exchange_step(), resp.exchange_sparse(), resp.exchange_density(), resp.exchange_dense(),
                resp.exchange_version()};
  return a;
}

}  // namespace tessera
