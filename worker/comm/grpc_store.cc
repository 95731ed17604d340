#include "worker/comm/grpc_store.h"

#include <thread>

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "common/error.h"
#include "tessera.grpc.pb.h"
#include "worker/comm/grpc_channel.h"

namespace tessera {

struct GrpcStore::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Rendezvous::Stub> stub;
  v1::JobAuth auth;

  // A context that waits for the service up to `timeout` (plus slack for the server-side wait).
  std::unique_ptr<grpc::ClientContext> context(Millis timeout) const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_wait_for_ready(true);
    ctx->set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
    return ctx;
  }
};

namespace {
[[noreturn]] void fail(const char* what, const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    throw StoreTimeout(std::string(what) + ": " + s.error_message());
  throw CommError(std::string(what) + ": " + s.error_message());
}
}  // namespace

GrpcStore::GrpcStore(const std::string& target, std::string job, std::string token) : impl_(std::make_unique<Impl>()) {
  impl_->channel = controller_channel(target);
  impl_->stub = v1::Rendezvous::NewStub(impl_->channel);
  impl_->auth.set_job(std::move(job));
  impl_->auth.set_token(std::move(token));
}

GrpcStore::~GrpcStore() = default;

GrpcStore::Assignment GrpcStore::register_worker(int replica, int slot, const std::string& host, int metrics_port,
                                                 Millis timeout) {
  v1::RegisterRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_replica(replica);
  req.set_slot(slot);
  req.set_host(host);
  req.set_metrics_port(metrics_port);
  v1::RegisterResponse resp;
  // The controller may be starting, or rebuilding its jobs after a restart: wait for it.
  const auto deadline = std::chrono::system_clock::now() + timeout;
  grpc::Status s;
  for (;;) {
    auto ctx = impl_->context(Millis(0));
    ctx->set_deadline(deadline);
    s = impl_->stub->Register(ctx.get(), req, &resp);
    if (s.ok() || !controller_may_return(s) || std::chrono::system_clock::now() + Millis(200) >= deadline) break;
    std::this_thread::sleep_for(Millis(200));
  }
  if (!s.ok()) fail("register", s);
  return Assignment{resp.rank(), resp.world_size(), resp.local_rank(), resp.node(), resp.generation()};
}

bool GrpcStore::report_exit(int replica, int slot, int exit_code, const std::string& message, int64_t round,
                            Millis timeout) {
  v1::ReportExitRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_replica(replica);
  req.set_slot(slot);
  req.set_exit_code(exit_code);
  req.set_message(message.substr(0, 4096));
  req.set_round(round);
  v1::ReportExitResponse resp;
  auto ctx = impl_->context(Millis(0));
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return impl_->stub->ReportExit(ctx.get(), req, &resp).ok();
}

std::optional<int64_t> GrpcStore::await_round(int64_t known, Millis timeout) {
  v1::AwaitRoundRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_round(known);
  req.set_timeout_ms(known < 0 ? 0 : timeout.count());
  v1::AwaitRoundResponse resp;
  auto ctx = impl_->context(timeout);  // wait-for-ready up to the timeout, and the server's wait
  grpc::Status s = impl_->stub->AwaitRound(ctx.get(), req, &resp);
  if (!s.ok()) return std::nullopt;
  return resp.round();
}

void GrpcStore::set(const std::string& key, const std::string& value) {
  v1::SetRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_key(key);
  req.set_value(value);
  v1::SetResponse resp;
  auto ctx = impl_->context(Millis(30000));
  grpc::Status s = impl_->stub->Set(ctx.get(), req, &resp);
  if (!s.ok()) fail(("store set '" + key + "'").c_str(), s);
}

std::optional<std::string> GrpcStore::try_get(const std::string& key) {
  v1::GetRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_key(key);
  req.set_timeout_ms(0);
  v1::GetResponse resp;
  auto ctx = impl_->context(Millis(30000));
  grpc::Status s = impl_->stub->Get(ctx.get(), req, &resp);
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return std::nullopt;
  if (!s.ok()) fail(("store get '" + key + "'").c_str(), s);
  return resp.value();
}

void GrpcStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    v1::GetRequest req;
    *req.mutable_auth() = impl_->auth;
    req.set_key(key);
    req.set_timeout_ms(std::max<int64_t>(0, left.count()));
    v1::GetResponse resp;
    auto ctx = impl_->context(left);
    grpc::Status s = impl_->stub->Get(ctx.get(), req, &resp);
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        throw StoreTimeout(detail::concat("store: keys not written within ", timeout.count(), " ms: '", key, "'"));
      fail(("store wait '" + key + "'").c_str(), s);
    }
  }
}

void GrpcStore::barrier(const std::string& name, int rank, int count, Millis timeout) {
  v1::BarrierRequest req;
  *req.mutable_auth() = impl_->auth;
  req.set_name(name);
  req.set_rank(rank);
  req.set_count(count);
  req.set_timeout_ms(timeout.count());
  v1::BarrierResponse resp;
  auto ctx = impl_->context(timeout);
  grpc::Status s = impl_->stub->Barrier(ctx.get(), req, &resp);
  if (!s.ok()) fail("barrier", s);
}

}  // namespace tessera
