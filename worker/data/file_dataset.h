// A dataset of sample files indexed in <dir>/manifest.tsv (dataset_index.h): HDF5 files or .npy
// pairs, in any layout the index records. A sample is a file's whole volume or, cropped, one of its
// sub-volumes. Blocks are read through a TieredCache (memory, SSD, then the remote directory: a read
// of only the block's part of the file, charged to the remote FileSystem so a throttled one emulates
// NFS), and transformed (log1p, standardize) after reading, off the training thread. Missing or
// corrupt files are errors naming the file. get()/get_block() are thread-safe.
#pragma once

#include <array>
#include <atomic>

#include "worker/data/dataset.h"
#include "worker/data/dataset_index.h"
#include "worker/data/filesystem.h"
#include "worker/data/tiered_cache.h"

namespace tessera {

// The (d, h, w) of the samples a model taking `sample` (C, d, h, w) trains on from files of
// `volume` (C, D, H, W): the whole volume when they agree; with crop, sub-volumes that tile it.
// ConfigError at spec.model.inChannels, or spec.model.inputSize (naming spec.dataset.crop) otherwise.
std::array<int64_t, 3> fit_sample(const Shape& volume, const Shape& sample, bool crop, const std::string& dir);

class FileDataset : public Dataset {
 public:
  // extent: the samples' (d, h, w), from fit_sample; all 0: the whole volume. cache may be null (every read goes to the
  // remote directory).
  FileDataset(const std::string& dir, DatasetIndex index, std::array<int64_t, 3> extent, FileSystem& remote,
              TieredCache* cache);
  // Whole volumes, index read from dir.
  FileDataset(const std::string& dir, FileSystem& remote, TieredCache* cache);
  uint64_t size() const override { return index_.entries.size() * per_file_; }
  Sample get(uint64_t index) const override { return get_block(index, VolumeBox{}); }
  Sample get_block(uint64_t index, const VolumeBox& box) const override;
  Shape input_shape() const override;
  Shape target_shape() const override;
  const DatasetIndex& index() const { return index_; }
  // The file holding sample `index`'s volume.
  std::string file(uint64_t index) const { return dir_ + "/" + index_.entries.at(index / per_file_).file; }
  // The box of its file's volume that sample `index` is.
  VolumeBox sub_volume(uint64_t index) const;
  // Bytes of file chunks read from the remote directory so far (cache misses only).
  uint64_t remote_bytes_read() const { return remote_bytes_.load(); }

 private:
  std::string dir_;
  DatasetIndex index_;
  std::array<int64_t, 3> extent_, tiles_{1, 1, 1};
  uint64_t per_file_ = 1;
  FileSystem& remote_;
  TieredCache* cache_;
  mutable std::atomic<uint64_t> remote_bytes_{0};
};

}  // namespace tessera
