#include "worker/data/filesystem.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace tessera {

std::string PosixFileSystem::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path, std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError(path, "read failed");
  return ss.str();
}

void PosixFileSystem::write_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, bytes);
}

void PosixFileSystem::remove(const std::string& path) { ::unlink(path.c_str()); }

std::vector<std::string> PosixFileSystem::list(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.find(".tmp.") == std::string::npos) out.push_back(name);
  }
  return out;
}

void PosixFileSystem::make_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(dir, "cannot create directory: " + ec.message());
}

void ThrottledFileSystem::charge_read(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(link_);
  std::this_thread::sleep_for(latency_ +
                              std::chrono::microseconds(static_cast<int64_t>(bytes / bytes_per_second_ * 1e6)));
}

std::string ThrottledFileSystem::read(const std::string& path) {
  std::string s = base_.read(path);
  charge_read(s.size());
  return s;
}

std::string FaultyFileSystem::read(const std::string& path) {
  if (fail_reads > 0) {
    --fail_reads;
    throw IoError(path, "injected read error");
  }
  return base_.read(path);
}

void FaultyFileSystem::write_atomic(const std::string& path, const std::string& bytes) {
  const int64_t cap = capacity.load();
  if (cap >= 0 && used.load() + static_cast<int64_t>(bytes.size()) > cap)
    throw IoError(path, "no space left on device (injected)", true);
  if (tear_writes > 0) {
    --tear_writes;
    // The process dies after half the bytes: the temporary file stays, the rename never happens.
    std::ofstream(path + ".tmp.torn", std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
    throw IoError(path, "injected torn write");
  }
  base_.write_atomic(path, bytes);
  used += static_cast<int64_t>(bytes.size());
}

void FaultyFileSystem::remove(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  base_.remove(path);
  if (!ec) used -= static_cast<int64_t>(size);
}

}  // namespace tessera
