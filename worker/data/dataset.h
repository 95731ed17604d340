// Datasets, epoch order and data-parallel sharding.
//
// Every rank computes the same permutation of the samples for an epoch (from the shared seed), and a
// data-parallel replica takes its contiguous part of each global batch, so the replicas together
// see exactly the samples a single process with the global batch would, in the same order.
// Dataset::get is thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/data/arrays.h"
#include "worker/data/synthetic.h"

namespace tessera {

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual uint64_t size() const = 0;
  virtual Sample get(uint64_t index) const = 0;
  virtual Shape input_shape() const = 0;   // per sample
  virtual Shape target_shape() const = 0;  // per sample
  // One sample's block of the volume (C, d, h, w), with its targets (per-voxel labels cropped to the
  // block). The default reads the whole sample and crops; file datasets read only the block.
  virtual Sample get_block(uint64_t index, const VolumeBox& box) const;
};

// Crops (C, D, H, W) volumes (and (D, H, W) labels) to box.
Tensor crop_volume(const Tensor& v, const VolumeBox& box);

// Some of another dataset's samples, by index: the two parts of a validation split.
class Subset : public Dataset {
 public:
  Subset(std::shared_ptr<const Dataset> all, std::vector<uint64_t> indices)
      : all_(std::move(all)), indices_(std::move(indices)) {}
  uint64_t size() const override { return indices_.size(); }
  Sample get(uint64_t index) const override { return all_->get(indices_.at(index)); }
  Shape input_shape() const override { return all_->input_shape(); }
  Shape target_shape() const override { return all_->target_shape(); }
  Sample get_block(uint64_t index, const VolumeBox& box) const override {
    return all_->get_block(indices_.at(index), box);
  }

 private:
  std::shared_ptr<const Dataset> all_;
  std::vector<uint64_t> indices_;
};

// spec.dataset.validationSplit: holds out round(fraction * size) samples, at least 1, chosen by a
// permutation of `seed` (the same on every rank), and returns {training, validation}, each in file
// order. ConfigError at spec.dataset.validationSplit when either part would be empty.
std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>> split_validation(std::shared_ptr<const Dataset> all,
                                                                               double fraction, uint64_t seed);

struct SyntheticConfig {
  std::string kind = "cosmo";  // cosmo | shapes | images
  int size = 32;               // W
  uint64_t samples = 256;
  uint64_t seed = 1;
  int classes = 0;                      // shapes 3, images 10 by default
  int channels = 1;                     // images: channels of each sample
  size_t memo_bytes = size_t{1} << 30;  // generated samples kept in memory up to this many bytes
};

// ConfigError on dataset.* when the kind is unknown or the sizes impossible.
std::unique_ptr<Dataset> make_synthetic(const SyntheticConfig& config);

struct Batch {
  Tensor inputs;   // (b, C, spatial...)
  Tensor targets;  // (b, target...)
};

// The permutation of [0, size) used in `epoch`; identical on every rank for the same seed.
std::vector<uint64_t> epoch_order(uint64_t size, uint64_t seed, int epoch);
// Replica `replica` of `replicas` takes samples [replica * b, (replica + 1) * b) of global batch
// `step` (b = global_batch / replicas, which must divide).
std::vector<uint64_t> shard_batch(const std::vector<uint64_t>& order, int64_t step, int global_batch, int replica,
                                  int replicas);
Batch stack(const Dataset& data, const std::vector<uint64_t>& indices);
// Stacks samples given already loaded.
Batch stack_samples(const std::vector<Sample>& samples);

}  // namespace tessera
