// BucketExchange: buckets in reverse parameter order, handed to the communication thread while the
// backward pass goes on, always in index order, and errors of a send reported by finish().
#include "worker/train/bucket_exchange.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace tessera {
namespace {

// A layer that only owns one parameter of n entries.
class Holder final : public Layer {
 public:
  Holder(const std::string& name, int64_t n) : Layer(name) {
    p_.name = name;
    p_.value = Tensor(Shape{n});
    p_.grad = Tensor(Shape{n});
  }
  const char* kind() const override { return "holder"; }
  Shape output_shape(const Shape& in) const override { return in; }
  Tensor forward(const Tensor& x, bool) override { return x; }
  Tensor backward(const Tensor& dy) override { return dy; }
  std::vector<Param*> params() override { return {&p_}; }
  Param& param() { return p_; }

 private:
  Param p_;
};

struct Fixture {
  Holder a{"a", 100}, b{"b", 100}, c{"c", 300};
  std::vector<Param*> params() { return {&a.param(), &b.param(), &c.param()}; }
  void fill() {
    for (Holder* h : {&a, &b, &c})
      for (float& g : h->param().grad.span()) g = 2.0f;
  }
};

bool eventually(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

TEST(BucketExchangeTest, BucketsFollowTheBackwardOrder) {
  Fixture f;
  // 200 floats per bucket: c (300) alone, then b and a together.
  BucketExchange x(f.params(), 800, false);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x.bucket_size(0), 300u);
  EXPECT_EQ(x.bucket_size(1), 200u);
  EXPECT_EQ(x.hook(), nullptr);
}

TEST(BucketExchangeTest, ABucketLeavesAsSoonAsItsGradientsAreFinal) {
  Fixture f;
  f.fill();
  BucketExchange x(f.params(), 800, true);
  std::vector<int> order;
  std::atomic<int> sent{0};
  x.begin(
      [&](int b, std::span<float> data) {
        order.push_back(b);
        for (float& v : data) v *= 3.0f;  // the "sum over ranks"
        ++sent;
      },
      0.5f);
  ASSERT_NE(x.hook(), nullptr);
  (*x.hook())(f.c);  // the backward pass has finished c: bucket 0 is complete
  EXPECT_TRUE(eventually([&] { return sent == 1; })) << "bucket 0 was not sent during the backward pass";
  (*x.hook())(f.b);  // bucket 1 still waits for a
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(sent, 1);
  (*x.hook())(f.a);
  x.finish();
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  for (Holder* h : {&f.a, &f.b, &f.c})
    for (float g : h->param().grad.span()) ASSERT_EQ(g, 3.0f) << h->name();
  EXPECT_GT(x.busy_seconds(), 0.0);
}

TEST(BucketExchangeTest, BucketsReadyOutOfOrderAreStillSentInIndexOrder) {
  Fixture f;
  BucketExchange x(f.params(), 800, true);
  std::vector<int> order;
  x.begin([&](int b, std::span<float>) { order.push_back(b); }, 1.0f);
  (*x.hook())(f.a);
  (*x.hook())(f.b);  // bucket 1 is complete before bucket 0
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(order.empty());
  x.finish();  // the end of the backward pass completes c
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

TEST(BucketExchangeTest, AFailedSendIsReportedAndTheRestOfTheStepIsNotSent) {
  for (bool overlap : {true, false}) {
    Fixture f;
    BucketExchange x(f.params(), 800, overlap);
    int calls = 0;
    x.begin(
        [&](int b, std::span<float>) {
          ++calls;
          if (b == 0) throw std::runtime_error("peer gone");
        },
        1.0f);
    EXPECT_THROW(x.finish(), std::runtime_error) << "overlap " << overlap;
    EXPECT_EQ(calls, 1) << "overlap " << overlap;
    // The next step starts clean.
    calls = 0;
    x.begin([&](int, std::span<float>) { ++calls; }, 1.0f);
    x.finish();
    EXPECT_EQ(calls, 2);
  }
}

}  // namespace
}  // namespace tessera
