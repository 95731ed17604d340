// The wire formats of a sparse gradient entry: (index, value), 8 bytes, or 6 with a bf16 value. Kept apart from
// sparse.h so CUDA sources (C++17) can use it.
#pragma once

#include <cstdint>

namespace tessera {

struct SparseEntry {
  uint32_t index;  // position in the bucket
  float value;
};
static_assert(sizeof(SparseEntry) == 8, "SparseEntry is the wire format");

// The same entry with its value in bf16 (communication.gradientPrecision bf16): 6 bytes, packed.
#pragma pack(push, 1)
struct SparseEntryBf16 {
  uint32_t index;
  uint16_t value;  // bf16 bits (kernels::bf16_bits)
};
#pragma pack(pop)
static_assert(sizeof(SparseEntryBf16) == 6, "SparseEntryBf16 is the wire format");

}  // namespace tessera
