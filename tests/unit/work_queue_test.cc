// WorkQueue: keys are deduplicated, a key re-added while processed comes back once, failures back off.
#include <gtest/gtest.h>

#include <thread>

#include "controller/kube/work_queue.h"

namespace tessera::kube {
namespace {

using namespace std::chrono_literals;

TEST(WorkQueueTest, AddingAKeyTwiceQueuesItOnce) {
  WorkQueue q;
  q.add("a");
  q.add("b");
  q.add("a");
  EXPECT_EQ(q.depth(), 2u);
  std::string k;
  ASSERT_TRUE(q.get(&k));
  EXPECT_EQ(k, "a");
  // Added while being processed: held back until done, then queued once.
  q.add("a");
  q.add("a");
  EXPECT_EQ(q.depth(), 1u);
  q.done("a");
  EXPECT_EQ(q.depth(), 2u);
}

TEST(WorkQueueTest, FailuresBackOffExponentiallyUntilForgotten) {
  WorkQueue q(20ms, 1000ms);
  std::string k;
  const auto t0 = WorkQueue::Clock::now();
  q.add_rate_limited("a");  // 20 ms
  ASSERT_TRUE(q.get(&k));
  q.done(k);
  q.add_rate_limited("a");  // 40 ms
  ASSERT_TRUE(q.get(&k));
  q.done(k);
  q.add_rate_limited("a");  // 80 ms
  ASSERT_TRUE(q.get(&k));
  q.done(k);
  EXPECT_GE(WorkQueue::Clock::now() - t0, 140ms);
  EXPECT_EQ(q.failures("a"), 3);
  q.forget("a");
  EXPECT_EQ(q.failures("a"), 0);
}

TEST(WorkQueueTest, ShutdownWakesWaiters) {
  WorkQueue q;
  q.add_after("later", 10s);
  std::thread t([&] { q.shutdown(); });
  std::string k;
  EXPECT_FALSE(q.get(&k));
  t.join();
}

}  // namespace
}  // namespace tessera::kube
