#include "controller/rendezvous/rendezvous_service.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "common/error.h"
#include "common/exchange_choice.h"
#include "tessera.grpc.pb.h"

namespace tessera {
namespace {

using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

struct JobState {
  std::string token;
  std::vector<placement::RankAssignment> plan;
  std::map<std::string, std::string> kv;
  size_t kv_bytes = 0;                                // keys and values
  std::map<int, int64_t> registrations;               // rank -> times registered
  std::map<int, std::string> metrics;                 // rank -> "host:port" of its /metrics
  std::map<std::string, std::set<int>> barriers;      // name -> ranks arrived
  std::map<std::string, int64_t> barrier_generation;  // completed rounds per name
  RendezvousService::JobPolicy policy;
  RendezvousService::Progress progress;  // of rank 0; the failed ranks' exits
  int64_t furthest_step = -1;
};

// The longest account of a failed rank a supervisor may report (a round keeps one per rank at most).
constexpr size_t kMaxExitMessageBytes = 4096;

// Equal strings, in time that depends on their lengths only (a token guessed byte by byte learns nothing).
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status invalid(const std::string& field, const std::string& why) {
  return Status(StatusCode::INVALID_ARGUMENT, "rendezvous: " + field + ": " + why);
}

// A store key or barrier name: not empty, bounded.
Status check_name(const std::string& field, const std::string& v, const RendezvousLimits& limits) {
  if (v.empty()) return invalid(field, "must not be empty");
  if (v.size() > limits.key_bytes)
    return invalid(field, detail::concat(v.size(), " bytes, above the limit of ", limits.key_bytes));
  return Status::OK;
}

Status check_timeout(int64_t ms, const RendezvousLimits& limits) {
  if (ms < 0 || ms > limits.timeout_ms)
    return invalid("timeout_ms", detail::concat(ms, " is outside [0, ", limits.timeout_ms, "]"));
  return Status::OK;
}

Status check_rank(const std::string& field, int64_t rank, size_t world) {
  if (rank < 0 || rank >= static_cast<int64_t>(world))
    return invalid(field, detail::concat(rank, " is not a rank of the job's ", world, " (0..", world - 1, ")"));
  return Status::OK;
}

// The host of a gRPC peer ("ipv4:10.0.0.5:41234", "ipv6:[::1]:41234", "ipv6:%5B::1%5D:41234").
std::string peer_host(std::string peer) {
  for (std::string::size_type at; (at = peer.find("%5B")) != std::string::npos;) peer.replace(at, 3, "[");
  for (std::string::size_type at; (at = peer.find("%5D")) != std::string::npos;) peer.replace(at, 3, "]");
  const auto scheme = peer.find(':'), port = peer.rfind(':');
  if (scheme == std::string::npos || port == scheme) return peer;
  return peer.substr(scheme + 1, port - scheme - 1);
}

// A calibration's figures: finite, not negative; the gang's shape; buckets and selections paired.
Status check_calibration(const v1::ExchangeCalibration& c, size_t world) {
  if (c.nodes() < 1 || c.ranks_per_node() < 1 || static_cast<size_t>(c.nodes()) * c.ranks_per_node() != world)
    return invalid("calibration.nodes",
                   detail::concat(c.nodes(), " nodes x ", c.ranks_per_node(), " ranks is not the job's ", world));
  const std::pair<const char*, double> figures[] = {{"alpha_inter_s", c.alpha_inter_s()},
                                                    {"wire_inter_s_per_byte", c.wire_inter_s_per_byte()},
                                                    {"cpu_inter_s_per_byte", c.cpu_inter_s_per_byte()},
                                                    {"alpha_intra_s", c.alpha_intra_s()},
                                                    {"cpu_intra_s_per_byte", c.cpu_intra_s_per_byte()},
                                                    {"pass_s_per_float", c.pass_s_per_float()},
                                                    {"add_s_per_pair", c.add_s_per_pair()},
                                                    {"compute_s", c.compute_s()}};
  for (const auto& [name, v] : figures)
    if (!std::isfinite(v) || v < 0)
      return invalid(std::string("calibration.") + name, "is not a finite number of at least 0");
  if (c.shared_cores() < 0) return invalid("calibration.shared_cores", "is negative");
  if (c.value_bytes() != 0 && c.value_bytes() != 2 && c.value_bytes() != 4)
    return invalid("calibration.value_bytes", detail::concat(c.value_bytes(), " is not 4 (fp32) or 2 (bf16)"));
  if (c.bucket_floats_size() == 0 || c.bucket_floats_size() != c.bucket_ready_size() || c.bucket_floats_size() > 100000)
    return invalid("calibration.bucket_floats",
                   detail::concat(c.bucket_floats_size(), " buckets with ", c.bucket_ready_size(),
                                  " readiness figures (1 to 100000 of each, as many)"));
  if (c.selection_density_size() != c.selection_s_per_float_size() || c.selection_density_size() > 64)
    return invalid("calibration.selection_density", "not paired with selection_s_per_float (at most 64)");
  for (int i = 0; i < c.bucket_floats_size(); ++i)
    if (!(c.bucket_floats(i) >= 0) || !(c.bucket_ready(i) >= 0 && c.bucket_ready(i) <= 1))
      return invalid("calibration.bucket_floats", detail::concat("bucket ", i, " is not a size and a share in [0, 1]"));
  for (int i = 0; i < c.selection_density_size(); ++i)
    if (!(c.selection_density(i) > 0 && c.selection_density(i) <= 1) || !std::isfinite(c.selection_s_per_float(i)) ||
        c.selection_s_per_float(i) < 0)
      return invalid("calibration.selection_density",
                     detail::concat("entry ", i, " is not a density in (0, 1] and a time"));
  return Status::OK;
}

// The calibration in the cost model's terms.
cost::Calibration calibration_of(const v1::ExchangeCalibration& c) {
  cost::Calibration out;
  out.nodes = c.nodes(), out.local = c.ranks_per_node();
  cost::Machine& mc = out.machine;
  mc.alpha_inter = c.alpha_inter_s(), mc.wire_inter = c.wire_inter_s_per_byte(),
  mc.cpu_inter = c.cpu_inter_s_per_byte();
  mc.alpha_intra = c.alpha_intra_s(), mc.cpu_intra = c.cpu_intra_s_per_byte();
  mc.cores = c.shared_cores();
  for (int i = 0; i < c.selection_density_size(); ++i)
    mc.selection.push_back({c.selection_density(i), c.selection_s_per_float(i)});
  mc.pass = c.pass_s_per_float(), mc.add = c.add_s_per_pair();
  mc.hidden = 1.0;
  out.compute_s = c.compute_s();
  for (int i = 0; i < c.bucket_floats_size(); ++i) out.buckets.push_back({c.bucket_floats(i), c.bucket_ready(i)});
  out.overlap = c.overlap();
  out.value_bytes = c.value_bytes() == 0 ? 4 : c.value_bytes();
  return out;
}

// The controller's choice of exchange for a job from rank 0's calibration: from step `from` on, with
// a sparse phase for at most the steps before the switch step (policy.switch_at_epoch, or the one
// already chosen) out of the job's remaining steps.
reconcile::ExchangeDecision decide_exchange(const v1::ExchangeCalibration& c, const RendezvousJobPolicy& policy,
                                            int64_t switch_step, int64_t steps_per_epoch, int64_t from,
                                            int64_t version) {
  const int64_t total = std::max<int64_t>(1, static_cast<int64_t>(policy.epochs) * steps_per_epoch);
  const int64_t sparse_end =
      switch_step >= 0 ? switch_step : static_cast<int64_t>(policy.switch_at_epoch) * steps_per_epoch;
  const cost::ExchangeChoice choice =
      cost::choose_for(calibration_of(c), from, sparse_end, total, policy.densities, policy.sparse_margin);
  reconcile::ExchangeDecision d;
  d.version = version;
  d.from_step = from;
  if (choice.chosen.hybrid) {
    d.sparse = cost::strategy_name(choice.chosen.sparse);
    d.density = choice.chosen.density;
  }
  d.dense = cost::strategy_name(choice.chosen.dense);
  d.reason = choice.reason;
  for (const cost::ExchangeOption& o : choice.options) d.predicted.push_back({o.name(), o.mean_step});
  d.inter_bits_per_second = c.nodes() > 1 && c.wire_inter_s_per_byte() > 0 ? 8 / c.wire_inter_s_per_byte() : 0;
  d.compute_s = c.compute_s();
  return d;
}

}  // namespace

struct RendezvousService::Impl final : public v1::Rendezvous::Service {
  explicit Impl(RendezvousLimits l) : limits(l) {}
  const RendezvousLimits limits;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, JobState> jobs;  // GUARDED_BY(mu)
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  RendezvousCounters counters;  // GUARDED_BY(mu)

