// Gradient exchange between real processes over loopback TCP, rendezvous through a FileStore; and a
// process that dies mid-job, which must make the others fail fast with a message naming it.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "testing/fork_ranks.h"
#include "worker/comm/exchange.h"
#include "worker/comm/gloo/gloo_communicator.h"

namespace tessera {
namespace {

using testing::fork_ranks;
using testing::make_temp_dir;

float grad_value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 11 + rank * 3) % 19) - 9); }

TEST(ExchangeProcessTest, EveryStrategyAcrossProcessesEqualsReference) {
  const int nodes = 2, local = 2, world = nodes * local;
  const std::string dir = make_temp_dir("tessera-xproc");
  auto outcomes = fork_ranks(
      world,
      [&](int r, std::string& report) {
        FileStore store(dir);
        CommGroups g = connect_groups(store, Topology::grid(nodes, local), r, gloo_factory(Millis(20000)));
        const size_t d = 100003;
        for (const char* s : {"dense", "torus", "topk", "hitopk"}) {
          auto ex = make_exchange(ExchangeConfig{s, 1.0, "mstopk"}, g);
          std::vector<float> x(d);
          for (size_t i = 0; i < d; ++i) x[i] = grad_value(r, i);
          ex->exchange(0, x);
          for (size_t i = 0; i < d; ++i) {
            float want = 0;
            for (int q = 0; q < world; ++q) want += grad_value(q, i);
            if (x[i] != want) {
              report = std::string(s) + ": element " + std::to_string(i) + " is " + std::to_string(x[i]) + ", want " +
                       std::to_string(want);
              return 1;
            }
          }
        }
        return 0;
      },
      std::chrono::seconds(60));
  for (int r = 0; r < world; ++r) EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << ": " << outcomes[r].report;
  std::filesystem::remove_all(dir);
}

TEST(ExchangeProcessTest, DeadProcessFailsTheOthersNamingIt) {
  const int world = 3;
  const std::string dir = make_temp_dir("tessera-xdead");
  auto t0 = std::chrono::steady_clock::now();
  auto outcomes = fork_ranks(
      world,
      [&](int r, std::string& report) {
        FileStore store(dir);
        GlooCommunicator::Options o;
        o.timeout = Millis(3000);
        auto c = GlooCommunicator::connect(store, r, {0, 1, 2}, o);
        std::vector<float> x(1 << 16, 1.0f);
        c->allreduce(std::span<float>(x));  // everyone alive
        if (r == 2) _exit(9);               // dies without a word
        try {
          for (int i = 0; i < 3; ++i) c->allreduce(std::span<float>(x));
          report = "allreduce succeeded without rank 2";
          return 1;
        } catch (const CommError& e) {
          report = e.what();
          std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // no cascade: stay until all have failed
          return 0;
        }
      },
      std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  EXPECT_EQ(outcomes[2].exit_code, 9);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].report;
    const std::string& m = outcomes[r].report;
    EXPECT_NE(m.find("allreduce on group 'world'"), std::string::npos) << m;
    // In the ring rank 0 receives from rank 2, so it names rank 2. Rank 1 sends to rank 2, but the
    // kernel may buffer that send; it then names whichever peer it was left waiting on.
    if (r == 0) {
      EXPECT_NE(m.find("rank 2 (global 2)"), std::string::npos) << m;
    } else {
      EXPECT_TRUE(m.find("rank 2 (global 2)") != std::string::npos || m.find("rank 0 (global 0)") != std::string::npos)
          << m;
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ExchangeProcessTest, MissingProcessTimesOutAtRendezvous) {
  const std::string dir = make_temp_dir("tessera-xmiss");
  auto outcomes = fork_ranks(
      2,
      [&](int r, std::string& report) {
        FileStore store(dir);
        try {
          connect_groups(store, Topology::grid(1, 3), r, gloo_factory(Millis(800)));
        } catch (const CommError& e) {
          report = e.what();
          return 0;
        }
        return 1;
      },
      std::chrono::seconds(20));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 0);
    EXPECT_NE(outcomes[r].report.find("rank 2 (global 2) did not join within 800 ms"), std::string::npos)
        << outcomes[r].report;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
