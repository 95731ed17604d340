// Shared oneDNN plumbing for the CPU layers: one engine and stream per process, descriptors for
// Tensors in their layout (plain or channels-last), conversion between the two, and Converter, a
// cached reorder between a tensor and the layout a primitive chose (a no-op when they agree).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include "worker/core/tensor.h"

namespace tessera::dnnl_util {

dnnl::engine& engine();
dnnl::stream& stream();

dnnl::memory::dims dims_of(const Shape& s);
// The plain (row-major) layout for a tensor of rank 1..5.
dnnl::memory::format_tag plain_tag(size_t rank);
dnnl::memory::desc plain_desc(const Shape& s);
// The descriptor of a tensor of shape `s` stored in `layout`.
dnnl::memory::desc desc_of(const Shape& s, Layout layout);
// A memory object over the tensor's storage, in its own layout.
dnnl::memory memory_of(const Tensor& t);
// t itself when it is in `layout`, else a copy reordered into it.
Tensor to_layout(const Tensor& t, Layout layout);

// Moves data between a tensor (in its own layout) and a memory in a primitive's layout, caching the
// reorder and the buffer. Use one Converter per (tensor role, direction).
class Converter {
 public:
  // A memory in `want` holding t's values: t's own storage when the layouts agree, else the
  // converter's buffer after a reorder.
  dnnl::memory to(const dnnl::memory::desc& want, const Tensor& t);
  // A memory in `want` the primitive can write; copy it out with from() afterwards.
  dnnl::memory target(const dnnl::memory::desc& want, Tensor& t);
  // Copies `m` (in its own layout) into the tensor t (no-op when `m` is t's storage).
  void from(const dnnl::memory& m, Tensor& t);

 private:
  dnnl::memory buffer_;
  dnnl::memory::desc from_md_, to_md_;
  dnnl::reorder reorder_;
  dnnl::memory::desc back_src_md_, back_dst_md_;
  dnnl::reorder back_;
};

}  // namespace tessera::dnnl_util
