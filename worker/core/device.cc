// The Device names, and the gpu:: functions of a build without CUDA (device_cuda.cu has the others).
#include "worker/core/device.h"

#include "tessera/config.h"

#if !TESSERA_HAVE_CUDA
#include "common/error.h"
#endif

namespace tessera {

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

#if !TESSERA_HAVE_CUDA
namespace gpu {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(std::string(what) + ": this build of Tessera has no CUDA (nvcc was not found when it was built)");
}
}  // namespace

bool built() { return false; }
int device_count(std::string* why) {
  if (why) *why = "this build of Tessera has no CUDA";
  return 0;
}
void set_device(int) { no_cuda("set_device"); }
int current_device() { no_cuda("current_device"); }
void* stream() { no_cuda("stream"); }
void synchronize() { no_cuda("synchronize"); }
void* alloc(size_t) { no_cuda("device memory"); }
void free(void*, void*) { no_cuda("device memory"); }
void* alloc_pinned(size_t) { no_cuda("pinned memory"); }
void free_pinned(void*) { no_cuda("pinned memory"); }
void copy(void*, Device, const void*, Device, size_t) { no_cuda("copy"); }
void fill(float*, size_t, float) { no_cuda("fill"); }
void add_into(float*, const float*, size_t) { no_cuda("add_into"); }
void scale(float*, size_t, float) { no_cuda("scale"); }
Event::Event() { no_cuda("event"); }
Event::~Event() = default;
void Event::record() {}
void Event::wait() const {}
void Event::sync() const {}
}  // namespace gpu
#endif

}  // namespace tessera
