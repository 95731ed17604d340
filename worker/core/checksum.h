// FNV-1a, 64-bit: the checksum of checkpoints, cache entries and dataset manifests. Not
// cryptographic; it detects torn and corrupted files. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

constexpr uint64_t kFnv1a64Basis = 1469598103934665603ull;

// h: the checksum of the bytes before these (a stream checksummed in pieces), or the basis.
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1a64Basis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

inline uint64_t fnv1a64(const std::string& s) { return fnv1a64(s.data(), s.size()); }

}  // namespace tessera
