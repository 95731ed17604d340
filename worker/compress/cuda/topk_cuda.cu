#include "worker/compress/cuda/topk_cuda.h"

#include <cuda_runtime.h>

#include <vector>

#include "common/error.h"

namespace tessera::cuda {
namespace {

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kNonFinite = 0x7f800000u;
constexpr int kBins = 2048;  // 11 bits per pass

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

// Histogram of bits [shift, shift+width) of |x| over entries whose higher bits equal `prefix`.
__global__ void radix_histogram(const float* __restrict x, size_t d, int shift, int width, uint32_t prefix,
                                unsigned long long* __restrict hist) {
  __shared__ unsigned int local[kBins];
  for (int i = threadIdx.x; i < kBins; i += blockDim.x) local[i] = 0;
  __syncthreads();
  const uint32_t mask = (1u << width) - 1;
  const int high = shift + width;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < d; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t u = __float_as_uint(x[i]) & kAbsMask;
    if (high >= 31 || (u >> high) == prefix) atomicAdd(&local[(u >> shift) & mask], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += blockDim.x)
    if (local[i]) atomicAdd(&hist[i], (unsigned long long)local[i]);
}

// Entries above `t` go to the output directly; entries equal to `t` fill slots [above, k).
__global__ void gather_topk(const float* __restrict x, size_t d, uint32_t t, size_t above, size_t k,
                            uint32_t* __restrict idx, float* __restrict val, unsigned long long* counters) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < d; i += (size_t)gridDim.x * blockDim.x) {
    float v = x[i];
    uint32_t u = __float_as_uint(v) & kAbsMask;
    if (u > t) {
      unsigned long long p = atomicAdd(&counters[0], 1ull);
      idx[p] = (uint32_t)i;
      val[p] = v;
    } else if (u == t) {
      unsigned long long p = above + atomicAdd(&counters[1], 1ull);
      if (p < k) {
        idx[p] = (uint32_t)i;
        val[p] = v;
      }
    }
  }
}

__global__ void scatter_chunk(float* __restrict dense, size_t n, const SparseEntry* __restrict e, size_t len) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t j = e[i].index;
    if (j < n) dense[j] += e[i].value;
  }
}

__global__ void pack_kernel(const uint32_t* __restrict idx, const float* __restrict val, size_t k, uint32_t offset,
                            SparseEntry* __restrict out) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < k; i += (size_t)gridDim.x * blockDim.x)
    out[i] = SparseEntry{idx[i] + offset, val[i]};
}

__global__ void zero_kernel(float* __restrict x, const uint32_t* __restrict idx, size_t k) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < k; i += (size_t)gridDim.x * blockDim.x)
    x[idx[i]] = 0.0f;
}

int grid_for(size_t n) {
  size_t blocks = (n + 255) / 256;
  return (int)(blocks < 1024 ? (blocks ? blocks : 1) : 1024);
}

}  // namespace

void mstopk(const float* d_x, size_t d, size_t k, uint32_t* d_idx, float* d_val, const std::string& bucket,
            void* stream_ptr) {
  if (k > d) throw std::invalid_argument(detail::concat("top-k on bucket '", bucket, "': k=", k, " exceeds ", d));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  unsigned long long* dev = nullptr;  // kBins histogram + 2 counters
  check(cudaMallocAsync(&dev, (kBins + 2) * sizeof(unsigned long long), stream), "alloc");
  std::vector<unsigned long long> hist(kBins);
  const int shifts[3] = {20, 9, 0}, widths[3] = {11, 11, 9};
  uint32_t prefix = 0;
  size_t remaining = k, above = 0;
  try {
    for (int pass = 0; pass < 3 && k > 0; ++pass) {
      check(cudaMemsetAsync(dev, 0, kBins * sizeof(unsigned long long), stream), "memset");
      radix_histogram<<<grid_for(d), 256, 0, stream>>>(d_x, d, shifts[pass], widths[pass], prefix, dev);
      check(cudaGetLastError(), "radix_histogram");
      check(cudaMemcpyAsync(hist.data(), dev, kBins * sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream),
            "copy histogram");
      check(cudaStreamSynchronize(stream), "sync");
      if (pass == 0) {
        for (int b = (int)(kNonFinite >> 20); b < kBins; ++b)
          if (hist[b]) throw NumericError("bucket '" + bucket + "': gradient has NaN or Inf entries");
      }
      int b = (1 << widths[pass]) - 1;
      for (; b > 0; --b) {
        if (hist[b] >= remaining) break;
        remaining -= hist[b];
        above += hist[b];
      }
      prefix = (prefix << widths[pass]) | (uint32_t)b;
    }
    if (k > 0) {
      check(cudaMemsetAsync(dev + kBins, 0, 2 * sizeof(unsigned long long), stream), "memset");
      gather_topk<<<grid_for(d), 256, 0, stream>>>(d_x, d, prefix, above, k, d_idx, d_val, dev + kBins);
      check(cudaGetLastError(), "gather_topk");
      check(cudaStreamSynchronize(stream), "sync");
    }
  } catch (...) {
    cudaFreeAsync(dev, stream);
    throw;
  }
  check(cudaFreeAsync(dev, stream), "free");
}

void scatter_add(float* d_dense, size_t n, const SparseEntry* d_entries, size_t chunk_len, int chunks,
                 void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  for (int c = 0; c < chunks && chunk_len > 0; ++c) {
    scatter_chunk<<<grid_for(chunk_len), 256, 0, stream>>>(d_dense, n, d_entries + c * chunk_len, chunk_len);
    check(cudaGetLastError(), "scatter_add");
  }
  check(cudaStreamSynchronize(stream), "sync");
}

void pack_entries(const uint32_t* d_idx, const float* d_val, size_t k, uint32_t offset, SparseEntry* d_out,
                  void* stream_ptr) {
  if (k == 0) return;
  pack_kernel<<<grid_for(k), 256, 0, static_cast<cudaStream_t>(stream_ptr)>>>(d_idx, d_val, k, offset, d_out);
  check(cudaGetLastError(), "pack_entries");
}

void zero_at(float* d_x, const uint32_t* d_idx, size_t k, void* stream_ptr) {
  if (k == 0) return;
  zero_kernel<<<grid_for(k), 256, 0, static_cast<cudaStream_t>(stream_ptr)>>>(d_x, d_idx, k);
  check(cudaGetLastError(), "zero_at");
}

}  // namespace tessera::cuda
