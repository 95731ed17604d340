#include "worker/spatial/layers.h"

#include "common/error.h"

namespace tessera {
namespace {

std::array<Window, 3> conv_windows(const ConvOptions& o) {
  std::array<Window, 3> w;
  for (int d = 0; d < 3; ++d) w[d] = {o.kernel, o.stride, pad_before(o, d), pad_after(o, d), false};
  return w;
}

std::array<Window, 3> deconv_windows(const ConvOptions& o) {
  std::array<Window, 3> w;
  for (int d = 0; d < 3; ++d) w[d] = {o.kernel, o.stride, pad_before(o, d), pad_after(o, d), true};
  return w;
}

std::array<Window, 3> pool_windows(const PoolOptions& o) {
  std::array<Window, 3> w;
  for (int d = 0; d < 3; ++d) w[d] = {o.kernel, o.stride, o.padding, o.padding, false};
  return w;
}

Shape block_shape(int64_t n, int64_t c, const Partition& p) {
  return {n, c, p.owned(0).size(), p.owned(1).size(), p.owned(2).size()};
}

void check_context(const SpatialContext& ctx, const std::string& name) {
  TESSERA_CHECK(ctx.comm != nullptr && ctx.comm->size() == ctx.grid.size(), "layer ", name, ": spatial group of ",
                ctx.comm ? ctx.comm->size() : 0, " ranks for a grid of ", ctx.grid.size());
}

}  // namespace

template <class Local, class Options>
DistWindowLayer<Local, Options>::DistWindowLayer(std::string name, const char* kind, Options o,
                                                 const SpatialContext& ctx, std::array<int64_t, 3> in_extent,
                                                 const std::array<Window, 3>& window)
    : Layer(name),
      kind_(kind),
      in_(in_extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name),
      out_(output_partition(in_, window, "model.layers." + name)) {
  if (o.spatial_dims != 3)
    throw ConfigError("model.layers." + name, std::string(kind) + ": spatial parallelism needs 3D layers");
  check_halos(in_, out_, window, "model.layers." + name);
  halo_ = std::make_unique<HaloExchange>(*ctx.comm, in_, out_, window);
  o.pad_l.resize(3);
  o.pad_r.resize(3);
  for (int d = 0; d < 3; ++d) {
    o.pad_l[d] = halo_->need(d).pad_before;
    o.pad_r[d] = halo_->need(d).pad_after;
    if (o.pad_l[d] < 0 || o.pad_r[d] < 0)
      throw ConfigError("model.layers." + name, std::string(kind) + ": this split cannot be computed block by block");
  }
  local_ = std::make_unique<Local>(name, o);  // same seed and shapes: the same weights as one rank
}

template <class Local, class Options>
Shape DistWindowLayer<Local, Options>::extended(const Shape& block) const {
  Shape ext = block;
  for (int d = 0; d < 3; ++d) ext[2 + d] = halo_->need(d).input.size();
  return ext;
}

template <class Local, class Options>
Shape DistWindowLayer<Local, Options>::output_shape(const Shape& in) const {
  if (in.size() != 5 || in[2] != in_.owned(0).size() || in[3] != in_.owned(1).size() || in[4] != in_.owned(2).size())
    shape_error(detail::concat("expects this rank's block (N, C, ", in_.owned(0).size(), ", ", in_.owned(1).size(),
                               ", ", in_.owned(2).size(), "), got ", shape_str(in)));
  return local_->output_shape(extended(in));
}

template <class Local, class Options>
Tensor DistWindowLayer<Local, Options>::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  return local_->forward(halo_->forward(x), training);
}

template <class Local, class Options>
Tensor DistWindowLayer<Local, Options>::backward(const Tensor& dy) {
  local_->set_input_grad(input_grad());
  Tensor dx = local_->backward(dy);
  return input_grad() ? halo_->reverse(dx) : dx;
}

template class DistWindowLayer<Conv, ConvOptions>;
template class DistWindowLayer<Deconv, ConvOptions>;
template class DistWindowLayer<Pool, PoolOptions>;

