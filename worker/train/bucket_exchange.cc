#include "worker/train/bucket_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
Fixed ms_between(Clock::time_point a, Clock::time_point b) {
  return {1e3 * std::chrono::duration<double>(b - a).count(), 1};
}

}  // namespace

BucketExchange::BucketExchange(const std::vector<Param*>& params, int64_t bucket_bytes, bool overlap,
                               bool device_buckets)
    : overlap_(overlap), hook_([this](Layer& l) { ready(l); }) {
  const size_t cap = static_cast<size_t>(bucket_bytes) / sizeof(float);
  size_t used = cap;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    Param* p = *it;
    const size_t n = static_cast<size_t>(p->grad.numel());
    if (used + n > cap && used > 0) {
      buckets_.emplace_back();
      used = 0;
    }
    buckets_.back().slots.push_back({p, used});
    bucket_of_[p] = buckets_.size() - 1;
    used += n;
    buckets_.back().size = used;
  }
  pending_.resize(buckets_.size());
  const bool on_device = !params.empty() && params.front()->grad.on_device();
  TESSERA_CHECK(on_device || !device_buckets, "device buckets for gradients on the host");
  for (Bucket& k : buckets_) {
    if (device_buckets) k.device_data = Tensor({static_cast<int64_t>(k.size)}, Layout::kPlain, Device::kCuda);
    else k.data.resize(k.size);
  }
  if (on_device) {
    device_ = gpu::current_device();
    for (size_t b = 0; b < buckets_.size(); ++b) ready_events_.push_back(std::make_unique<gpu::Event>());
  }
  if (overlap_) thread_ = std::thread([this] { loop(); });
}

BucketExchange::~BucketExchange() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();  // a step that failed part-way: what was not taken is dropped
  }
  cv_.notify_all();
  thread_.join();
}

void BucketExchange::begin(Send send, float scale, Fill fill) {
  send_ = std::move(send);
  fill_ = std::move(fill);
  scale_ = scale;
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].slots.size();
  next_ = 0;
  busy_s_ = 0;
  std::lock_guard<std::mutex> lock(mu_);
  done_ = 0;
  error_ = nullptr;
}

void BucketExchange::ready(Layer& layer) {
  for (Param* p : layer.params()) {
    auto it = bucket_of_.find(p);
    if (it != bucket_of_.end() && pending_[it->second] > 0) --pending_[it->second];
  }
  submit_ready();
}

void BucketExchange::submit_ready() {
  size_t first = next_;
  while (next_ < buckets_.size() && pending_[next_] == 0) ++next_;
  if (next_ == first) return;
  // On the GPU the backward pass has queued these gradients' kernels, not run them: the sender waits
  // for this point of the training thread's stream.
  for (size_t b = first; b < next_ && device_ >= 0; ++b) ready_events_[b]->record();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = first; b < next_; ++b) queue_.push_back(b);
  }
  cv_.notify_all();
}

void BucketExchange::run_bucket(size_t b) {
  const auto t0 = Clock::now();
  Bucket& k = buckets_[b];
  const bool on_device = !k.device_data.empty();
  float* fused = on_device ? k.device_data.data() : k.data.data();
  if (device_ >= 0) {
    // This thread's stream waits for the training stream's work on the bucket's gradients.
    if (overlap_) ready_events_[b]->wait();
    const Device to = on_device ? Device::kCuda : Device::kCpu;  // host: staged for Gloo
    for (const Slot& s : k.slots)
      gpu::copy(fused + s.offset, to, s.param->grad.data(), Device::kCuda,
                static_cast<size_t>(s.param->grad.numel()) * sizeof(float));
    gpu::synchronize();  // the collectives run on other streams (NCCL's) or the host
  } else {
    for (const Slot& s : k.slots) {
      const size_t n = static_cast<size_t>(s.param->grad.numel());
      if (fill_)
        fill_(static_cast<int>(b), s.offset, std::span<const float>(s.param->grad.data(), n),
              std::span<float>(k.data.data() + s.offset, n));
      else std::memcpy(k.data.data() + s.offset, s.param->grad.data(), n * sizeof(float));
    }
  }
  const auto t1 = Clock::now();
  send_(static_cast<int>(b), std::span<float>(fused, k.size));
  const auto t2 = Clock::now();
  if (device_ >= 0) {
    for (const Slot& s : k.slots) {
      const int64_t n = s.param->grad.numel();
      gpu::copy(s.param->grad.data(), Device::kCuda, fused + s.offset, on_device ? Device::kCuda : Device::kCpu,
                static_cast<size_t>(n) * sizeof(float));
      gpu::scale(s.param->grad.data(), static_cast<size_t>(n), scale_);
    }
    gpu::synchronize();  // the bucket is done when its gradients are back on the device
  } else {
    for (const Slot& s : k.slots) {
      float* g = s.param->grad.data();
      const float* d = k.data.data() + s.offset;
      for (int64_t i = 0; i < s.param->grad.numel(); ++i) g[i] = d[i] * scale_;
    }
  }
  const auto t3 = Clock::now();
  busy_s_ += std::chrono::duration<double>(t3 - t0).count();
  // Where a step's communication goes (TESSERA_LOG_LEVEL=debug): the exchange of a bucket includes
  // the wait for the last rank to get there, so the first bucket shows how far the ranks' compute
  // drifted apart.
  log_debug("bucket ", b, " (", k.size, " floats): fuse ", ms_between(t0, t1), " ms, exchange ", ms_between(t1, t2),
            " ms, unfuse ", ms_between(t2, t3), " ms");
}

void BucketExchange::loop() {
  if (device_ >= 0) gpu::set_device(device_);  // this thread's stream on the gradients' device
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const size_t b = queue_.front();
    queue_.erase(queue_.begin());
    const bool failed = error_ != nullptr;
    lock.unlock();
    std::exception_ptr e;
    if (!failed) {  // after an error the rest of the step is not sent: its peers are gone or out of step
      try {
        run_bucket(b);
      } catch (...) {
        e = std::current_exception();
      }
    }
    lock.lock();
    if (e && !error_) error_ = e;
    ++done_;
    cv_.notify_all();
  }
}

double BucketExchange::finish() {
  const auto t0 = Clock::now();
  if (!overlap_) {
    for (size_t b = 0; b < buckets_.size(); ++b) run_bucket(b);
    return seconds_since(t0);
  }
  std::fill(pending_.begin(), pending_.end(), 0);  // the backward pass is over: every gradient is final
  submit_ready();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  if (error_) std::rethrow_exception(error_);
  return seconds_since(t0);
}

}  // namespace tessera
