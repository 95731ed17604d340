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

// A window layer (convolution, transposed convolution, pooling) on blocks: exchange the input halo
// the block's outputs depend on, run the single-rank layer on the extended block with padding only
// at the volume's edges (for a transposed convolution the "padding" crops its output to the block),
// and in backward return the halo gradients to their owners.
template <class Local, class Options>
class DistWindowLayer : public Layer, public HaloLayer {
 public:
  // `in_extent`: the global (D, H, W) of the input; `window`: the layer along each dimension.
  DistWindowLayer(std::string name, const char* kind, Options options, const SpatialContext& ctx,
                  std::array<int64_t, 3> in_extent, const std::array<Window, 3>& window);
  const char* kind() const override { return kind_; }
  // The single-rank layer's: halos are exchanged in either layout, so the block reaches it as it is.
  Layouts layouts() const override { return local_->layouts(); }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return local_->params(); }
  void set_precision(Precision p) override {
    Layer::set_precision(p);
    local_->set_precision(p);
  }
  double forward_flops(const Shape& in) const override { return local_->forward_flops(extended(in)); }
  const Partition& out_partition() const { return out_; }
  uint64_t halo_bytes() const { return halo_->bytes_sent(); }
  HaloExchange& halo() override { return *halo_; }

 private:
  Shape extended(const Shape& block) const;  // the block's shape with its halos
  const char* kind_;
  Partition in_, out_;
  std::unique_ptr<HaloExchange> halo_;
  std::unique_ptr<Local> local_;
};

class DistConv : public DistWindowLayer<Conv, ConvOptions> {
 public:
  DistConv(std::string name, ConvOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
};

// Transposed convolution (U-Net upsampling).
class DistDeconv : public DistWindowLayer<Deconv, ConvOptions> {
 public:
  DistDeconv(std::string name, ConvOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
};

class DistPool : public DistWindowLayer<Pool, PoolOptions> {
 public:
  DistPool(std::string name, PoolOptions options, const SpatialContext& ctx, std::array<int64_t, 3> in_extent);
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