  // The job named in auth, checking the token; REQUIRES: mu held.
  Status find(const v1::JobAuth& auth, JobState** out) {
    auto it = jobs.find(auth.job());
    if (it == jobs.end()) return Status(StatusCode::NOT_FOUND, "rendezvous: no job '" + auth.job() + "'");
    if (!same_secret(it->second.token, auth.token()))
      return Status(StatusCode::PERMISSION_DENIED, "rendezvous: wrong token for job '" + auth.job() + "'");
    *out = &it->second;
    return Status::OK;
  }

  Status Register(ServerContext* ctx, const v1::RegisterRequest* req, v1::RegisterResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    ++counters.registrations;
    JobState* job = nullptr;
    if (Status s = find(req->auth(), &job); !s.ok()) return s;
    if (req->metrics_port() < 0 || req->metrics_port() > 65535)
      return invalid("metrics_port", detail::concat(req->metrics_port(), " is not a port (0: none)"));
    if (req->host().size() > 253) return invalid("host", "longer than a host name can be");
    for (const auto& a : job->plan) {
      if (a.replica == req->replica() && a.slot == req->slot()) {
        if (req->metrics_port() > 0)
          job->metrics[a.rank] = peer_host(ctx->peer()) + ":" + std::to_string(req->metrics_port());
        resp->set_rank(a.rank);
        resp->set_world_size(static_cast<int>(job->plan.size()));
        resp->set_node(a.node);
        resp->set_local_rank(a.local_rank);
        resp->set_generation(++job->registrations[a.rank]);
        return Status::OK;
      }
    }
    return Status(StatusCode::INVALID_ARGUMENT,
                  detail::concat("rendezvous: job '", req->auth().job(), "' has no worker (replica ", req->replica(),
                                 ", slot ", req->slot(), ")"));
  }

