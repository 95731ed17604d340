#include "worker/data/sample_cache.h"

namespace tessera {

SampleCache::SampleCache(int64_t budget_bytes, Device device)
    : budget_(std::max<int64_t>(0, budget_bytes)), device_(device) {}

std::optional<Sample> SampleCache::get(uint64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(index);
  if (it == entries_.end()) {
    ++counters_.misses;
    return std::nullopt;
  }
  ++counters_.hits;
  lru_.splice(lru_.begin(), lru_, it->second.pos);
  return it->second.sample;
}

void SampleCache::put(uint64_t index, const Sample& sample) {
  const int64_t bytes = (sample.input.numel() + sample.target.numel()) * static_cast<int64_t>(sizeof(float));
  if (bytes > budget_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.count(index)) return;  // another loader thread was first
  }
  // The copy to the device runs outside the lock (the other threads go on meanwhile); on the cache's
  // own device it is a clone, so that the cache never shares the loader's buffers.
  auto own = [this](const Tensor& t) { return t.device() == device_ ? t.clone() : t.to(device_); };
  Sample held{own(sample.input), own(sample.target)};
  std::lock_guard<std::mutex> lock(mu_);
  if (entries_.count(index)) return;
  while (used_ + bytes > budget_ && !lru_.empty()) {
    const uint64_t victim = lru_.back();
    used_ -= entries_.at(victim).bytes;
    entries_.erase(victim);
    lru_.pop_back();
    ++counters_.evictions;
  }
  lru_.push_front(index);
  entries_.emplace(index, Entry{lru_.begin(), std::move(held), bytes});
  used_ += bytes;
}

SampleCache::Counters SampleCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

int64_t SampleCache::bytes_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

std::vector<uint64_t> SampleCache::indices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {lru_.begin(), lru_.end()};
}

}  // namespace tessera
