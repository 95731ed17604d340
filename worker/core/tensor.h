// Tensor: a dense float32 array with a shape, stored contiguously. The shape is always logical
// (N, C, D, H, W for volumes); the layout says how the entries are ordered in storage: plain
// (row-major in that order) or channels-last (N, D, H, W, C: channels innermost, the order the
// oneDNN convolutions and pooling run fastest in on CPU). Copies share storage (like a handle);
// clone() copies the data. Only layers that say so take channels-last tensors (Sequential converts
// for the others); everything outside a Sequential sees plain tensors.
// Storage is on the host or on a CUDA device (Device; see device.h). data() is then a device pointer:
// only layers and kernels that dispatch on device() may touch it, and span() and operator[] are for
// host tensors (span() checks). to() copies between the two.
// Not thread-safe for concurrent writes to shared storage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/core/device.h"

namespace tessera {

using Shape = std::vector<int64_t>;

enum class Layout : uint8_t { kPlain, kChannelsLast };

int64_t shape_numel(const Shape& s);

// Bytes of tensor storage alive in this process now, and the most alive at once since the last
// reset_peak_tensor_bytes() (memory accounting for benchmarks; thread-safe).
int64_t live_tensor_bytes();
int64_t peak_tensor_bytes();
void reset_peak_tensor_bytes();
// Bytes of freed host storage held for the next tensors (keep_freed_tensor_memory()).
int64_t cached_tensor_bytes();

// Keeps freed host storage in this process for the next tensor instead of giving it back to the
// system: blocks of 64 KiB and more by size, for the next tensor of the same size (held and alive
// together no more than 1.25 times the most ever alive at once), smaller ones in glibc's heap, which is never
// trimmed (its mmap and trim thresholds). A training step frees and allocates the same sizes every
// step, and unmapping them only to fault them in again, zeroed, costs kernel time (ResNet-50 at batch
// 8 faulted 16,000-40,000 pages a step in glibc's heap alone, which fragments), more so on a virtual
// machine whose page tables are shadowed (an unmap there makes the next access to any memory fault:
// MSTopK after a 100 MB free took 70-80 ms instead of 6). Called once at the start of the worker and
// the benchmarks; tests allocate plainly, so memory checkers see every free.
void keep_freed_tensor_memory();
std::string shape_str(const Shape& s);  // "[2, 4, 32, 32, 32]"

// While one lives on this thread, new tensors have their shape and no storage (empty spans, fills do
// nothing): a model is built this way to count and check it without allocating its parameters
// (`tessera validate` of a model of any size).
class ShapeOnlyTensors {
 public:
  ShapeOnlyTensors();
  ~ShapeOnlyTensors();
  ShapeOnlyTensors(const ShapeOnlyTensors&) = delete;
  ShapeOnlyTensors& operator=(const ShapeOnlyTensors&) = delete;

 private:
  bool outer_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage of the shape (none under ShapeOnlyTensors). Device storage is on the
  // calling thread's device (gpu::set_device).
  explicit Tensor(Shape shape, Layout layout = Layout::kPlain, Device device = Device::kCpu);
  static Tensor zeros(Shape shape, Device device = Device::kCpu);
  // A host tensor in page-locked memory (gpu::alloc_pinned): copies between it and a device run
  // asynchronously and at the bus's full rate. Builds with CUDA only.
  static Tensor pinned(Shape shape);
  static Tensor filled(Shape shape, float value, Device device = Device::kCpu);

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  bool defined() const { return data_ != nullptr || numel_ == 0; }
  Layout layout() const { return layout_; }
  bool channels_last() const { return layout_ == Layout::kChannelsLast; }
  Device device() const { return device_; }
  bool on_device() const { return device_ == Device::kCuda; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  // Host tensors only (a logic error on a device tensor).
  std::span<float> span() {
    check_host();
    return {data_.get(), data_ ? static_cast<size_t>(numel_) : 0};
  }
  std::span<const float> span() const {
    check_host();
    return {data_.get(), data_ ? static_cast<size_t>(numel_) : 0};
  }
  float& operator[](int64_t i) { return data_.get()[i]; }
  float operator[](int64_t i) const { return data_.get()[i]; }

  // The same storage seen with another shape of equal element count (plain tensors only).
  Tensor reshape(Shape shape) const;
  Tensor clone() const;
  // A copy on `device` (this tensor itself, shared, when it is there already). A copy to the host
  // waits for the device.
  Tensor to(Device device) const;
  // Copies src's entries into this tensor's storage (equal element counts; any devices).
  void copy_from(const Tensor& src);
  // Device storage is freed in order with one stream: the allocating thread's, until a tensor
  // handed to another thread (a batch from the loader's) is adopted by it, whose stream then uses
  // it last. Without this its block could go back to the pool while the new user's kernels still
  // read it. No effect on host tensors.
  void adopt_stream();
  void fill(float value);
  void zero() { fill(0.0f); }

 private:
  void check_host() const;
  Shape shape_;
  int64_t numel_ = 0;
  Layout layout_ = Layout::kPlain;
  Device device_ = Device::kCpu;
  std::shared_ptr<void*> free_stream_;  // device storage: the stream its deleter frees it on
  std::shared_ptr<float[]> data_;
};

}  // namespace tessera