  Status Set(ServerContext*, const v1::SetRequest* req, v1::SetResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      JobState* job = nullptr;
      if (Status s = find(req->auth(), &job); !s.ok()) return s;
      if (Status s = check_name("key", req->key(), limits); !s.ok()) return s;
      const auto& lim = limits;
      if (req->value().size() > lim.value_bytes)
        return invalid("value", detail::concat(req->value().size(), " bytes, above the limit of ", lim.value_bytes));
      auto it = job->kv.find(req->key());
      const size_t old = it == job->kv.end() ? 0 : req->key().size() + it->second.size();
      const size_t bytes = job->kv_bytes - old + req->key().size() + req->value().size();
      if (it == job->kv.end() && job->kv.size() >= lim.keys)
        return Status(StatusCode::RESOURCE_EXHAUSTED, detail::concat("rendezvous: job '", req->auth().job(), "' has ",
                                                                     lim.keys, " keys, the most a job may store"));
      if (bytes > lim.store_bytes)
        return Status(StatusCode::RESOURCE_EXHAUSTED,
                      detail::concat("rendezvous: job '", req->auth().job(), "' would store ", bytes,
                                     " bytes, above the limit of ", lim.store_bytes));
      job->kv[req->key()] = req->value();
      job->kv_bytes = bytes;
    }
    cv.notify_all();
    return Status::OK;
  }

