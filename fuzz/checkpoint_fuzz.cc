// A checkpoint's contents behind a valid checksum (the harness appends it, so the parser itself is
// reached, as by a file crafted to pass the checksum): it parses or is an Error naming the file;
// no read past the end, no allocation larger than the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "worker/core/checksum.h"
#include "worker/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  const uint64_t sum = fnv1a64(bytes);
  bytes.append(reinterpret_cast<const char*>(&sum), sizeof(sum));
  try {
    const CheckpointData d = parse_checkpoint(bytes, "fuzz.bin");
    size_t floats = 0;
    for (const auto& [name, v] : d.arrays) floats += v.size();
    if (floats * sizeof(float) > size) __builtin_trap();  // every value came from the input
  } catch (const Error&) {
  }
  return 0;
}
