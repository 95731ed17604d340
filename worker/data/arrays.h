// The arrays of sample files: datasets of an HDF5 file (by name) and NumPy .npy files (one array
// each), read whole or as a box of their three spatial dimensions.
//
// A volume's spatial dimensions (D, H, W) are its last three (channels first: (C, D, H, W) or
// (D, H, W)) or, channels last, its first three ((D, H, W, C)); a read returns (lead..., d, h, w)
// either way, as float. Arrays of rank below 3 (regression targets) are read whole. HDF5 reads
// select a hyperslab, so they touch only the chunks of the box; .npy reads fetch only the rows of
// the box. Errors name the file and the array; nothing is retried here. Thread-safe (the serial
// HDF5 library is called under one lock).
#pragma once

#include <array>
#include <map>
#include <string>

#include "worker/core/tensor.h"

namespace tessera {

// A block of the spatial dimensions (D, H, W): [begin, end) each. An empty box is the whole volume.
struct VolumeBox {
  std::array<int64_t, 3> begin{0, 0, 0}, end{0, 0, 0};
  bool operator==(const VolumeBox&) const = default;
  bool empty() const { return *this == VolumeBox{}; }
  std::string str() const;
};

struct ArrayInfo {
  Shape shape;
  std::string type;  // int8 .. int64, uint8 .. uint64, float32, float64
  bool floating = false;
  std::string unreadable;   // why an HDF5 dataset cannot be read as a sample's array; empty when it can
  std::string str() const;  // "int16 (4, 64, 64, 64)"
};

// An array of a sample file: `key` names an HDF5 dataset; an empty key is a .npy file's array.
struct ArrayRef {
  std::string path, key;
  std::string str() const;  // "'a.h5' dataset 'full'" or "'a_x.npy'"
};

// Every dataset at the root of an HDF5 file (`unreadable` says why one cannot be read: its element
// type or its filters). Error naming the file when it is not (readable) HDF5.
std::map<std::string, ArrayInfo> h5_arrays(const std::string& path);
// Error naming the array when it is missing or unreadable.
ArrayInfo array_info(const ArrayRef& a);

struct ArrayRead {
  Tensor values;
  uint64_t stored_bytes = 0;  // bytes of the file the read touched (what a remote read transfers)
};
ArrayRead read_array(const ArrayRef& a, const VolumeBox& box = {}, bool channels_last = false);

// Calls f(slab) for consecutive slabs of the array's first spatial dimension (each at most about
// max_bytes as float; arrays of rank below 3 in one piece): how a whole large volume is scanned.
template <typename F>
void for_each_slab(const ArrayRef& a, const ArrayInfo& info, bool channels_last, size_t max_bytes, F&& f);

// Writes a generated sample: float32 (or int16 counts) `input` chunked and compressed under
// input_key, and `target` under target_key (labels int16, chunked alike; targets float32).
void write_h5_sample(const std::string& path, const std::string& input_key, const Tensor& input,
                     const std::string& target_key, const Tensor& target, bool int16_input, bool labels);
// Writes t as a float32 .npy file (C order).
void write_npy(const std::string& path, const Tensor& t);

// ---- implementation

template <typename F>
void for_each_slab(const ArrayRef& a, const ArrayInfo& info, bool channels_last, size_t max_bytes, F&& f) {
  const int r = static_cast<int>(info.shape.size());
  if (r < 3) {
    f(read_array(a).values);
    return;
  }
  const int first = channels_last ? 0 : r - 3;
  const int64_t D = info.shape[first];
  const int64_t per = shape_numel(info.shape) / std::max<int64_t>(1, D) * 4;
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(max_bytes) / std::max<int64_t>(1, per));
  for (int64_t z = 0; z < D; z += step) {
    VolumeBox box{{z, 0, 0}, {std::min(D, z + step), info.shape[first + 1], info.shape[first + 2]}};
    f(read_array(a, box, channels_last).values);
  }
}

}  // namespace tessera
