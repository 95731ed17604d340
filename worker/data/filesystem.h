// FileSystem: the byte-level file operations of the data cache and the checkpoints, behind an
// interface so tests and benchmarks can slow it down (ThrottledFileSystem: bandwidth and latency, like NFS) or break it
// (FaultyFileSystem: read errors, torn writes, a full disk). Errors throw IoError naming the path.
// Implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/files.h"

namespace tessera {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual std::string read(const std::string& path) = 0;
  // write_file_atomic (common/files.h): readers see the old file or the whole new one, never a
  // part, even after a crash.
  virtual void write_atomic(const std::string& path, const std::string& bytes) = 0;
  virtual void remove(const std::string& path) = 0;
  // Regular files in dir (names only); temporary files of unfinished writes are not listed.
  virtual std::vector<std::string> list(const std::string& dir) = 0;
  virtual void make_dir(const std::string& dir) = 0;
  // Charges a read made outside this interface (HDF5 reading a file directly) as if made here.
  virtual void charge_read(uint64_t bytes) { (void)bytes; }
};

class PosixFileSystem : public FileSystem {
 public:
  std::string read(const std::string& path) override;
  void write_atomic(const std::string& path, const std::string& bytes) override;
  void remove(const std::string& path) override;
  std::vector<std::string> list(const std::string& dir) override;
  void make_dir(const std::string& dir) override;
};

// Reads cost latency + bytes / bandwidth, serialised like one shared link.
class ThrottledFileSystem : public FileSystem {
 public:
  ThrottledFileSystem(FileSystem& base, double megabytes_per_second, std::chrono::microseconds latency)
      : base_(base), bytes_per_second_(megabytes_per_second * 1e6), latency_(latency) {}
  std::string read(const std::string& path) override;
  void write_atomic(const std::string& path, const std::string& bytes) override { base_.write_atomic(path, bytes); }
  void remove(const std::string& path) override { base_.remove(path); }
  std::vector<std::string> list(const std::string& dir) override { return base_.list(dir); }
  void make_dir(const std::string& dir) override { base_.make_dir(dir); }
  void charge_read(uint64_t bytes) override;

 private:
  FileSystem& base_;
  double bytes_per_second_;
  std::chrono::microseconds latency_;
  std::mutex link_;  // one transfer at a time
};

// Injects faults into a base file system.
class FaultyFileSystem : public FileSystem {
 public:
  explicit FaultyFileSystem(FileSystem& base) : base_(base) {}
  std::atomic<int> fail_reads{0};     // the next n reads throw
  std::atomic<int> tear_writes{0};    // the next n writes die half-way (temporary file left, no rename)
  std::atomic<int64_t> capacity{-1};  // bytes the disk holds (-1: unlimited); beyond: no space
  std::atomic<int64_t> used{0};

  std::string read(const std::string& path) override;
  void write_atomic(const std::string& path, const std::string& bytes) override;
  void remove(const std::string& path) override;
  std::vector<std::string> list(const std::string& dir) override { return base_.list(dir); }
  void make_dir(const std::string& dir) override { base_.make_dir(dir); }

 private:
  FileSystem& base_;
};

}  // namespace tessera
