// A dataset of HDF5 sample files (h5_sample.h) listed in a manifest:
//   <dir>/manifest.tsv   "# tessera-dataset v1 format=cosmo|unet samples=N" then "file<TAB>bytes<TAB>fnv64"
// Blocks are read through a TieredCache (memory, SSD, then the remote directory: an HDF5
// hyperslab read of only the block's chunks, charged to the remote FileSystem so a throttled one
// emulates NFS). Cosmo volumes are log1p-transformed after reading. Missing or corrupt files are
// errors naming the file. get()/get_block() are thread-safe.
#pragma once

#include <atomic>

#include "worker/data/dataset.h"
#include "worker/data/filesystem.h"
#include "worker/data/tiered_cache.h"

namespace tessera {

class Hdf5Dataset : public Dataset {
 public:
  // cache may be null (every read goes to the remote directory).
  Hdf5Dataset(const std::string& dir, FileSystem& remote, TieredCache* cache);
  uint64_t size() const override { return files_.size(); }
  Sample get(uint64_t index) const override { return get_block(index, VolumeBox{}); }
  Sample get_block(uint64_t index, const VolumeBox& box) const override;
  Shape input_shape() const override { return input_; }
  Shape target_shape() const override { return target_; }
  SampleFormat format() const { return format_; }
  const std::string& file(uint64_t index) const { return files_.at(index); }
  // Bytes of file chunks read from the remote directory so far (cache misses only).
  uint64_t remote_bytes_read() const { return remote_bytes_.load(); }

 private:
  std::string dir_;
  FileSystem& remote_;
  TieredCache* cache_;
  SampleFormat format_ = SampleFormat::kCosmo;
  std::vector<std::string> files_;
  Shape input_, target_;
  mutable std::atomic<uint64_t> remote_bytes_{0};
};

// Writes `samples` generated samples of edge `size` (cosmo: cosmology fields, raw densities as int16
// counts or float32; unet: labelled shapes) and the manifest into out_dir. Prints progress. out_dir
// must be empty or new; with `replace`, a dataset already there (its manifest and sample files, and
// nothing else) is removed first.
void generate_dataset(const std::string& kind, uint64_t samples, int size, const std::string& out_dir, uint64_t seed,
                      bool int16 = true, bool replace = false);
// Reads every file and checks it against the manifest; throws Error naming the first bad file.
void verify_dataset(const std::string& dir);

}  // namespace tessera
