// Distributed layers for spatial parallelism. Each rank holds its block (N, C, own d, own h, own w)
// of every activation; a distributed layer exchanges halos, runs the single-rank nn/ layer on the
// extended block (with padding only where the block touches the volume's edge) and, in backward,
// returns halo gradients to their owners. Weights are the same on every rank; weight gradients are
// this rank's partial sums (the trainer sums them over the world together with the data-parallel
// exchange). Pointwise layers (activations) need no exchange; BatchNorm takes a StatsReducer that
// all-reduces over the spatial group (spatial_batchnorm_reducer).
//
// Shuffle turns the spatial layout into the sample layout before the dense head: every rank gets
// the whole (small) feature map of the samples i with i % group_size == its spatial rank.
#pragma once

#include <memory>

#include "worker/nn/batchnorm.h"
#include "worker/nn/conv.h"
#include "worker/nn/pool.h"
#include "worker/spatial/halo.h"

namespace tessera {

// The input partition every distributed layer is built from, plus the spatial group.
struct SpatialContext {
  Communicator* comm = nullptr;  // the spatial group (size grid.size())
  SpatialGrid grid;
};

class DistConv : public Layer {
 public:
  // `in_extent`: the global (D, H, W) of the input. Options as for the single-rank layer.
  DistConv(std::string name, ConvOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
  const char* kind() const override { return "dist_conv"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return local_->params(); }
  double forward_flops(const Shape& in) const override;
  const Partition& out_partition() const { return out_; }
  uint64_t halo_bytes() const { return halo_->bytes_sent(); }

 private:
  Partition in_, out_;
  std::unique_ptr<HaloExchange> halo_;
  std::unique_ptr<Conv> local_;
};

// Transposed convolution (U-Net upsampling) on blocks: the local deconvolution crops its output to
// this rank's block (its padding), after taking the input halo the cropped outputs depend on.
class DistDeconv : public Layer {
 public:
  DistDeconv(std::string name, ConvOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
  const char* kind() const override { return "dist_deconv"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return local_->params(); }
  double forward_flops(const Shape& in) const override;
  const Partition& out_partition() const { return out_; }
  uint64_t halo_bytes() const { return halo_->bytes_sent(); }

 private:
  Partition in_, out_;
  std::unique_ptr<HaloExchange> halo_;
  std::unique_ptr<Deconv> local_;
};

class DistPool : public Layer {
 public:
  DistPool(std::string name, PoolOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
  const char* kind() const override { return "dist_pool"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  const Partition& out_partition() const { return out_; }
  uint64_t halo_bytes() const { return halo_->bytes_sent(); }

 private:
  Partition in_, out_;
  std::unique_ptr<HaloExchange> halo_;
  std::unique_ptr<Pool> local_;
};

// Sums BatchNorm's partial statistics over the spatial group.
BatchNorm::StatsReducer spatial_batchnorm_reducer(Communicator& spatial);

class Shuffle : public Layer {
 public:
  Shuffle(std::string name, const SpatialContext& ctx, std::array<int64_t, 3> extent);
  const char* kind() const override { return "shuffle"; }
  // (N, C, own...) -> (samples held, C, D, H, W).
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  // The local batch indices (of n) this rank holds after the shuffle.
  std::vector<int64_t> held(int64_t n) const;

 private:
  SpatialContext ctx_;
  Partition part_;
  Shape in_shape_;
};

}  // namespace tessera
