#include "worker/data/tiered_cache.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/log.h"
#include "worker/core/checksum.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'B', 'L', 'K', '1', '\0'};

// entry file: magic, u64 checksum of the rest, u32 key length, key, payload
std::string encode(const std::string& key, const std::string& data) {
  std::string body;
  const uint32_t klen = static_cast<uint32_t>(key.size());
  body.append(reinterpret_cast<const char*>(&klen), 4);
  body += key;
  body += data;
  const uint64_t sum = fnv1a64(body.data(), body.size());
  std::string out(kMagic, 8);
  out.append(reinterpret_cast<const char*>(&sum), 8);
  return out + body;
}

// The payload, or nothing if the file is not a complete entry for `key`.
std::optional<std::string> decode(const std::string& key, const std::string& file) {
  if (file.size() < 20 || std::memcmp(file.data(), kMagic, 8) != 0) return std::nullopt;
  uint64_t sum;
  std::memcpy(&sum, file.data() + 8, 8);
  if (fnv1a64(file.data() + 16, file.size() - 16) != sum) return std::nullopt;
  uint32_t klen;
  std::memcpy(&klen, file.data() + 16, 4);
  if (20 + klen > file.size() || file.compare(20, klen, key) != 0) return std::nullopt;
  return file.substr(20 + klen);
}

}  // namespace

TieredCache::TieredCache(CacheOptions options, FileSystem& ssd) : options_(std::move(options)), ssd_(ssd) {
  if (!options_.ssd_dir.empty()) {
    ssd_.make_dir(options_.ssd_dir);
    scan_ssd();
  }
}

std::string TieredCache::ssd_path(const std::string& key) const {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.blk", static_cast<unsigned long long>(fnv1a64(key.data(), key.size())));
  return options_.ssd_dir + "/" + name;
}

// Entries left by an earlier run: indexed by file, oldest first by modification time.
void TieredCache::scan_ssd() {
  std::vector<std::pair<std::filesystem::file_time_type, std::string>> files;
  for (const std::string& name : ssd_.list(options_.ssd_dir)) {
    if (name.size() < 4 || name.compare(name.size() - 4, 4, ".blk") != 0) continue;
    std::error_code ec;
    const auto path = options_.ssd_dir + "/" + name;
    auto t = std::filesystem::last_write_time(path, ec);
    if (!ec) files.emplace_back(t, name);
  }
  std::sort(files.begin(), files.end());
  for (const auto& [t, name] : files) {
    std::error_code ec;
    const int64_t size = static_cast<int64_t>(std::filesystem::file_size(options_.ssd_dir + "/" + name, ec));
    if (ec) continue;
    ssd_lru_.push_front(name);
    ssd_index_[name] = Entry{ssd_lru_.begin(), size, nullptr};
    ssd_used_ += size;
  }
  if (!files.empty())
    log_info("data cache: found ", files.size(), " entries (", ssd_used_ / 1e6, " MB) in ", options_.ssd_dir);
}

void TieredCache::put_memory(const std::string& key, const Blob& blob) {
  const int64_t size = static_cast<int64_t>(blob->size());
  if (size > options_.memory_bytes) return;
  if (mem_.count(key)) return;
  while (mem_used_ + size > options_.memory_bytes && !mem_lru_.empty()) {
    const std::string& victim = mem_lru_.back();
    mem_used_ -= mem_[victim].bytes;
    mem_.erase(victim);
    mem_lru_.pop_back();
    ++counters_.memory_evictions;
  }
  mem_lru_.push_front(key);
  mem_[key] = Entry{mem_lru_.begin(), size, blob};
  mem_used_ += size;
}

std::optional<std::string> TieredCache::read_ssd(const std::string& key) {
  const std::string path = ssd_path(key);
  const std::string name = path.substr(path.rfind('/') + 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ssd_index_.find(name);
    if (it == ssd_index_.end()) return std::nullopt;
    ssd_lru_.splice(ssd_lru_.begin(), ssd_lru_, it->second.pos);
  }
  std::string file;
  try {
    file = ssd_.read(path);
  } catch (const IoError& e) {
    log_warn("data cache: SSD read failed, reading the remote tier instead: ", e.what());
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.ssd_read_failures;
    return std::nullopt;
  }
  auto payload = decode(key, file);
  if (!payload) {
    log_warn("data cache: SSD entry ", path, " for '", key, "' is corrupt; dropping it and reading the remote tier");
    ssd_.remove(path);
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.ssd_corrupt;
    auto it = ssd_index_.find(name);
    if (it != ssd_index_.end()) {
      ssd_used_ -= it->second.bytes;
      ssd_lru_.erase(it->second.pos);
      ssd_index_.erase(it);
    }
  }
  return payload;
}

void TieredCache::put_ssd(const std::string& key, const std::string& data) {
  const std::string path = ssd_path(key);
  const std::string name = path.substr(path.rfind('/') + 1);
  const std::string file = encode(key, data);
  const int64_t size = static_cast<int64_t>(file.size());
  if (size > options_.ssd_bytes) return;
  std::vector<std::string> evict;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ssd_index_.count(name)) return;
    while (ssd_used_ + size > options_.ssd_bytes && !ssd_lru_.empty()) {
      const std::string victim = ssd_lru_.back();
      ssd_used_ -= ssd_index_[victim].bytes;
      ssd_index_.erase(victim);
      ssd_lru_.pop_back();
      evict.push_back(victim);
      ++counters_.ssd_evictions;
    }
  }
  for (const auto& v : evict) ssd_.remove(options_.ssd_dir + "/" + v);
  try {
    ssd_.write_atomic(path, file);
  } catch (const IoError& e) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.ssd_write_failures;
    if (!warned_write_) {
      warned_write_ = true;
      log_warn("data cache: SSD tier write failed (", e.what(), "); serving from memory and the remote tier",
               e.no_space() ? " until space frees up" : "");
    }
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ssd_lru_.push_front(name);
  ssd_index_[name] = Entry{ssd_lru_.begin(), size, nullptr};
  ssd_used_ += size;
}

TieredCache::Blob TieredCache::get(const std::string& key, const std::function<std::string()>& fetch_remote) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mem_.find(key);
    if (it != mem_.end()) {
      mem_lru_.splice(mem_lru_.begin(), mem_lru_, it->second.pos);
      ++counters_.hits[kMemory];
      counters_.bytes[kMemory] += it->second.bytes;
      return it->second.blob;
    }
    ++counters_.misses[kMemory];
  }
  if (!options_.ssd_dir.empty()) {
    if (auto data = read_ssd(key)) {
      auto blob = std::make_shared<const std::string>(std::move(*data));
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.hits[kSsd];
      counters_.bytes[kSsd] += blob->size();
      if (options_.memory_bytes > 0) put_memory(key, blob);
      return blob;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.misses[kSsd];
  }
  auto blob = std::make_shared<const std::string>(fetch_remote());
  if (!options_.ssd_dir.empty()) put_ssd(key, *blob);
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.hits[kRemote];
  counters_.bytes[kRemote] += blob->size();
  if (options_.memory_bytes > 0) put_memory(key, blob);
  return blob;
}

TieredCache::Counters TieredCache::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<std::string> TieredCache::memory_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<std::string>(mem_lru_.begin(), mem_lru_.end());
}

size_t TieredCache::ssd_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ssd_index_.size();
}

int64_t TieredCache::memory_bytes_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_used_;
}

int64_t TieredCache::ssd_bytes_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ssd_used_;
}

}  // namespace tessera