DistConv::DistConv(std::string name, ConvOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : DistWindowLayer(std::move(name), "dist_conv", o, ctx, in_extent, conv_windows(o)) {}

DistDeconv::DistDeconv(std::string name, ConvOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : DistWindowLayer(std::move(name), "dist_deconv", o, ctx, in_extent, deconv_windows(o)) {}

DistPool::DistPool(std::string name, PoolOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : DistWindowLayer(std::move(name), "dist_pool", o, ctx, in_extent, pool_windows(o)) {}

BatchNorm::StatsReducer spatial_batchnorm_reducer(Communicator& spatial) {
  return [&spatial](std::span<double> stats) { spatial.allreduce(stats); };
}

Shuffle::Shuffle(std::string name, const SpatialContext& ctx, std::array<int64_t, 3> extent)
    : Layer(name),
      ctx_(ctx),
      part_(extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name) {}

std::vector<int64_t> Shuffle::held(int64_t n) const {
  std::vector<int64_t> out;
  for (int64_t i = part_.rank(); i < n; i += ctx_.grid.size()) out.push_back(i);
  return out;
}

Shape Shuffle::output_shape(const Shape& in) const {
  if (in.size() != 5) shape_error("expects (N, C, D, H, W) blocks, got " + shape_str(in));
  const auto& e = part_.extent();
  return {static_cast<int64_t>(held(in[0]).size()), in[1], e[0], e[1], e[2]};
}

// Every rank's block, gathered, assembled into full maps; this rank keeps its samples. On the GPU
// the (small: the maps at the end of the convolutions) blocks cross through the host.
Tensor Shuffle::forward(const Tensor& x, bool training) {
  if (x.on_device()) return forward(x.to(Device::kCpu), training).to(Device::kCuda);
  in_shape_ = x.shape();
  const int S = ctx_.grid.size();
  const int64_t n = x.dim(0), c = x.dim(1);
  std::vector<size_t> counts(S);
  for (int r = 0; r < S; ++r) {
    Partition p(part_.extent(), ctx_.grid, r, name());
    counts[r] = static_cast<size_t>(shape_numel(block_shape(n, c, p)));
  }
  size_t total = 0;
  for (size_t v : counts) total += v;
  std::vector<float> all(total);
  ctx_.comm->allgatherv(x.data(), all.data(), counts, DType::kFloat32, Millis(0));
  const auto& e = part_.extent();
  Tensor full({n, c, e[0], e[1], e[2]});
  size_t off = 0;
  for (int r = 0; r < S; ++r) {
    Partition p(part_.extent(), ctx_.grid, r, name());
    Shape bs = block_shape(n, c, p);
    Tensor blk(bs);
    std::copy(all.begin() + off, all.begin() + off + counts[r], blk.data());
    off += counts[r];
    copy_box(blk, {0, 0, 0, 0, 0}, full, {0, 0, p.owned(0).begin, p.owned(1).begin, p.owned(2).begin},
             {bs[0], bs[1], bs[2], bs[3], bs[4]}, false);
  }
  const auto mine = held(n);
  Tensor y({static_cast<int64_t>(mine.size()), c, e[0], e[1], e[2]});
  const int64_t per = c * e[0] * e[1] * e[2];
  for (size_t i = 0; i < mine.size(); ++i)
    std::copy(full.data() + mine[i] * per, full.data() + (mine[i] + 1) * per, y.data() + i * per);
  return y;
}

// Every rank's sample gradients, gathered into the full batch; this rank keeps its block.
Tensor Shuffle::backward(const Tensor& dy) {
  if (dy.on_device()) return backward(dy.to(Device::kCpu)).to(Device::kCuda);
  const int S = ctx_.grid.size();
  const int64_t n = in_shape_[0], c = in_shape_[1];
  const auto& e = part_.extent();
  const int64_t per = c * e[0] * e[1] * e[2];
  std::vector<size_t> counts(S);
  for (int r = 0; r < S; ++r) {
    int64_t held_r = 0;
    for (int64_t i = r; i < n; i += S) ++held_r;
    counts[r] = static_cast<size_t>(held_r * per);
  }
  size_t total = 0;
  for (size_t v : counts) total += v;
  std::vector<float> all(total);
  ctx_.comm->allgatherv(dy.data(), all.data(), counts, DType::kFloat32, Millis(0));
  Tensor full({n, c, e[0], e[1], e[2]});
  size_t off = 0;
  for (int r = 0; r < S; ++r)
    for (int64_t i = r; i < n; i += S, off += per)
      std::copy(all.begin() + off, all.begin() + off + per, full.data() + i * per);
  Tensor dx(in_shape_);
  copy_box(full, {0, 0, part_.owned(0).begin, part_.owned(1).begin, part_.owned(2).begin}, dx, {0, 0, 0, 0, 0},
           {in_shape_[0], in_shape_[1], in_shape_[2], in_shape_[3], in_shape_[4]}, false);
  return dx;
}

}  // namespace tessera
