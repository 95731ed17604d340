// Requests to the controller's rendezvous as any client on the network could send them, through its
// gRPC API: each is answered with OK or a status naming the problem, never a crash, a hang (waits
// are capped here at 5 ms) or unbounded memory (the store's limits). The fuzzer's bytes choose the
// call and every field, the token right or wrong.
#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "controller/placement/ring_planner.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "tessera.grpc.pb.h"

namespace {

struct Fixture {
  tessera::RendezvousService service{"127.0.0.1:0", limits()};
  std::unique_ptr<tessera::v1::Rendezvous::Stub> stub;
  Fixture() {
    std::vector<tessera::placement::NodeInfo> nodes(2);
    nodes[0].name = "n0";
    nodes[1].name = "n1";
    service.add_job("job", "token", tessera::placement::plan_ring({"n0", "n1"}, 2, nodes, {"kubernetes.io/hostname"}));
    stub = tessera::v1::Rendezvous::NewStub(grpc::CreateChannel(service.target(), grpc::InsecureChannelCredentials()));
  }
  static tessera::RendezvousLimits limits() {
    tessera::RendezvousLimits l;
    l.store_bytes = 1 << 20;  // small, so the fuzzer reaches the bound
    l.keys = 256;
    return l;
  }
};

void auth(FuzzedDataProvider& in, tessera::v1::JobAuth* a) {
  a->set_job(in.ConsumeBool() ? "job" : in.ConsumeRandomLengthString(64));
  a->set_token(in.ConsumeBool() ? "token" : in.ConsumeRandomLengthString(64));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();  // one service for the whole run, as in a controller
  FuzzedDataProvider in(data, size);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status s;
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: {
      tessera::v1::RegisterRequest r;
      auth(in, r.mutable_auth());
      r.set_replica(in.ConsumeIntegral<int32_t>());
      r.set_slot(in.ConsumeIntegral<int32_t>());
      r.set_host(in.ConsumeRandomLengthString(300));
      r.set_metrics_port(in.ConsumeIntegral<int32_t>());
      tessera::v1::RegisterResponse out;
      s = f->stub->Register(&ctx, r, &out);
      break;
    }
    case 1: {
      tessera::v1::SetRequest r;
      auth(in, r.mutable_auth());
      r.set_key(in.ConsumeRandomLengthString(2048));
      r.set_value(in.ConsumeRandomLengthString(1 << 16));
      tessera::v1::SetResponse out;
      s = f->stub->Set(&ctx, r, &out);
      break;
    }
    case 2: {
      tessera::v1::GetRequest r;
      auth(in, r.mutable_auth());
      r.set_key(in.ConsumeRandomLengthString(2048));
      r.set_timeout_ms(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 5)
                                        : in.ConsumeIntegralInRange<int64_t>(INT64_MIN, -1));
      tessera::v1::GetResponse out;
      s = f->stub->Get(&ctx, r, &out);
      break;
    }
    case 3: {
      tessera::v1::BarrierRequest r;
      auth(in, r.mutable_auth());
      r.set_name(in.ConsumeRandomLengthString(2048));
      r.set_rank(in.ConsumeIntegral<int32_t>());
      r.set_count(in.ConsumeIntegral<int32_t>());
      r.set_timeout_ms(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 5)
                                        : in.ConsumeIntegralInRange<int64_t>(INT64_MIN, -1));
      tessera::v1::BarrierResponse out;
      s = f->stub->Barrier(&ctx, r, &out);
      break;
    }
    default: {
      tessera::v1::HeartbeatRequest r;
      auth(in, r.mutable_auth());
      r.set_rank(in.ConsumeIntegral<int32_t>());
      r.set_step(in.ConsumeIntegral<int64_t>());
      r.set_epoch(in.ConsumeIntegral<int32_t>());
      r.set_steps_per_epoch(in.ConsumeIntegral<int64_t>());
      r.set_loss(in.ConsumeFloatingPoint<double>());
      r.set_samples_per_second(in.ConsumeFloatingPoint<double>());
      for (int n = in.ConsumeIntegralInRange(0, 3); n > 0; --n) r.add_slow_ranks(in.ConsumeIntegral<int32_t>());
      r.set_slow_reason(in.ConsumeRandomLengthString(2048));
      tessera::v1::HeartbeatResponse out;
      s = f->stub->Heartbeat(&ctx, r, &out);
    }
  }
  // Every refusal of the service says what was wrong. (INTERNAL is gRPC's own refusal of a request it
  // cannot parse, such as a string field that is not UTF-8, before any handler runs.)
  if (s.error_code() == grpc::StatusCode::INTERNAL) return 0;
  if (!s.ok() && s.error_message().empty()) __builtin_trap();
  if (s.error_code() == grpc::StatusCode::UNKNOWN) __builtin_trap();
  return 0;
}
