// GPU top-k selection and scatter-add (built when CUDA is found; TESSERA_HAVE_CUDA).
//
// mstopk_cuda selects exactly k entries of largest magnitude by radix selection on the magnitude's
// bit pattern: three histogram passes (11, 11 and 9 bits) find the k-th magnitude, one gather pass
// writes the entries above it and fills the rest from the entries equal to it. Every pass is a
// streaming read, no sort. Non-finite input throws NumericError naming the bucket.
// scatter_add_cuda adds gathered chunks one after the other; entries within a chunk have distinct
// indices, so no atomics are needed and every rank computes bitwise the same sum.
// Functions are synchronous with respect to `stream` on return (they read counts back to the host).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/compress/sparse_entry.h"

namespace tessera::cuda {

// d_idx[k], d_val[k] := the k entries of largest |d_x[i]| (device pointers). Requires k <= d.
void mstopk(const float* d_x, size_t d, size_t k, uint32_t* d_idx, float* d_val, const std::string& bucket,
            void* stream = nullptr);

// d_dense[e.index] += e.value for `chunks` consecutive chunks of `chunk_len` entries (device pointers).
void scatter_add(float* d_dense, size_t n, const SparseEntry* d_entries, size_t chunk_len, int chunks,
                 void* stream = nullptr);

// d_out[i] = {d_idx[i] + offset, d_val[i]} for i < k: the selected entries in the wire format, with
// their indices made bucket-global.
void pack_entries(const uint32_t* d_idx, const float* d_val, size_t k, uint32_t offset, SparseEntry* d_out,
                  void* stream = nullptr);
// d_x[d_idx[i]] = 0 for i < k (error feedback: what was sent leaves the residual).
void zero_at(float* d_x, const uint32_t* d_idx, size_t k, void* stream = nullptr);

}  // namespace tessera::cuda
