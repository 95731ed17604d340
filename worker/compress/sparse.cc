#include "worker/compress/sparse.h"

#include "common/error.h"
#include "worker/nn/kernels.h"

namespace tessera {

void pack_entries(std::span<const float> values, std::span<const uint32_t> idx, uint32_t index_offset,
                  std::span<SparseEntry> out) {
  TESSERA_CHECK_EQ(idx.size(), out.size());
  for (size_t i = 0; i < idx.size(); ++i) out[i] = SparseEntry{idx[i] + index_offset, values[idx[i]]};
}

void pack_entries(std::span<const float> values, std::span<const uint32_t> idx, uint32_t index_offset,
                  std::span<SparseEntryBf16> out) {
  TESSERA_CHECK_EQ(idx.size(), out.size());
  for (size_t i = 0; i < idx.size(); ++i)
    out[i] = SparseEntryBf16{idx[i] + index_offset, kernels::bf16_bits(values[idx[i]])};
}

void scatter_add(std::span<float> dense, std::span<const SparseEntry> entries) {
  const size_t n = dense.size();
  for (const SparseEntry& e : entries) {
    TESSERA_CHECK_LT(e.index, n, "sparse entry outside its bucket");
    dense[e.index] += e.value;
  }
}

void scatter_add(std::span<float> dense, std::span<const SparseEntryBf16> entries) {
  const size_t n = dense.size();
  for (const SparseEntryBf16& e : entries) {
    const uint32_t index = e.index;
    TESSERA_CHECK_LT(index, n, "sparse entry outside its bucket");
    dense[index] += kernels::bf16_value(e.value);
  }
}

}  // namespace tessera