  Status Get(ServerContext* ctx, const v1::GetRequest* req, v1::GetResponse* resp) override {
    if (Status s = check_name("key", req->key(), limits); !s.ok()) return s;
    if (Status s = check_timeout(req->timeout_ms(), limits); !s.ok()) return s;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req->timeout_ms()));
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      JobState* job = nullptr;
      if (Status s = find(req->auth(), &job); !s.ok()) return s;
      auto it = job->kv.find(req->key());
      if (it != job->kv.end()) {
        resp->set_found(true);
        resp->set_value(it->second);
        return Status::OK;
      }
      if (std::chrono::steady_clock::now() >= deadline || ctx->IsCancelled())
        return Status(StatusCode::DEADLINE_EXCEEDED, "rendezvous: key '" + req->key() + "' not written within " +
                                                         std::to_string(req->timeout_ms()) + " ms");
      cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
    }
  }

  Status Heartbeat(ServerContext*, const v1::HeartbeatRequest* req, v1::HeartbeatResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    ++counters.heartbeats;
    JobState* job = nullptr;
    if (Status s = find(req->auth(), &job); !s.ok()) return s;
    if (Status s = check_rank("rank", req->rank(), job->plan.size()); !s.ok()) return s;
    if (req->step() < 0) return invalid("step", detail::concat(req->step(), " is negative"));
    if (req->epoch() < 0) return invalid("epoch", detail::concat(req->epoch(), " is negative"));
    if (req->steps_per_epoch() < 0)
      return invalid("steps_per_epoch", detail::concat(req->steps_per_epoch(), " is negative"));
    if (!std::isfinite(req->loss())) return invalid("loss", "is not a finite number");
    if (!std::isfinite(req->samples_per_second()) || req->samples_per_second() < 0)
      return invalid("samples_per_second", "is not a finite number of at least 0");
    for (int r : req->slow_ranks())
      if (Status s = check_rank("slow_ranks", r, job->plan.size()); !s.ok()) return s;
    if (req->slow_reason().size() > limits.key_bytes)
      return invalid("slow_reason",
                     detail::concat(req->slow_reason().size(), " bytes, above the limit of ", limits.key_bytes));
    job->furthest_step = std::max(job->furthest_step, req->step());
    if (req->rank() == 0) {
      job->progress.slow_ranks.assign(req->slow_ranks().begin(), req->slow_ranks().end());
      job->progress.slow_reason = req->slow_reason();
      if (job->progress.first_step < 0) job->progress.first_step = req->step();
      job->progress.step = req->step();
      job->progress.epoch = req->epoch();
      job->progress.loss = req->loss();
      job->progress.samples_per_second = req->samples_per_second();
    }
    const int e = job->policy.switch_at_epoch;
    // auto: a switch step only for a choice with a sparse phase
    const bool sparse_phase = !job->policy.auto_exchange || !job->progress.exchange.sparse.empty();
    if (e >= 0 && sparse_phase && job->progress.switch_step < 0 && req->steps_per_epoch() > 0) {
      const int64_t planned = static_cast<int64_t>(e) * req->steps_per_epoch();
      if (job->furthest_step + 2 >= planned) job->progress.switch_step = std::max(planned, job->furthest_step + 2);
    }
    if (req->has_calibration() && job->policy.auto_exchange && req->rank() == 0 && req->steps_per_epoch() > 0) {
      if (Status s = check_calibration(req->calibration(), job->plan.size()); !s.ok()) return s;
      // Every rank hears of the choice before it reaches `from`, as of the switch step.
      const int64_t from = std::max(req->step(), job->furthest_step) + 2;
      job->progress.exchange = decide_exchange(req->calibration(), job->policy, job->progress.switch_step,
                                               req->steps_per_epoch(), from, job->progress.exchange.version + 1);
    }
    resp->set_switch_step(job->progress.switch_step);
    const auto& x = job->progress.exchange;
    resp->set_exchange_step(x.from_step);
    resp->set_exchange_sparse(x.sparse);
    resp->set_exchange_density(x.density);
    resp->set_exchange_dense(x.dense);
    resp->set_exchange_version(x.version);
    return Status::OK;
  }

  Status ReportExit(ServerContext*, const v1::ReportExitRequest* req, v1::ReportExitResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    JobState* job = nullptr;
    if (Status s = find(req->auth(), &job); !s.ok()) return s;
    bool known = false;
    for (const auto& a : job->plan) known = known || (a.replica == req->replica() && a.slot == req->slot());
    if (!known)
      return invalid("replica", detail::concat("job '", req->auth().job(), "' has no worker (replica ", req->replica(),
                                               ", slot ", req->slot(), ")"));
    if (req->exit_code() == 0) return invalid("exit_code", "0 is not a failure");
    if (req->message().size() > kMaxExitMessageBytes)
      return invalid("message",
                     detail::concat(req->message().size(), " bytes, above the limit of ", kMaxExitMessageBytes));
    if (req->round() != job->policy.round) return Status::OK;  // an earlier round's: that gang is gone
    auto& exits = job->progress.exits;
    for (const auto& e : exits)
      if (e.replica == req->replica() && e.slot == req->slot()) return Status::OK;
    if (exits.size() >= job->plan.size()) return Status::OK;
    exits.push_back({req->replica(), req->slot(), req->exit_code(), req->message(), std::chrono::system_clock::now()});
    return Status::OK;
  }

  Status AwaitRound(ServerContext* ctx, const v1::AwaitRoundRequest* req, v1::AwaitRoundResponse* resp) override {
    if (Status s = check_timeout(req->timeout_ms(), limits); !s.ok()) return s;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(req->timeout_ms());
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      JobState* job = nullptr;
      if (Status s = find(req->auth(), &job); !s.ok()) return s;
      if (job->policy.round > req->round() || std::chrono::steady_clock::now() >= deadline || ctx->IsCancelled()) {
        resp->set_round(job->policy.round);
        return Status::OK;
      }
      cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
    }
  }

  Status Barrier(ServerContext* ctx, const v1::BarrierRequest* req, v1::BarrierResponse*) override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req->timeout_ms()));
    std::unique_lock<std::mutex> lock(mu);
    JobState* job = nullptr;
    if (Status s = find(req->auth(), &job); !s.ok()) return s;
    if (Status s = check_name("name", req->name(), limits); !s.ok()) return s;
    if (Status s = check_timeout(req->timeout_ms(), limits); !s.ok()) return s;
    const auto world = job->plan.size();
    if (req->count() != static_cast<int64_t>(world))
      return invalid("count", detail::concat(req->count(), " ranks, but a barrier waits for all the job's ", world));
    if (Status s = check_rank("rank", req->rank(), world); !s.ok()) return s;
    const int64_t round = job->barrier_generation[req->name()];
    auto& arrived = job->barriers[req->name()];
    arrived.insert(req->rank());
    if (static_cast<int>(arrived.size()) >= req->count()) {
      arrived.clear();
      ++job->barrier_generation[req->name()];
      cv.notify_all();
      return Status::OK;
    }
    for (;;) {
      if (Status s = find(req->auth(), &job); !s.ok()) return s;
      if (job->barrier_generation[req->name()] > round) return Status::OK;
      if (std::chrono::steady_clock::now() >= deadline || ctx->IsCancelled()) {
        const int have = static_cast<int>(job->barriers[req->name()].size());
        return Status(StatusCode::DEADLINE_EXCEEDED,
                      detail::concat("rendezvous: barrier '", req->name(), "' has ", have, " of ", req->count(),
                                     " ranks after ", req->timeout_ms(), " ms"));
      }
      cv.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
    }
  }
};

