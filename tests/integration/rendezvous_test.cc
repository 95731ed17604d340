// The controller's rendezvous service with workers' GrpcStore clients: token checks, rank
// assignment from the ring plan (the same rank after a restart), Gloo bootstrapped through it, a
// missing worker timing out with a message naming it, barriers.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <thread>

#include "common/error.h"
#include "controller/placement/ring_planner.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "tessera.grpc.pb.h"
#include "testing/rank_threads.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/grpc_store.h"

namespace tessera {
namespace {

using testing::message;
using testing::rethrow_first;
using testing::run_ranks;

// 2 pods of 2 ranks on nodes "n1" and "n0" (topology order puts n0 first).
std::vector<placement::RankAssignment> two_by_two() {
  std::vector<placement::NodeInfo> nodes(2);
  nodes[0].name = "n1";
  nodes[1].name = "n0";
  return placement::plan_ring({"n1", "n0"}, 2, nodes, {"kubernetes.io/hostname"});
}

TEST(RendezvousTest, WrongTokenAndUnknownWorkerAreRefused) {
  RendezvousService service;
  service.add_job("job", "secret", two_by_two());
  GrpcStore bad(service.target(), "job", "guess");
  try {
    bad.register_worker(0, 0, "h", 0, Millis(5000));
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong token for job 'job'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(bad.set("k", "v"), CommError);
  GrpcStore good(service.target(), "job", "secret");
  EXPECT_THROW(good.register_worker(5, 0, "h", 0, Millis(5000)), CommError);
  GrpcStore other(service.target(), "nojob", "secret");
  EXPECT_THROW(other.register_worker(0, 0, "h", 0, Millis(5000)), CommError);
}

TEST(RendezvousTest, RestartedWorkerGetsItsRankBack) {
  RendezvousService service;
  service.add_job("job", "t", two_by_two());
  GrpcStore s(service.target(), "job", "t");
  auto first = s.register_worker(0, 1, "h", 0, Millis(5000));
  // Pod 0 runs on n1, which comes second in the ring: ranks 2 and 3.
  EXPECT_EQ(first.rank, 3);
  EXPECT_EQ(first.node, "n1");
  EXPECT_EQ(first.local_rank, 1);
  EXPECT_EQ(first.world_size, 4);
  EXPECT_EQ(first.generation, 1);
  auto again = s.register_worker(0, 1, "h", 0, Millis(5000));
  EXPECT_EQ(again.rank, 3);
  EXPECT_EQ(again.generation, 2);
}

// A restart in place: a pod's supervisor reports its failed rank for the gang's round; the
// controller serves the next round; supervisors waiting for it hear of it at once.
TEST(RendezvousTest, SupervisorsReportFailedRanksAndFollowTheRounds) {
  RendezvousService service;
  service.add_job("job", "t", two_by_two());
  GrpcStore s(service.target(), "job", "t");
  EXPECT_EQ(s.await_round(-1, Millis(5000)), 0);
  EXPECT_TRUE(s.report_exit(1, 0, 137, "killed", 0, Millis(5000)));
  EXPECT_TRUE(s.report_exit(1, 0, 1, "again", 0, Millis(5000)));      // one per rank: the first kept
  EXPECT_TRUE(s.report_exit(0, 1, 1, "peer gone", 5, Millis(5000)));  // another round's: ignored
  const auto exits = service.progress("job").exits;
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].replica, 1);
  EXPECT_EQ(exits[0].exit_code, 137);
  EXPECT_EQ(exits[0].message, "killed");
  EXPECT_FALSE(s.report_exit(7, 0, 1, "", 0, Millis(5000)));  // no such worker: INVALID_ARGUMENT
  EXPECT_FALSE(s.report_exit(1, 1, 0, "", 0, Millis(5000)));  // 0 is not a failure
  // No new round within the wait: the same one.
  EXPECT_EQ(s.await_round(0, Millis(100)), 0);
  std::thread next([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    RendezvousJobPolicy policy;
    policy.round = 1;
    service.add_job("job", "t", two_by_two(), policy);
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s.await_round(0, Millis(10000)), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  next.join();
  EXPECT_TRUE(service.progress("job").exits.empty()) << "the new round starts with no failure";
  GrpcStore wrong(service.target(), "job", "guess");
  EXPECT_FALSE(wrong.await_round(-1, Millis(1000)).has_value());
}

TEST(RendezvousTest, RegisteredRanksAreListedForPrometheus) {
  RendezvousService service;
  service.add_job("ns/job", "t", two_by_two());
  GrpcStore s(service.target(), "ns/job", "t");
  s.register_worker(0, 1, "h", 9401, Millis(5000));
  s.register_worker(1, 0, "h", 0, Millis(5000));  // serves no metrics: not listed
  const auto targets = service.metrics_targets();
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].job, "ns/job");
  EXPECT_EQ(targets[0].rank, 3);
  EXPECT_EQ(targets[0].node, "n1");
  EXPECT_EQ(targets[0].address, "127.0.0.1:9401");  // the address the worker connected from
  EXPECT_EQ(service.counters().registrations, 2);
  // A restarted gang registers again: the old endpoints are gone.
  service.add_job("ns/job", "t2", two_by_two());
  EXPECT_TRUE(service.metrics_targets().empty());
  service.remove_job("ns/job");
  EXPECT_TRUE(service.metrics_targets().empty());
}

TEST(RendezvousTest, WorkersBootstrapGlooThroughTheService) {
  RendezvousService service;
  service.add_job("job", "t", two_by_two());
  std::vector<float> results(4, 0.0f);
  rethrow_first(run_ranks(4, [&](int i) {
    GrpcStore store(service.target(), "job", "t");
    auto a = store.register_worker(i / 2, i % 2, "h", 0, Millis(5000));
    Topology topo = Topology::discover(store, a.rank, a.world_size, {a.node, a.local_rank}, Millis(10000));
    CommGroups g = connect_groups(store, std::move(topo), a.rank, gloo_factory(Millis(10000)));
    EXPECT_EQ(g.intra->size(), 2);
    std::vector<float> x = {static_cast<float>(a.rank + 1)};
    g.world->allreduce(std::span<float>(x));
    results[i] = x[0];
    store.barrier("done", a.rank, a.world_size, Millis(10000));
  }));
  for (float v : results) EXPECT_EQ(v, 10.0f);
}

TEST(RendezvousTest, MissingWorkerTimesOutNamingIt) {
  RendezvousService service;
  service.add_job("job", "t", two_by_two());
  auto errors = run_ranks(3, [&](int i) {
    GrpcStore store(service.target(), "job", "t");
    auto a = store.register_worker(i / 2, i % 2, "h", 0, Millis(5000));
    GlooCommunicator::Options o;
    o.timeout = Millis(1000);
    GlooCommunicator::connect(store, a.rank, {0, 1, 2, 3}, o);
  });
  // Pod 1 slot 1 (on n0: rank 1) never started.
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(message(errors[i]).find("rank 1 (global 1) did not join within 1000 ms"), std::string::npos)
        << message(errors[i]);
  GrpcStore store(service.target(), "job", "t");
  try {
    store.barrier("never", 0, 4, Millis(200));
    FAIL();
  } catch (const StoreTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("barrier 'never' has 1 of 4 ranks"), std::string::npos) << e.what();
  }
}

