// HaloExchange: gives each rank of a spatial group the input block a layer needs (its own block
// plus halos from its neighbours), and sends halo gradients back to their owners.
//
// forward() exchanges faces one dimension at a time (D, then H, then W), each time over the block
// already extended in the earlier dimensions, so corners and edges propagate without diagonal
// messages. reverse() undoes it in the opposite order, summing every halo gradient into the block
// that owns those voxels. Tensors are (N, C, D, H, W), on the host or the GPU (faces are cut and
// placed there, and cross by NCCL or through pinned host buffers). Used by one thread; every member
// of the group calls the same sequence.
#pragma once

#include <array>

#include "worker/comm/communicator.h"
#include "worker/core/tensor.h"
#include "worker/spatial/partition.h"

namespace tessera {

// Copies (or adds) the box `extent` at offset `from` of src into dst at offset `to` (5-D, N and C
// included: offsets and extents have 5 entries, in logical (N, C, D, H, W) order). Both tensors have
// the same layout, plain or channels-last.
void copy_box(const Tensor& src, const std::array<int64_t, 5>& from, Tensor& dst, const std::array<int64_t, 5>& to,
              const std::array<int64_t, 5>& extent, bool add);

class HaloExchange;

// A layer that exchanges halos (so that the trainer can hand it the GPU's communicator).
class HaloLayer {
 public:
  virtual ~HaloLayer() = default;
  virtual HaloExchange& halo() = 0;
};

class HaloExchange {
 public:
  // `in`: the partition of the layer's input, `out` of its output, `window` the layer per dimension.
  HaloExchange(Communicator& comm, const Partition& in, const Partition& out, const std::array<Window, 3>& window);

  // Owned block (N, C, own...) -> needed block (N, C, need...).
  Tensor forward(const Tensor& owned);
  // Gradient of the needed block -> gradient of the owned block, halos summed into their owners.
  Tensor reverse(const Tensor& needed);

  const Need& need(int dim) const { return need_[dim]; }
  // Blocks on the GPU exchange their faces through `comm` (NCCL's spatial group, device pointers)
  // instead of staging them through the host for the group's Gloo communicator. Null: staged.
  void set_device_comm(Communicator* comm) { device_comm_ = comm; }
  // Bytes this rank sent in halo messages since construction.
  uint64_t bytes_sent() const { return bytes_; }

 private:
  // Along dim: the range the neighbour at `step` needs of the input.
  Range neighbor_need(int dim, int step) const;
  void exchange(const Tensor& send, int to, Tensor& recv, int from);
  // A pinned host buffer of at least `floats`, kept for the next message.
  float* staging(Tensor& buffer, size_t floats);

  Communicator& comm_;
  Communicator* device_comm_ = nullptr;
  Partition in_, out_;
  std::array<Window, 3> window_;
  std::array<Need, 3> need_;
  uint64_t bytes_ = 0;
  Tensor send_stage_, recv_stage_;  // faces of device blocks, on their way through the host
};

}  // namespace tessera
