// TieredCache: byte blobs by key through three tiers.
//   tier 0  memory: byte budget, LRU
//   tier 1  a local SSD directory: byte budget, LRU, one file per entry written atomically, a
//           checksum verified on every read, entries found again after a restart
//   tier 2  the remote source (a fetch function: an HDF5 hyperslab read from NFS, say)
// A miss fills the faster tiers. A full or failing SSD tier is skipped with a warning (counted),
// a corrupt SSD entry is dropped and read again from the remote tier: the cache never crashes
// the job and never returns wrong bytes. Thread-safe; fetches run outside the lock.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "worker/data/filesystem.h"

namespace tessera {

struct CacheOptions {
  int64_t memory_bytes = int64_t{1} << 30;  // 0: no memory tier
  std::string ssd_dir;                      // empty: no SSD tier
  int64_t ssd_bytes = int64_t{10} << 30;
};

class TieredCache {
 public:
  using Blob = std::shared_ptr<const std::string>;
  enum Tier { kMemory = 0, kSsd = 1, kRemote = 2 };

  struct Counters {
    uint64_t hits[3] = {0, 0, 0};   // served from each tier (remote: every fetch)
    uint64_t misses[2] = {0, 0};    // memory and SSD misses
    uint64_t bytes[3] = {0, 0, 0};  // bytes served from each tier
    uint64_t ssd_write_failures = 0, ssd_corrupt = 0, ssd_read_failures = 0, ssd_evictions = 0, memory_evictions = 0;
  };

  // `ssd` does the SSD tier's file operations (a FaultyFileSystem in tests).
  TieredCache(CacheOptions options, FileSystem& ssd);

  Blob get(const std::string& key, const std::function<std::string()>& fetch_remote);

  Counters counters() const;
  // Keys in the memory tier, most recently used first; and the number of SSD entries.
  std::vector<std::string> memory_keys() const;
  size_t ssd_entries() const;
  int64_t memory_bytes_used() const;
  int64_t ssd_bytes_used() const;

 private:
  struct Entry {
    std::list<std::string>::iterator pos;
    int64_t bytes;
    Blob blob;  // memory tier only
  };
  std::string ssd_path(const std::string& key) const;
  void put_memory(const std::string& key, const Blob& blob);  // REQUIRES: mu_ held
  void put_ssd(const std::string& key, const std::string& data);
  std::optional<std::string> read_ssd(const std::string& key);
  void scan_ssd();

  CacheOptions options_;
  FileSystem& ssd_;
  mutable std::mutex mu_;
  std::list<std::string> mem_lru_, ssd_lru_;                // GUARDED_BY(mu_), most recent first
  std::unordered_map<std::string, Entry> mem_, ssd_index_;  // GUARDED_BY(mu_); ssd_index_ by file name
  int64_t mem_used_ = 0, ssd_used_ = 0;
  Counters counters_;
  bool warned_write_ = false;
};

}  // namespace tessera
