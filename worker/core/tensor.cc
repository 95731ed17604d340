#include "worker/core/tensor.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/error.h"

namespace tessera {
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};

void track_alloc(int64_t bytes) {
  const int64_t now = g_live.fetch_add(bytes) + bytes;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Freed host blocks of 64 KiB and more, by size, for the next tensor of that size (a training step
// allocates the same sizes every step). What it holds and what is alive together stay within 1.25
// times the most that was ever alive at once (`high_`; held_limit()): a block that would pass it is
// given back, and a miss that would pass it gives back cached blocks first. Off until keep_freed_tensor_memory().
class BlockCache {
 public:
  static constexpr int64_t kMinBytes = 64 << 10;
  static BlockCache& get() {
    static BlockCache* cache = new BlockCache;  // never destroyed: tensors may outlive static destructors
    return *cache;
  }
  void enable() { on_ = true; }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  float* take(int64_t bytes) {
    if (!on_ || bytes < kMinBytes) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      float* p = it->second.back();
      it->second.pop_back();
      cached_ -= bytes;
      return p;
    }
    const int64_t live = g_live.load();
    high_ = std::max(high_, live + bytes);
    for (auto f = free_.begin(); f != free_.end() && live + bytes + cached_ > held_limit();) {
      for (float* q : f->second) ::operator delete[](q, std::align_val_t(64));
      cached_ -= f->first * static_cast<int64_t>(f->second.size());
      f = free_.erase(f);
    }
    return nullptr;
  }
  // Whether it kept p.
  bool give(float* p, int64_t bytes) {
    if (!on_ || bytes < kMinBytes) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (g_live.load() + cached_ + bytes > held_limit()) return false;
    free_[bytes].push_back(p);
    cached_ += bytes;
    return true;
  }

 private:
  int64_t held_limit() const { return high_ + high_ / 4; }
  std::atomic<bool> on_{false};
  std::mutex mu_;
  std::unordered_map<int64_t, std::vector<float*>> free_;
  int64_t cached_ = 0, high_ = 0;
};
}  // namespace

int64_t live_tensor_bytes() { return g_live.load(); }
int64_t peak_tensor_bytes() { return g_peak.load(); }
void reset_peak_tensor_bytes() { g_peak = g_live.load(); }
int64_t cached_tensor_bytes() { return BlockCache::get().cached(); }

void keep_freed_tensor_memory() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, -1);  // never: a step's activations (GiBs for ResNet-50) come back next step
  BlockCache::get().enable();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    TESSERA_CHECK(d >= 0, "negative dimension in ", shape_str(s));
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("a tensor of shape " + shape_str(s) + " has more elements than an int64 counts");
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

namespace {
thread_local bool t_shape_only = false;
}  // namespace

ShapeOnlyTensors::ShapeOnlyTensors() : outer_(!t_shape_only) { t_shape_only = true; }
ShapeOnlyTensors::~ShapeOnlyTensors() {
  if (outer_) t_shape_only = false;
}

Tensor::Tensor(Shape shape, Layout layout, Device device)
    : shape_(std::move(shape)), numel_(shape_numel(shape_)), layout_(layout), device_(device) {
  TESSERA_CHECK(layout == Layout::kPlain || shape_.size() >= 3, "a channels-last tensor needs spatial dimensions, got ",
                shape_str(shape_));
  if (numel_ == 0 || t_shape_only) return;
  const int64_t bytes = numel_ * static_cast<int64_t>(sizeof(float));
  if (device == Device::kCuda) {
    float* p = static_cast<float*>(gpu::alloc(static_cast<size_t>(bytes)));
    free_stream_ = std::make_shared<void*>(gpu::stream());
    data_ = std::shared_ptr<float[]>(p, [stream = free_stream_](float* q) { gpu::free(q, *stream); });
    return;
  }
  // 64-byte aligned for vector loads.
  {
    float* p = BlockCache::get().take(bytes);
    if (!p) p = static_cast<float*>(::operator new[](bytes, std::align_val_t(64)));
    track_alloc(bytes);
    data_ = std::shared_ptr<float[]>(p, [bytes](float* q) {
      g_live.fetch_sub(bytes);
      if (!BlockCache::get().give(q, bytes)) ::operator delete[](q, std::align_val_t(64));
    });
  }
}

Tensor Tensor::zeros(Shape shape, Device device) {
  Tensor t(std::move(shape), Layout::kPlain, device);
  t.fill(0.0f);
  return t;
}

Tensor Tensor::filled(Shape shape, float value, Device device) {
  Tensor t(std::move(shape), Layout::kPlain, device);
  t.fill(value);
  return t;
}

Tensor Tensor::pinned(Shape shape) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  if (t.numel_ > 0 && !t_shape_only) {
    float* p = static_cast<float*>(gpu::alloc_pinned(static_cast<size_t>(t.numel_) * sizeof(float)));
    t.data_ = std::shared_ptr<float[]>(p, [](float* q) { gpu::free_pinned(q); });
  }
  return t;
}

void Tensor::adopt_stream() {
  if (free_stream_) *free_stream_ = gpu::stream();
}

void Tensor::check_host() const {
  TESSERA_CHECK(device_ == Device::kCpu, "host access to a tensor ", shape_str(shape_), " on the CUDA device");
}

Tensor Tensor::reshape(Shape shape) const {
  TESSERA_CHECK_EQ(shape_numel(shape), numel_, "reshape ", shape_str(shape_), " to ", shape_str(shape));
  TESSERA_CHECK(layout_ == Layout::kPlain, "reshape of a channels-last tensor ", shape_str(shape_));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, layout_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  if (device == device_) return *this;
  Tensor t(shape_, layout_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  TESSERA_CHECK_EQ(src.numel_, numel_, "copy of ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (!data_ || !src.data_) return;
  const size_t bytes = static_cast<size_t>(numel_) * sizeof(float);
  if (device_ == Device::kCpu && src.device_ == Device::kCpu) std::memcpy(data_.get(), src.data_.get(), bytes);
  else gpu::copy(data_.get(), device_, src.data_.get(), src.device_, bytes);
}

void Tensor::fill(float value) {
  if (!data_) return;
  if (device_ == Device::kCuda) gpu::fill(data_.get(), static_cast<size_t>(numel_), value);
  else std::fill(data_.get(), data_.get() + numel_, value);
}

}  // namespace tessera
