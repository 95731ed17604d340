// Tensor: a dense float32 array with a shape, stored contiguously in row-major order (N, C, D, H, W
// for volumes). Copies share storage (like a handle); clone() copies the data. Layers exchange
// plain-layout tensors; oneDNN's blocked layouts stay inside the layers.
// Not thread-safe for concurrent writes to shared storage.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);

// Bytes of tensor storage alive in this process now, and the most alive at once since the last
// reset_peak_tensor_bytes() (memory accounting for benchmarks; thread-safe).
int64_t live_tensor_bytes();
int64_t peak_tensor_bytes();
void reset_peak_tensor_bytes();
std::string shape_str(const Shape& s);  // "[2, 4, 32, 32, 32]"

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage of the shape.
  explicit Tensor(Shape shape);
  static Tensor zeros(Shape shape);
  static Tensor filled(Shape shape, float value);

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  bool defined() const { return data_ != nullptr || numel_ == 0; }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  std::span<float> span() { return {data_.get(), static_cast<size_t>(numel_)}; }
  std::span<const float> span() const { return {data_.get(), static_cast<size_t>(numel_)}; }
  float& operator[](int64_t i) { return data_.get()[i]; }
  float operator[](int64_t i) const { return data_.get()[i]; }

  // The same storage seen with another shape of equal element count.
  Tensor reshape(Shape shape) const;
  Tensor clone() const;
  void fill(float value);
  void zero() { fill(0.0f); }

 private:
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<float[]> data_;
};

}  // namespace tessera
