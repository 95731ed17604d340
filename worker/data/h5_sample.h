// One HDF5 file per sample.
//   cosmo: dataset `full` (C, D, H, W), float32 or int16 counts; dataset `unitPar` (targets, float32)
//   unet:  dataset `volume` (C, D, H, W) float32; dataset `segmentation` (D, H, W) int16 labels
// Volumes are chunked (C, 8, H', W) and gzip-compressed, so a read of a D-slab (or D x H block)
// touches only the chunks it needs. Errors name the file and the dataset; nothing is retried here.
#pragma once

#include <array>
#include <string>

#include "worker/core/tensor.h"

namespace tessera {

// A block of the spatial dimensions (D, H, W): [begin, end) each.
struct VolumeBox {
  std::array<int64_t, 3> begin{0, 0, 0}, end{0, 0, 0};
  bool operator==(const VolumeBox&) const = default;
  std::string str() const;
};

enum class SampleFormat { kCosmo, kUNet };

// `input` (C, D, H, W); `target`: cosmo (T) regression targets, unet (D, H, W) labels.
void write_sample(const std::string& path, SampleFormat format, const Tensor& input, const Tensor& target,
                  bool int16_counts = false);

struct BlockRead {
  Tensor input;             // (C, d, h, w) of the box, as float
  Tensor target;            // cosmo: all targets; unet: the box of labels (d, h, w)
  uint64_t stored_bytes = 0;  // bytes of the file's chunks the read touched (what a remote read transfers)
};

// Reads `box` of a sample (an empty box: the whole volume).
BlockRead read_sample_block(const std::string& path, SampleFormat format, VolumeBox box = {});
// The (C, D, H, W) shape of a sample file's volume.
Shape sample_volume_shape(const std::string& path, SampleFormat format);

}  // namespace tessera
