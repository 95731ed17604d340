#include "worker/nn/dnnl_util.h"

#include "common/error.h"

namespace tessera::dnnl_util {

using dnnl::memory;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static thread_local dnnl::stream s(engine());
  return s;
}

memory::dims dims_of(const Shape& s) { return memory::dims(s.begin(), s.end()); }

memory::format_tag plain_tag(size_t rank) {
  switch (rank) {
    case 1: return memory::format_tag::a;
    case 2: return memory::format_tag::ab;
    case 3: return memory::format_tag::abc;
    case 4: return memory::format_tag::abcd;
    case 5: return memory::format_tag::abcde;
  }
  TESSERA_CHECK(false, "no plain oneDNN layout for rank ", rank);
}

memory::desc plain_desc(const Shape& s) {
  return memory::desc(dims_of(s), memory::data_type::f32, plain_tag(s.size()));
}

memory::desc desc_of(const Shape& s, Layout layout) {
  if (layout == Layout::kPlain) return plain_desc(s);
  using tag = memory::format_tag;
  switch (s.size()) {
    case 3: return memory::desc(dims_of(s), memory::data_type::f32, tag::acb);
    case 4: return memory::desc(dims_of(s), memory::data_type::f32, tag::acdb);
    case 5: return memory::desc(dims_of(s), memory::data_type::f32, tag::acdeb);
  }
  TESSERA_CHECK(false, "no channels-last oneDNN layout for ", shape_str(s));
}

memory memory_of(const Tensor& t) {
  return memory(desc_of(t.shape(), t.layout()), engine(), const_cast<float*>(t.data()));
}

Tensor to_layout(const Tensor& t, Layout layout) {
  if (t.layout() == layout || t.empty()) return t;
  Tensor out(t.shape(), layout);
  memory src = memory_of(t), dst = memory_of(out);
  dnnl::reorder(src, dst).execute(stream(), src, dst);  // oneDNN's primitive cache keeps the kernel
  stream().wait();
  return out;
}

memory Converter::to(const memory::desc& want, const Tensor& t) {
  memory own = memory_of(t);
  if (own.get_desc() == want) return own;
  if (!buffer_ || buffer_.get_desc() != want) buffer_ = memory(want, engine());
  if (!(from_md_ == own.get_desc()) || !(to_md_ == want)) {
    reorder_ = dnnl::reorder(own, buffer_);
    from_md_ = own.get_desc();
    to_md_ = want;
  }
  reorder_.execute(stream(), own, buffer_);
  stream().wait();
  return buffer_;
}

memory Converter::target(const memory::desc& want, Tensor& t) {
  memory own = memory_of(t);
  if (own.get_desc() == want) return own;
  if (!buffer_ || buffer_.get_desc() != want) buffer_ = memory(want, engine());
  return buffer_;
}

void Converter::from(const memory& m, Tensor& t) {
  memory own = memory_of(t);
  if (m.get_data_handle() == own.get_data_handle()) return;
  if (!(back_src_md_ == m.get_desc()) || !(back_dst_md_ == own.get_desc())) {
    back_ = dnnl::reorder(m, own);
    back_src_md_ = m.get_desc();
    back_dst_md_ = own.get_desc();
  }
  dnnl::memory src = m;  // a handle copy; execute() takes non-const handles
  back_.execute(stream(), src, own);
  stream().wait();
}

}  // namespace tessera::dnnl_util
