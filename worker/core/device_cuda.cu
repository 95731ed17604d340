// The gpu:: functions of a CUDA build (see device.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "worker/core/device.h"

namespace tessera::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

// A thread's stream is never destroyed: device memory it allocated may be freed on it after the
// thread has gone (a tensor outliving the loader thread that made it).
struct ThreadState {
  int device = -1;  // bound by set_device(); -1: device 0 on first use
  cudaStream_t stream = nullptr;
};
thread_local ThreadState t_state;

ThreadState& state() {
  if (t_state.device < 0) set_device(0);
  return t_state;
}

__global__ void fill_kernel(float* __restrict p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
__global__ void add_kernel(float* __restrict acc, const float* __restrict x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc[i] += x[i];
}
__global__ void scale_kernel(float* __restrict x, size_t n, float s) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] *= s;
}

constexpr int kThreads = 256;
int blocks_for(size_t n) { return static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096)); }

cudaMemcpyKind kind(Device dst, Device src) {
  if (dst == Device::kCuda) return src == Device::kCuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  return src == Device::kCuda ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

}  // namespace

bool built() { return true; }

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver sees no device";
  return n;
}

void set_device(int ordinal) {
  std::string why;
  const int n = device_count(&why);
  if (ordinal < 0 || ordinal >= n)
    throw Error("cuda: device " + std::to_string(ordinal) + " does not exist (" + std::to_string(n) + " usable" +
                (n ? "" : ": " + why) + ")");
  if (t_state.device == ordinal) return;
  check(cudaSetDevice(ordinal), "cudaSetDevice");
  if (t_state.stream) check(cudaStreamSynchronize(t_state.stream), "cudaStreamSynchronize");
  t_state.device = ordinal;
  check(cudaStreamCreateWithFlags(&t_state.stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

int current_device() { return state().device; }
void* stream() { return state().stream; }
void synchronize() { check(cudaStreamSynchronize(state().stream), "cudaStreamSynchronize"); }

void* alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, state().stream);
  if (e != cudaSuccess)
    throw Error("cuda: cannot allocate " + std::to_string(bytes) + " bytes on device " +
                std::to_string(t_state.device) + ": " + cudaGetErrorString(e));
  return p;
}

void free(void* p, void* s) {
  if (p) cudaFreeAsync(p, static_cast<cudaStream_t>(s));  // an error here is a broken device, reported by the next call
}

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost");
  return p;
}

void free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t s = state().stream;
  check(cudaMemcpyAsync(dst, src, bytes, kind(dst_device, src_device), s), "cudaMemcpyAsync");
  if (dst_device == Device::kCpu) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void fill(float* dst, size_t n, float value) {
  if (n == 0) return;
  cudaStream_t s = state().stream;
  if (value == 0.0f) {
    check(cudaMemsetAsync(dst, 0, n * sizeof(float), s), "cudaMemsetAsync");
    return;
  }
  fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(dst, n, value);
  check(cudaGetLastError(), "fill");
}

void add_into(float* acc, const float* x, size_t n) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, state().stream>>>(acc, x, n);
  check(cudaGetLastError(), "add_into");
}

void scale(float* x, size_t n, float s) {
  if (n == 0) return;
  scale_kernel<<<blocks_for(n), kThreads, 0, state().stream>>>(x, n, s);
  check(cudaGetLastError(), "scale");
}

Event::Event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  event_ = e;
}
Event::~Event() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}
void Event::record() { check(cudaEventRecord(static_cast<cudaEvent_t>(event_), state().stream), "cudaEventRecord"); }
void Event::wait() const {
  check(cudaStreamWaitEvent(state().stream, static_cast<cudaEvent_t>(event_), 0), "cudaStreamWaitEvent");
}
void Event::sync() const { check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)), "cudaEventSynchronize"); }

}  // namespace tessera::gpu