// A job's token on a cluster: HMAC-SHA256 of its uid under the controller's key, 128 bits in hex
// (RFC 4231's second case for the bytes), the same every time, another for another uid or key.
TEST(RendezvousTest, JobTokensAreDerivedFromTheUidUnderTheKey) {
  EXPECT_EQ(derive_job_token("Jefe", "what do ya want for nothing?"), "5bdcc146bf60754e6a042426089575c7");
  const std::string key(48, 'k');
  EXPECT_EQ(derive_job_token(key, "uid-1"), derive_job_token(key, "uid-1"));
  EXPECT_NE(derive_job_token(key, "uid-1"), derive_job_token(key, "uid-2"));
  EXPECT_NE(derive_job_token(key, "uid-1"), derive_job_token(std::string(48, 'j'), "uid-1"));
  EXPECT_THROW(derive_job_token("", "uid-1"), Error);
}

// Requests as a confused or hostile client could send them, on the raw gRPC API: every field is
// checked and named, the store is bounded, and messages above the limit never reach the handlers.
// communication.strategy auto: rank 0's calibration in a heartbeat; the service chooses with the
// cost model, answers every rank with the same choice from a step two ahead, and refuses bad figures
// by name.
TEST(RendezvousTest, TheExchangeIsChosenFromRankZerosCalibration) {
  RendezvousService service;
  RendezvousJobPolicy policy;
  policy.auto_exchange = true;
  policy.switch_at_epoch = 2;  // of 4: a sparse phase may take the first half
  policy.epochs = 4;
  policy.densities = {0.01};
  service.add_job("job", "t", two_by_two(), policy);
  auto stub = v1::Rendezvous::NewStub(grpc::CreateChannel(service.target(), grpc::InsecureChannelCredentials()));
  // links of `bits` a second between 2 nodes of 2 GPUs (NVLink, GPU kernels: nothing shared)
  auto calibration = [](double bits) {
    v1::ExchangeCalibration c;
    c.set_nodes(2);
    c.set_ranks_per_node(2);
    c.set_alpha_inter_s(10e-6);
    c.set_wire_inter_s_per_byte(8 / bits);
    c.set_alpha_intra_s(5e-6);
    c.set_cpu_intra_s_per_byte(1 / 130e9);
    c.add_selection_density(0.01);
    c.add_selection_s_per_float(0.02e-9);
    c.set_pass_s_per_float(0.005e-9);
    c.set_add_s_per_pair(0.02e-9);
    c.set_compute_s(0.1);
    for (double f : {6.5e6, 6.5e6, 6.5e6, 6.1e6}) c.add_bucket_floats(f);
    for (double r : {0.1, 0.3, 0.6, 1.0}) c.add_bucket_ready(r);
    c.set_overlap(true);
    return c;
  };
  auto heartbeat = [&](int rank, int64_t step, const v1::ExchangeCalibration* c, v1::HeartbeatResponse* resp) {
    v1::HeartbeatRequest req;
    req.mutable_auth()->set_job("job");
    req.mutable_auth()->set_token("t");
    req.set_rank(rank);
    req.set_step(step);
    req.set_steps_per_epoch(100);
    if (c) *req.mutable_calibration() = *c;
    grpc::ClientContext ctx;
    return stub->Heartbeat(&ctx, req, resp);
  };
  v1::HeartbeatResponse r;
  ASSERT_TRUE(heartbeat(1, 3, nullptr, &r).ok());
  EXPECT_EQ(r.exchange_step(), -1);  // nothing chosen before the calibration
  EXPECT_EQ(r.exchange_version(), 0);
  const v1::ExchangeCalibration slow = calibration(100e6);
  ASSERT_TRUE(heartbeat(0, 3, &slow, &r).ok());
  EXPECT_EQ(r.exchange_step(), 5);  // two steps past the furthest rank
  EXPECT_EQ(r.exchange_sparse(), "hitopk");
  EXPECT_DOUBLE_EQ(r.exchange_density(), 0.01);
  EXPECT_EQ(r.exchange_dense(), "torus");
  EXPECT_EQ(r.exchange_version(), 1);
  v1::HeartbeatResponse other;
  ASSERT_TRUE(heartbeat(3, 4, nullptr, &other).ok());  // every rank hears the same choice
  EXPECT_EQ(other.exchange_step(), 5);
  EXPECT_EQ(other.exchange_sparse(), "hitopk");
  const auto x = service.progress("job").exchange;
  EXPECT_EQ(x.version, 1);
  EXPECT_NE(x.reason.find("inter-node links measured at 100 Mbit/s; hitopk at density 0.01 predicted"),
            std::string::npos)
      << x.reason;
  EXPECT_EQ(x.predicted.size(), 4u);  // dense, torus, and each sparse strategy at the one density
  EXPECT_DOUBLE_EQ(x.inter_bits_per_second, 100e6);
  // the sparse phase ends at the policy's epoch, every rank told before it
  ASSERT_TRUE(heartbeat(0, 198, nullptr, &r).ok());
  EXPECT_EQ(r.switch_step(), 200);

  // A new gang (a restart) is chosen for afresh; fast links and a long step make it dense.
  service.add_job("job", "t", two_by_two(), policy);
  ASSERT_TRUE(heartbeat(1, 250, nullptr, &r).ok());
  EXPECT_EQ(r.exchange_step(), -1);
  v1::ExchangeCalibration fast = calibration(400e9);
  fast.set_compute_s(2.0);
  ASSERT_TRUE(heartbeat(0, 250, &fast, &r).ok());
  EXPECT_EQ(r.exchange_version(), 2);
  EXPECT_EQ(r.exchange_step(), 252);
  EXPECT_EQ(r.exchange_sparse(), "");  // past the switch step: no sparse phase is left
  EXPECT_NE(service.progress("job").exchange.reason.find("no sparse phase is left"), std::string::npos)
      << service.progress("job").exchange.reason;

  auto refused = [&](const std::function<void(v1::ExchangeCalibration&)>& edit, const std::string& text) {
    v1::ExchangeCalibration c = calibration(1e9);
    edit(c);
    const grpc::Status s = heartbeat(0, 260, &c, &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << text;
    EXPECT_NE(s.error_message().find(text), std::string::npos) << s.error_message();
  };
  refused([](auto& c) { c.set_nodes(3); }, "calibration.nodes: 3 nodes x 2 ranks is not the job's 4");
  refused([](auto& c) { c.set_compute_s(std::nan("")); }, "calibration.compute_s: is not a finite number");
  refused([](auto& c) { c.set_wire_inter_s_per_byte(-1); }, "calibration.wire_inter_s_per_byte");
  refused([](auto& c) { c.clear_bucket_ready(); }, "calibration.bucket_floats: 4 buckets with 0 readiness figures");
  refused([](auto& c) { c.set_selection_density(0, 2); }, "calibration.selection_density: entry 0");
}

TEST(RendezvousTest, EveryFieldIsCheckedAndTheStoreIsBounded) {
  RendezvousLimits limits;
  limits.keys = 8;
  limits.store_bytes = 4096;
  limits.value_bytes = 1024;
  limits.key_bytes = 64;
  limits.message_bytes = 64 << 10;
  RendezvousService service("127.0.0.1:0", limits);
  service.add_job("job", "t", two_by_two());
  auto channel = grpc::CreateChannel(service.target(), grpc::InsecureChannelCredentials());
  auto stub = v1::Rendezvous::NewStub(channel);
  v1::JobAuth auth;
  auth.set_job("job");
  auth.set_token("t");
  auto expect = [](const grpc::Status& s, grpc::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(text), std::string::npos) << s.error_message();
  };
  auto heartbeat = [&](auto&& edit) {
    v1::HeartbeatRequest req;
    *req.mutable_auth() = auth;
    req.set_rank(1);
    req.set_step(10);
    req.set_steps_per_epoch(5);
    edit(req);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    return stub->Heartbeat(&ctx, req, &resp);
  };
  EXPECT_TRUE(heartbeat([](auto&) {}).ok());
  expect(heartbeat([](auto& r) { r.set_rank(99); }), grpc::StatusCode::INVALID_ARGUMENT,
         "rendezvous: rank: 99 is not a rank of the job's 4 (0..3)");
  expect(heartbeat([](auto& r) { r.set_step(-3); }), grpc::StatusCode::INVALID_ARGUMENT, "step: -3 is negative");
  expect(heartbeat([](auto& r) { r.set_epoch(-1); }), grpc::StatusCode::INVALID_ARGUMENT, "epoch: -1 is negative");
  expect(heartbeat([](auto& r) { r.set_loss(std::nan("")); }), grpc::StatusCode::INVALID_ARGUMENT,
         "loss: is not a finite number");
  expect(heartbeat([](auto& r) { r.set_samples_per_second(-1); }), grpc::StatusCode::INVALID_ARGUMENT,
         "samples_per_second");
  expect(heartbeat([](auto& r) { r.mutable_auth()->set_token("T"); }), grpc::StatusCode::PERMISSION_DENIED,
         "wrong token");
  expect(heartbeat([](auto& r) { r.add_slow_ranks(4); }), grpc::StatusCode::INVALID_ARGUMENT,
         "slow_ranks: 4 is not a rank of the job's 4 (0..3)");
  expect(heartbeat([](auto& r) { r.set_slow_reason(std::string(65, 'x')); }), grpc::StatusCode::INVALID_ARGUMENT,
         "slow_reason: 65 bytes, above the limit of 64");
  EXPECT_TRUE(heartbeat([](auto& r) {  // rank 0's report is the job's
                r.set_rank(0);
                r.add_slow_ranks(3);
                r.set_slow_reason("node n1 (rank 3) has a slow network");
              })
                  .ok());
  EXPECT_EQ(service.progress("job").slow_ranks, std::vector<int>{3});
  EXPECT_EQ(service.progress("job").slow_reason, "node n1 (rank 3) has a slow network");

  auto barrier = [&](int rank, int count, int64_t timeout_ms) {
    v1::BarrierRequest req;
    *req.mutable_auth() = auth;
    req.set_name("b");
    req.set_rank(rank);
    req.set_count(count);
    req.set_timeout_ms(timeout_ms);
    v1::BarrierResponse resp;
    grpc::ClientContext ctx;
    return stub->Barrier(&ctx, req, &resp);
  };
  expect(barrier(0, -1, 100), grpc::StatusCode::INVALID_ARGUMENT,
         "count: -1 ranks, but a barrier waits for all the job's 4");
  expect(barrier(0, 2, 100), grpc::StatusCode::INVALID_ARGUMENT, "count: 2 ranks");
  expect(barrier(4, 4, 100), grpc::StatusCode::INVALID_ARGUMENT, "rank: 4 is not a rank");
  expect(barrier(0, 4, -5), grpc::StatusCode::INVALID_ARGUMENT, "timeout_ms: -5 is outside");
  expect(barrier(0, 4, 50), grpc::StatusCode::DEADLINE_EXCEEDED, "has 1 of 4 ranks");

  auto set = [&](const std::string& key, size_t bytes) {
    v1::SetRequest req;
    *req.mutable_auth() = auth;
    req.set_key(key);
    req.set_value(std::string(bytes, 'x'));
    v1::SetResponse resp;
    grpc::ClientContext ctx;
    return stub->Set(&ctx, req, &resp);
  };
  expect(set("", 1), grpc::StatusCode::INVALID_ARGUMENT, "key: must not be empty");
  expect(set(std::string(65, 'k'), 1), grpc::StatusCode::INVALID_ARGUMENT, "key: 65 bytes, above the limit of 64");
  expect(set("k", 1025), grpc::StatusCode::INVALID_ARGUMENT, "value: 1025 bytes, above the limit of 1024");
  // 4 values of 1000 bytes fit in 4096; the fifth does not; replacing one does.
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(set("k" + std::to_string(i), 1000).ok());
  expect(set("k4", 1000), grpc::StatusCode::RESOURCE_EXHAUSTED, "above the limit of 4096");
  EXPECT_TRUE(set("k0", 900).ok());
  for (int i = 4; i < 8; ++i) EXPECT_TRUE(set("k" + std::to_string(i), 1).ok());
  expect(set("k8", 1), grpc::StatusCode::RESOURCE_EXHAUSTED, "has 8 keys, the most a job may store");
  // Above the message limit, gRPC refuses the request before it is read.
  expect(set("big", 100 << 10), grpc::StatusCode::RESOURCE_EXHAUSTED, "");

  v1::GetRequest get;
  *get.mutable_auth() = auth;
  get.set_key("k1");
  get.set_timeout_ms(-1);
  v1::GetResponse got;
  grpc::ClientContext ctx;
  expect(stub->Get(&ctx, get, &got), grpc::StatusCode::INVALID_ARGUMENT, "timeout_ms: -1");

  v1::RegisterRequest reg;
  *reg.mutable_auth() = auth;
  reg.set_metrics_port(70000);
  v1::RegisterResponse assigned;
  grpc::ClientContext rctx;
  expect(stub->Register(&rctx, reg, &assigned), grpc::StatusCode::INVALID_ARGUMENT,
         "metrics_port: 70000 is not a port");
}

}  // namespace
}  // namespace tessera
