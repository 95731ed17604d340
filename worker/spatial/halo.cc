#include "worker/spatial/halo.h"

#include <cstring>

#include "common/error.h"
#include "worker/nn/gpu/ops.h"

namespace tessera {

void copy_box(const Tensor& src, const std::array<int64_t, 5>& from, Tensor& dst, const std::array<int64_t, 5>& to,
              const std::array<int64_t, 5>& extent, bool add) {
  for (int i = 0; i < 5; ++i)
    if (extent[i] <= 0) return;
  TESSERA_CHECK(src.layout() == dst.layout(), "copy_box between layouts: ", shape_str(src.shape()), " and ",
                shape_str(dst.shape()));
  TESSERA_CHECK(src.device() == dst.device(), "copy_box between devices: ", shape_str(src.shape()), " and ",
                shape_str(dst.shape()));
  const Shape& ss = src.shape();
  const Shape& ds = dst.shape();
  if (src.on_device()) {  // plain, as every activation on the device
    gpu::copy_box(src.data(), {ss[0], ss[1], ss[2], ss[3], ss[4]}, from, dst.data(),
                  {ds[0], ds[1], ds[2], ds[3], ds[4]}, to, extent, add);
    return;
  }
  // A run of `len` contiguous floats.
  auto run = [add](const float* s, float* o, int64_t len) {
    if (add) {
      for (int64_t i = 0; i < len; ++i) o[i] += s[i];
    } else {
      std::memcpy(o, s, len * sizeof(float));
    }
  };
  if (!src.channels_last()) {  // (N, C, D, H, W): runs along W
    for (int64_t n = 0; n < extent[0]; ++n)
      for (int64_t c = 0; c < extent[1]; ++c)
        for (int64_t d = 0; d < extent[2]; ++d)
          for (int64_t h = 0; h < extent[3]; ++h)
            run(src.data() +
                    ((((from[0] + n) * ss[1] + from[1] + c) * ss[2] + from[2] + d) * ss[3] + from[3] + h) * ss[4] +
                    from[4],
                dst.data() + ((((to[0] + n) * ds[1] + to[1] + c) * ds[2] + to[2] + d) * ds[3] + to[3] + h) * ds[4] +
                    to[4],
                extent[4]);
    return;
  }
  // (N, D, H, W, C): runs along C, or along W x C where every channel is copied.
  const bool whole_channels = extent[1] == ss[1] && extent[1] == ds[1];
  for (int64_t n = 0; n < extent[0]; ++n)
    for (int64_t d = 0; d < extent[2]; ++d)
      for (int64_t h = 0; h < extent[3]; ++h) {
        const float* s = src.data() +
                         ((((from[0] + n) * ss[2] + from[2] + d) * ss[3] + from[3] + h) * ss[4] + from[4]) * ss[1] +
                         from[1];
        float* o =
            dst.data() + ((((to[0] + n) * ds[2] + to[2] + d) * ds[3] + to[3] + h) * ds[4] + to[4]) * ds[1] + to[1];
        if (whole_channels) {
          run(s, o, extent[4] * extent[1]);
        } else {
          for (int64_t w = 0; w < extent[4]; ++w) run(s + w * ss[1], o + w * ds[1], extent[1]);
        }
      }
}

HaloExchange::HaloExchange(Communicator& comm, const Partition& in, const Partition& out,
                           const std::array<Window, 3>& window)
    : comm_(comm), in_(in), out_(out), window_(window) {
  for (int d = 0; d < 3; ++d) need_[d] = needed_input(out_.owned(d), in_.extent()[d], window_[d]);
}

Range HaloExchange::neighbor_need(int dim, int step) const {
  return needed_input(out_.owned_by(dim, in_.coord(dim) + step), in_.extent()[dim], window_[dim]).input;
}

float* HaloExchange::staging(Tensor& buffer, size_t floats) {
  if (static_cast<size_t>(buffer.numel()) < floats) buffer = Tensor::pinned({static_cast<int64_t>(floats)});
  return buffer.data();
}

void HaloExchange::exchange(const Tensor& send, int to, Tensor& recv, int from) {
  const size_t sb = to >= 0 ? send.numel() * sizeof(float) : 0;
  const size_t rb = from >= 0 ? recv.numel() * sizeof(float) : 0;
  if (!sb && !rb) return;
  const bool on_device = (sb && send.on_device()) || (rb && recv.on_device());
  if (on_device && device_comm_) {  // NCCL, between the GPUs' memories
    if (sb && rb) {
      device_comm_->sendrecv(send.data(), sb, to, recv.data(), rb, from, 11, Millis(0));
    } else if (sb) {
      device_comm_->send(send.data(), sb, to, 11, Millis(0));
    } else {
      device_comm_->recv(recv.data(), rb, from, 11, Millis(0));
    }
    bytes_ += sb;
    return;
  }
  // Faces on the GPU otherwise cross through pinned host buffers (the group's communicator is Gloo's).
  const float* out = send.data();
  float* in = recv.data();
  if (on_device) {
    if (sb) {
      float* stage = staging(send_stage_, send.numel());
      gpu::copy(stage, Device::kCpu, send.data(), Device::kCuda, sb);  // returns when the bytes are there
      out = stage;
    }
    if (rb) in = staging(recv_stage_, recv.numel());
  }
  if (sb && rb) {
    comm_.sendrecv(out, sb, to, in, rb, from, 11, Millis(0));
  } else if (sb) {
    comm_.send(out, sb, to, 11, Millis(0));
  } else {
    comm_.recv(in, rb, from, 11, Millis(0));
  }
  if (on_device && rb) {
    gpu::copy(recv.data(), Device::kCuda, in, Device::kCpu, rb);
    gpu::synchronize();  // the staging buffer is reused by the next message
  }
  bytes_ += sb;
}

Tensor HaloExchange::forward(const Tensor& owned) {
  TESSERA_CHECK(owned.rank() == 5, "halo exchange of ", shape_str(owned.shape()));
  Tensor block = owned;
  std::array<Range, 3> cur = {in_.owned(0), in_.owned(1), in_.owned(2)};
  for (int d = 0; d < 3; ++d) {
    TESSERA_CHECK_EQ(block.dim(2 + d), cur[d].size(), "block extent along dimension ", d);
    const Range own = in_.owned(d), need = need_[d].input;
    if (in_.grid()[d] == 1 && need == own) continue;  // nothing to exchange or crop along d
    Shape s = block.shape();
    s[2 + d] = need.size();
    Tensor next(s, block.layout(), block.device());
    std::array<int64_t, 5> ext = {s[0], s[1], s[2], s[3], s[4]}, zero = {0, 0, 0, 0, 0};
    // My own part of what I need.
    auto slab = [&](int64_t begin_in_block, int64_t len) {
      std::array<int64_t, 5> off = zero, e = ext;
      off[2 + d] = begin_in_block;
      e[2 + d] = len;
      return std::make_pair(off, e);
    };
    {
      const int64_t b = std::max(need.begin, own.begin), e = std::min(need.end, own.end);
      auto [from, len] = slab(b - own.begin, e - b);
      auto [to, unused] = slab(b - need.begin, 0);
      (void)unused;
      copy_box(block, from, next, to, len, false);
    }
    const int left = in_.neighbor(d, -1), right = in_.neighbor(d, +1);
    // Phase 1: to the right neighbour the part of my block it needs; from the left my left halo.
    // Phase 2: the mirror image.
    for (int phase = 0; phase < 2; ++phase) {
      const int to = phase == 0 ? right : left, from = phase == 0 ? left : right;
      Tensor out_buf, in_buf;
      if (to >= 0) {
        const Range theirs = neighbor_need(d, phase == 0 ? +1 : -1);
        const int64_t b = phase == 0 ? std::max(own.begin, theirs.begin) : own.begin;
        const int64_t e = phase == 0 ? own.end : std::min(own.end, theirs.end);
        Shape bs = block.shape();
        bs[2 + d] = std::max<int64_t>(0, e - b);
        out_buf = Tensor(bs, block.layout(), block.device());
        if (e > b) {
          auto [from_off, len] = slab(b - own.begin, e - b);
          copy_box(block, from_off, out_buf, zero, len, false);
        }
      }
      int64_t rb = 0, re = 0;
      if (from >= 0) {
        rb = phase == 0 ? need.begin : own.end;
        re = phase == 0 ? std::min(own.begin, need.end) : need.end;
        if (phase == 0) re = std::max(rb, re);
        if (phase == 1) rb = std::min(rb, re);
        Shape bs = s;
        bs[2 + d] = std::max<int64_t>(0, re - rb);
        in_buf = Tensor(bs, block.layout(), block.device());
      }
      exchange(out_buf, out_buf.numel() ? to : -1, in_buf, in_buf.numel() ? from : -1);
      if (in_buf.numel()) {
        auto [to_off, unused] = slab(rb - need.begin, 0);
        (void)unused;
        std::array<int64_t, 5> len = {s[0], s[1], s[2], s[3], s[4]};
        len[2 + d] = re - rb;
        copy_box(in_buf, zero, next, to_off, len, false);
      }
    }
    block = next;
    cur[d] = need;
  }
  return block;
}

Tensor HaloExchange::reverse(const Tensor& needed) {
  Tensor block = needed;
  for (int d = 2; d >= 0; --d) {
    const Range own = in_.owned(d), need = need_[d].input;
    if (in_.grid()[d] == 1 && need == own) continue;
    TESSERA_CHECK_EQ(block.dim(2 + d), need.size(), "gradient extent along dimension ", d);
    Shape s = block.shape();
    s[2 + d] = own.size();
    Tensor next(s, block.layout(), block.device());
    next.zero();
    std::array<int64_t, 5> zero = {0, 0, 0, 0, 0};
    auto box = [&](const Shape& shape, int64_t begin, int64_t len) {
      std::array<int64_t, 5> off = zero, e = {shape[0], shape[1], shape[2], shape[3], shape[4]};
      off[2 + d] = begin;
      e[2 + d] = len;
      return std::make_pair(off, e);
    };
    {
      const int64_t b = std::max(need.begin, own.begin), e = std::min(need.end, own.end);
      if (e > b) {
        auto [from, len] = box(block.shape(), b - need.begin, e - b);
        auto [to, unused] = box(s, b - own.begin, 0);
        (void)unused;
        copy_box(block, from, next, to, len, true);
      }
    }
    const int left = in_.neighbor(d, -1), right = in_.neighbor(d, +1);
    // Phase 1: my left halo's gradient goes back to the left neighbour; from the right neighbour
    // comes the gradient of the part of my block it used as its left halo. Phase 2: the mirror.
    for (int phase = 0; phase < 2; ++phase) {
      const int to = phase == 0 ? left : right, from = phase == 0 ? right : left;
      Tensor out_buf, in_buf;
      if (to >= 0) {
        const int64_t b = phase == 0 ? need.begin : std::max(own.end, need.begin);
        const int64_t e = phase == 0 ? std::min(own.begin, need.end) : need.end;
        if (e > b) {
          auto [from_off, len] = box(block.shape(), b - need.begin, e - b);
          Shape bs = block.shape();
          bs[2 + d] = e - b;
          out_buf = Tensor(bs, block.layout(), block.device());
          copy_box(block, from_off, out_buf, zero, len, false);
        }
      }
      int64_t rb = 0, re = 0;
      if (from >= 0) {
        const Range theirs = neighbor_need(d, phase == 0 ? +1 : -1);
        rb = phase == 0 ? std::max(own.begin, theirs.begin) : own.begin;
        re = phase == 0 ? own.end : std::min(own.end, theirs.end);
        if (re > rb) {
          Shape bs = s;
          bs[2 + d] = re - rb;
          in_buf = Tensor(bs, block.layout(), block.device());
        }
      }
      exchange(out_buf, out_buf.numel() ? to : -1, in_buf, in_buf.numel() ? from : -1);
      if (in_buf.numel()) {
        auto [to_off, len] = box(s, rb - own.begin, re - rb);
        copy_box(in_buf, zero, next, to_off, len, true);
      }
    }
    block = next;
  }
  return block;
}

}  // namespace tessera
