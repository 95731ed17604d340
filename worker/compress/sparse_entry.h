// The wire format of a sparse gradient entry: (index, value), 8 bytes. Kept apart from sparse.h so
// CUDA sources (C++17) can use it.
#pragma once

#include <cstdint>

namespace tessera {

struct SparseEntry {
  uint32_t index;  // position in the bucket
  float value;
};
static_assert(sizeof(SparseEntry) == 8, "SparseEntry is the wire format");

}  // namespace tessera
