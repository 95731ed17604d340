// Packing sparse gradients into (index, value) pairs (sparse_entry.h) and the scatter-add that
// turns gathered pairs back into a dense bucket. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/compress/sparse_entry.h"

namespace tessera {

// out[i] = {idx[i] + index_offset, values[idx[i]]}.
void pack_entries(std::span<const float> values, std::span<const uint32_t> idx, uint32_t index_offset,
                  std::span<SparseEntry> out);
// The same with each value rounded to bf16 (to nearest even).
void pack_entries(std::span<const float> values, std::span<const uint32_t> idx, uint32_t index_offset,
                  std::span<SparseEntryBf16> out);

// dense[e.index] += e.value for every entry, in order (so every rank adding the same entries in the
// same order gets bitwise the same result). An index past the end is an invariant failure.
void scatter_add(std::span<float> dense, std::span<const SparseEntry> entries);
void scatter_add(std::span<float> dense, std::span<const SparseEntryBf16> entries);

}  // namespace tessera
