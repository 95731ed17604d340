// Where a tensor's storage lives (the host or a CUDA device), and the CUDA runtime as the rest of the
// worker sees it. Every function here exists in every build: without CUDA (TESSERA_HAVE_CUDA 0)
// gpu::device_count() is 0 and the others throw Error saying the build has no CUDA.
//
// Streams: each thread works on one stream of its device (created on first use); kernels, copies,
// allocations and frees of that thread are ordered on it, so a thread sees its own work in order with
// no synchronisation. Work handed to another thread (the communication thread) is ordered with an
// Event. Device memory is stream-ordered (cudaMallocAsync's pool): freeing is asynchronous, on the
// stream the block was allocated on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

enum class Device : uint8_t { kCpu, kCuda };
const char* device_name(Device d);  // "cpu", "cuda"

namespace gpu {

// Whether this build has the CUDA paths.
bool built();
// Usable CUDA devices (0 without CUDA or a driver; `why`, when given, then says why).
int device_count(std::string* why = nullptr);
// Binds the calling thread to device `ordinal`: its device tensors and kernels live there from now on.
void set_device(int ordinal);
int current_device();
// The calling thread's stream (a cudaStream_t) on its device.
void* stream();
// Waits until the calling thread's stream has run everything queued on it.
void synchronize();

void* alloc(size_t bytes);  // on the calling thread's stream
void free(void* p, void* stream);
// Pinned (page-locked) host memory: copies from and to it run asynchronously.
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);

// Copies `bytes` between host and device memory on the calling thread's stream. A copy to pageable
// host memory returns when the bytes are there; the others are asynchronous.
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// dst[0..n) = value; acc[i] += x[i]; x[i] *= s (device memory, on the calling thread's stream).
void fill(float* dst, size_t n, float value);
void add_into(float* acc, const float* x, size_t n);
void scale(float* x, size_t n, float s);

// A point in one stream's work that another stream (or the host) can wait for.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record();      // at the end of the calling thread's stream's work so far
  void wait() const;  // the calling thread's stream waits for it (the host does not)
  void sync() const;  // the host waits for it

 private:
  void* event_ = nullptr;
};

}  // namespace gpu
}  // namespace tessera
