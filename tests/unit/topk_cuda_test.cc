// GPU top-k and scatter-add against the CPU reference. Skipped, with the reason, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "common/error.h"
#include "worker/compress/cuda/topk_cuda.h"
#include "worker/compress/sparse.h"
#include "worker/compress/topk.h"
#include "worker/core/device.h"

namespace tessera {
namespace {

class TopkCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no usable CUDA device (" << why << "); GPU paths not run";
  }
};

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)), cudaSuccess);
  if (!v.empty()) cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> v(n);
  if (n) cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

TEST_F(TopkCudaTest, MatchesExactTopkMagnitudes) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (size_t d : {1ul, 33ul, 4099ul, 1000003ul}) {
    std::vector<float> x(d);
    for (auto& v : x) v = n(rng);
    if (d > 100)
      for (size_t i = 0; i < d / 10; ++i) x[i * 7 % d] = 0.75f;  // ties
    for (size_t k : {0ul, 1ul, d / 3, d}) {
      SCOPED_TRACE("d=" + std::to_string(d) + " k=" + std::to_string(k));
      float* dx = to_device(x);
      uint32_t* didx = nullptr;
      float* dval = nullptr;
      cudaMalloc(&didx, std::max<size_t>(k, 1) * 4);
      cudaMalloc(&dval, std::max<size_t>(k, 1) * 4);
      cuda::mstopk(dx, d, k, didx, dval, "b");
      auto idx = to_host(didx, k);
      auto val = to_host(dval, k);
      std::set<uint32_t> distinct(idx.begin(), idx.end());
      ASSERT_EQ(distinct.size(), k);
      std::vector<float> got, want;
      for (size_t i = 0; i < k; ++i) {
        ASSERT_EQ(val[i], x[idx[i]]);
        got.push_back(std::fabs(val[i]));
      }
      for (float v : x) want.push_back(std::fabs(v));
      std::sort(want.begin(), want.end(), std::greater<float>());
      want.resize(k);
      std::sort(got.begin(), got.end(), std::greater<float>());
      ASSERT_EQ(got, want);
      cudaFree(dx);
      cudaFree(didx);
      cudaFree(dval);
    }
  }
}

TEST_F(TopkCudaTest, NonFiniteIsRejected) {
  std::vector<float> x(1000, 1.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  float* dx = to_device(x);
  uint32_t* didx = nullptr;
  float* dval = nullptr;
  cudaMalloc(&didx, 40);
  cudaMalloc(&dval, 40);
  EXPECT_THROW(cuda::mstopk(dx, x.size(), 10, didx, dval, "fc.bias"), NumericError);
  cudaFree(dx);
  cudaFree(didx);
  cudaFree(dval);
}

TEST_F(TopkCudaTest, ScatterAddEqualsCpu) {
  const size_t n = 10000, chunk = 300;
  const int chunks = 4;
  std::vector<SparseEntry> e;
  std::mt19937 rng(1);
  for (int c = 0; c < chunks; ++c) {
    std::vector<uint32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0u);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t i = 0; i < chunk; ++i) e.push_back({perm[i], static_cast<float>(c + 1) * 0.5f});
  }
  std::vector<float> cpu(n, 1.0f);
  scatter_add(cpu, e);
  float* dd = to_device(std::vector<float>(n, 1.0f));
  SparseEntry* de = to_device(e);
  cuda::scatter_add(dd, n, de, chunk, chunks);
  EXPECT_EQ(to_host(dd, n), cpu);
  cudaFree(dd);
  cudaFree(de);
}

}  // namespace
}  // namespace tessera
