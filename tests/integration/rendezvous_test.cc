// The controller's rendezvous service with workers' GrpcStore clients: token checks, rank
// assignment from the ring plan (the same rank after a restart), Gloo bootstrapped through it, a
// missing worker timing out with a message naming it, barriers.
#include <gtest/gtest.h>

#include "controller/placement/ring_planner.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "tests/support/rank_threads.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/grpc_store.h"
#include "worker/core/error.h"

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
    store.barrier("never", 0, 2, Millis(200));
    FAIL();
  } catch (const StoreTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("barrier 'never' has 1 of 2 ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
