#include "worker/spatial/layers.h"

#include "worker/core/error.h"

namespace tessera {
namespace {

std::array<Window, 3> conv_windows(const ConvOptions& o) {
  std::array<Window, 3> w;
  for (int d = 0; d < 3; ++d) w[d] = {o.kernel, o.stride, pad_before(o, d), pad_after(o, d), false};
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

DistConv::DistConv(std::string name, ConvOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : Layer(name),
      in_(in_extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name),
      out_(output_partition(in_, conv_windows(o), "model.layers." + name)) {
  if (o.spatial_dims != 3) throw ConfigError("model.layers." + name, "spatial parallelism needs 3D convolutions");
  const auto windows = conv_windows(o);
  check_halos(in_, out_, windows, "model.layers." + name);
  halo_ = std::make_unique<HaloExchange>(*ctx.comm, in_, out_, windows);
  ConvOptions local = o;
  local.pad_l.resize(3);
  local.pad_r.resize(3);
  for (int d = 0; d < 3; ++d) {
    local.pad_l[d] = halo_->need(d).pad_before;
    local.pad_r[d] = halo_->need(d).pad_after;
  }
  local_ = std::make_unique<Conv>(name, local);  // same seed and shapes: the same weights as one rank
}

Shape DistConv::output_shape(const Shape& in) const {
  if (in.size() != 5 || in[2] != in_.owned(0).size() || in[3] != in_.owned(1).size() || in[4] != in_.owned(2).size())
    shape_error(detail::concat("expects this rank's block ", shape_str(block_shape(in.size() ? in[0] : 0, 0, in_)),
                               " (channels aside), got ", shape_str(in)));
  return block_shape(in[0], local_->options().out_channels, out_);
}

Tensor DistConv::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  return local_->forward(halo_->forward(x), training);
}

Tensor DistConv::backward(const Tensor& dy) {
  local_->set_input_grad(input_grad());
  Tensor dx = local_->backward(dy);
  return input_grad() ? halo_->reverse(dx) : dx;
}

double DistConv::forward_flops(const Shape& in) const {
  Shape ext = in;
  for (int d = 0; d < 3; ++d) ext[2 + d] = halo_->need(d).input.size();
  return local_->forward_flops(ext);
}

namespace {
std::array<Window, 3> deconv_windows(const ConvOptions& o) {
  std::array<Window, 3> w;
  for (int d = 0; d < 3; ++d) w[d] = {o.kernel, o.stride, pad_before(o, d), pad_after(o, d), true};
  return w;
}
}  // namespace

DistDeconv::DistDeconv(std::string name, ConvOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : Layer(name),
      in_(in_extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name),
      out_(output_partition(in_, deconv_windows(o), "model.layers." + name)) {
  if (o.spatial_dims != 3) throw ConfigError("model.layers." + name, "spatial parallelism needs 3D deconvolutions");
  const auto windows = deconv_windows(o);
  check_halos(in_, out_, windows, "model.layers." + name);
  halo_ = std::make_unique<HaloExchange>(*ctx.comm, in_, out_, windows);
  ConvOptions local = o;
  local.pad_l.resize(3);
  local.pad_r.resize(3);
  for (int d = 0; d < 3; ++d) {
    local.pad_l[d] = halo_->need(d).pad_before;
    local.pad_r[d] = halo_->need(d).pad_after;
    if (local.pad_l[d] < 0 || local.pad_r[d] < 0)
      throw ConfigError("model.layers." + name, "this split cannot crop the transposed convolution's output");
  }
  local_ = std::make_unique<Deconv>(name, local);
}

Shape DistDeconv::output_shape(const Shape& in) const {
  if (in.size() != 5 || in[2] != in_.owned(0).size() || in[3] != in_.owned(1).size() || in[4] != in_.owned(2).size())
    shape_error("expects this rank's block, got " + shape_str(in));
  return block_shape(in[0], local_->options().out_channels, out_);
}

Tensor DistDeconv::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  return local_->forward(halo_->forward(x), training);
}

Tensor DistDeconv::backward(const Tensor& dy) {
  local_->set_input_grad(input_grad());
  Tensor dx = local_->backward(dy);
  return input_grad() ? halo_->reverse(dx) : dx;
}

double DistDeconv::forward_flops(const Shape& in) const {
  Shape ext = in;
  for (int d = 0; d < 3; ++d) ext[2 + d] = halo_->need(d).input.size();
  return local_->forward_flops(ext);
}

DistPool::DistPool(std::string name, PoolOptions o, const SpatialContext& ctx, std::array<int64_t, 3> in_extent)
    : Layer(name),
      in_(in_extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name),
      out_(output_partition(in_, pool_windows(o), "model.layers." + name)) {
  if (o.spatial_dims != 3) throw ConfigError("model.layers." + name, "spatial parallelism needs 3D pooling");
  const auto windows = pool_windows(o);
  check_halos(in_, out_, windows, "model.layers." + name);
  halo_ = std::make_unique<HaloExchange>(*ctx.comm, in_, out_, windows);
  PoolOptions local = o;
  local.pad_l.resize(3);
  local.pad_r.resize(3);
  for (int d = 0; d < 3; ++d) {
    local.pad_l[d] = halo_->need(d).pad_before;
    local.pad_r[d] = halo_->need(d).pad_after;
  }
  local_ = std::make_unique<Pool>(name, local);
}

Shape DistPool::output_shape(const Shape& in) const {
  if (in.size() != 5 || in[2] != in_.owned(0).size() || in[3] != in_.owned(1).size() || in[4] != in_.owned(2).size())
    shape_error("expects this rank's block, got " + shape_str(in));
  return block_shape(in[0], in[1], out_);
}

Tensor DistPool::forward(const Tensor& x, bool training) {
  output_shape(x.shape());
  return local_->forward(halo_->forward(x), training);
}

Tensor DistPool::backward(const Tensor& dy) { return halo_->reverse(local_->backward(dy)); }

BatchNorm::StatsReducer spatial_batchnorm_reducer(Communicator& spatial) {
  return [&spatial](std::span<double> stats) { spatial.allreduce(stats); };
}

Shuffle::Shuffle(std::string name, const SpatialContext& ctx, std::array<int64_t, 3> extent)
    : Layer(name), ctx_(ctx), part_(extent, ctx.grid, (check_context(ctx, name), ctx.comm->rank()), "model.layers." + name) {}

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

// Every rank's block, gathered, assembled into full maps; this rank keeps its samples.
Tensor Shuffle::forward(const Tensor& x, bool) {
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
  for (size_t i = 0; i < mine.size(); ++i) std::copy(full.data() + mine[i] * per, full.data() + (mine[i] + 1) * per, y.data() + i * per);
  return y;
}

// Every rank's sample gradients, gathered into the full batch; this rank keeps its block.
Tensor Shuffle::backward(const Tensor& dy) {
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
    for (int64_t i = r; i < n; i += S, off += per) std::copy(all.begin() + off, all.begin() + off + per, full.data() + i * per);
  Tensor dx(in_shape_);
  copy_box(full, {0, 0, part_.owned(0).begin, part_.owned(1).begin, part_.owned(2).begin}, dx, {0, 0, 0, 0, 0},
           {in_shape_[0], in_shape_[1], in_shape_[2], in_shape_[3], in_shape_[4]}, false);
  return dx;
}

}  // namespace tessera