std::string derive_job_token(const std::string& key, const std::string& job_uid) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (key.empty() || !HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                           reinterpret_cast<const unsigned char*>(job_uid.data()), job_uid.size(), mac, &len))
    throw Error("deriving a job token: HMAC-SHA256 failed (an empty key?)");
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned i = 0; i < 16; ++i) t += {hex[mac[i] >> 4], hex[mac[i] & 15]};
  return t;
}

std::string new_job_token() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 32; ++i) t += hex[rd() % 16];
  return t;
}

RendezvousService::RendezvousService(const std::string& address, RendezvousLimits limits)
    : impl_(std::make_unique<Impl>(limits)) {
  grpc::ServerBuilder builder;
  // One controller per port: a second one must fail to listen, not share the workers' connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(limits.message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(limits.message_bytes));
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &impl_->port);
  builder.RegisterService(impl_.get());
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0) throw Error("rendezvous: cannot listen on '" + address + "'");
}

RendezvousService::~RendezvousService() {
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

int RendezvousService::port() const { return impl_->port; }
std::string RendezvousService::target() const { return "127.0.0.1:" + std::to_string(impl_->port); }

void RendezvousService::add_job(const std::string& job, const std::string& token,
                                std::vector<placement::RankAssignment> plan, JobPolicy policy) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    JobState state;
    state.token = token;
    state.plan = std::move(plan);
    state.policy = policy;
    state.progress.switch_step = policy.switch_step;
    auto it = impl_->jobs.find(job);
    if (it != impl_->jobs.end()) {  // a restarted gang: keep restart counts and a switch already decided
      state.registrations = it->second.registrations;
      state.progress.switch_step = std::max(state.progress.switch_step, it->second.progress.switch_step);
      // the new gang measures and is chosen for again; the count of choices goes on
      state.progress.exchange.version = it->second.progress.exchange.version;
      state.progress.exchange.from_step = -1;
    }
    impl_->jobs[job] = std::move(state);
  }
  impl_->cv.notify_all();
}

RendezvousService::Progress RendezvousService::progress(const std::string& job) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->jobs.find(job);
  return it == impl_->jobs.end() ? Progress{} : it->second.progress;
}

bool RendezvousService::has_job(const std::string& job) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->jobs.count(job) > 0;
}

std::vector<MetricsTarget> RendezvousService::metrics_targets() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<MetricsTarget> out;
  for (const auto& [key, job] : impl_->jobs)
    for (const auto& [rank, address] : job.metrics) {
      MetricsTarget t{key, rank, "", address};
      for (const auto& a : job.plan)
        if (a.rank == rank) t.node = a.node;
      out.push_back(t);
    }
  return out;
}

RendezvousCounters RendezvousService::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counters;
}

void RendezvousService::remove_job(const std::string& job) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->jobs.erase(job);
  }
  impl_->cv.notify_all();
}

}  // namespace tessera
