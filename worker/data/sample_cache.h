// SampleCache: whole samples (input and target tensors) by index, held on one device: the tier
// before the TieredCache's byte tiers. On the GPU it is the seed paper's tier 0 in device memory
// (spec.cache.device): a sample found there reaches the batch with one copy inside the GPU, neither
// read nor decoded nor sent over PCIe again. Byte budget, least recently used evicted first; a
// sample larger than the budget is not held. Thread-safe (the loader's threads share it).
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "worker/data/synthetic.h"

namespace tessera {

class SampleCache {
 public:
  struct Counters {
    uint64_t hits = 0, misses = 0, evictions = 0;
  };

  SampleCache(int64_t budget_bytes, Device device);

  // The sample held for `index` (its tensors shared, on the cache's device), counted as a hit; or
  // nothing, counted as a miss.
  std::optional<Sample> get(uint64_t index);
  // Holds a copy of `sample` on the cache's device, evicting the least recently used as needed.
  void put(uint64_t index, const Sample& sample);

  Counters counters() const;
  int64_t bytes_used() const;
  int64_t budget_bytes() const { return budget_; }
  Device device() const { return device_; }
  // Indices held, most recently used first.
  std::vector<uint64_t> indices() const;

 private:
  struct Entry {
    std::list<uint64_t>::iterator pos;
    Sample sample;
    int64_t bytes;
  };
  const int64_t budget_;
  const Device device_;
  mutable std::mutex mu_;
  std::list<uint64_t> lru_;                      // GUARDED_BY(mu_), most recent first
  std::unordered_map<uint64_t, Entry> entries_;  // GUARDED_BY(mu_)
  int64_t used_ = 0;                             // GUARDED_BY(mu_)
  Counters counters_;                            // GUARDED_BY(mu_)
};

}  // namespace tessera
