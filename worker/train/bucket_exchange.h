// BucketExchange: a training step's gradients, fused into flat buckets and exchanged bucket by
// bucket, overlapped with the backward pass or after it.
//
// Buckets hold the parameters in reverse order (the order the backward pass finishes them), at most
// bucket_bytes each (a larger parameter gets a bucket of its own). With overlap on, a bucket is
// handed to a communication thread as soon as the backward pass has finished every parameter in it,
// and the step waits (finish()) only for what is still in flight; buckets are always sent in index
// order, so every rank issues the same collectives in the same order. Overlapped or not, each
// bucket goes through the same fuse -> send -> unfuse, so the results are bitwise identical.
//
// Threads: begin(), the ready hook and finish() run on the training thread; `send` runs on the
// communication thread when overlapping (and must only use communicators the backward pass does not).
//
// Gradients on the GPU: the communication thread (with a CUDA stream of its own) waits for the point
// of the training stream where the bucket's gradients were finished (an Event), fuses them into the
// bucket, exchanges it, and unfuses the result before the bucket counts as done. The bucket is host
// memory (Gloo, staged through the host) or device memory (device_buckets: NCCL).
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "worker/core/device.h"
#include "worker/nn/layer.h"

namespace tessera {

class BucketExchange {
 public:
  // Exchanges bucket `b` in place: this rank's gradients on entry, the sum over ranks on return.
  using Send = std::function<void(int b, std::span<float> bucket)>;
  // Fills bucket `b` from one parameter's gradients at `offset` instead of copying them (gradients on
  // the host only; see host_gradients()): `into` is the bucket's span for that parameter.
  using Fill = std::function<void(int b, size_t offset, std::span<const float> grad, std::span<float> into)>;

  BucketExchange(const std::vector<Param*>& params, int64_t bucket_bytes, bool overlap, bool device_buckets = false);
  ~BucketExchange();
  BucketExchange(const BucketExchange&) = delete;
  BucketExchange& operator=(const BucketExchange&) = delete;

  size_t size() const { return buckets_.size(); }
  size_t bucket_size(size_t b) const { return buckets_[b].size; }
  std::vector<size_t> bucket_sizes() const {
    std::vector<size_t> out;
    for (const Bucket& b : buckets_) out.push_back(b.size);
    return out;
  }
  bool overlap() const { return overlap_; }

  // Starts a step. After the exchange, each gradient is the bucket's result times `scale`. `fill`,
  // where given, fills the buckets of host gradients in the pass that fuses them.
  void begin(Send send, float scale, Fill fill = nullptr);
  // Whether the gradients are in host memory (and begin's `fill` is used).
  bool host_gradients() const { return device_ < 0; }
  // The hook to pass to the backward pass (null without overlap).
  const GradReady* hook() const { return overlap_ ? &hook_ : nullptr; }
  // Sends what the hook has not, waits for every bucket and rethrows the first error of a send.
  // Returns the seconds it waited (the step's exposed communication).
  double finish();
  // Seconds spent sending buckets during the last step (overlapped with backward or not).
  double busy_seconds() const { return busy_s_; }

 private:
  struct Slot {
    Param* param;
    size_t offset;
  };
  struct Bucket {
    std::vector<Slot> slots;
    size_t size = 0;
    std::vector<float> data;  // the fused gradients on the host
    Tensor device_data;       // or on the device (device buckets)
  };
  void ready(Layer& layer);
  void submit_ready();        // hands complete buckets over, in index order
  void run_bucket(size_t b);  // fuse, send, unfuse
  void loop();

  std::vector<Bucket> buckets_;
  std::unordered_map<const Param*, size_t> bucket_of_;
  int device_ = -1;                                        // the CUDA device of the gradients; -1: on the host
  std::vector<std::unique_ptr<gpu::Event>> ready_events_;  // per bucket, on the GPU
  bool overlap_;
  GradReady hook_;
  Send send_;
  Fill fill_;
  float scale_ = 1;
  std::vector<size_t> pending_;  // per bucket: parameters the backward pass has not finished
  size_t next_ = 0;              // the next bucket to hand over
  double busy_s_ = 0;            // written by whichever thread sends

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> queue_;  // handed over, not yet taken
  size_t done_ = 0;            // buckets sent (or skipped after an error) this step
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera
