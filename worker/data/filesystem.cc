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
  // Several processes may write the same file (ranks of a node share the SSD cache): each its own
  // temporary file, and the last rename wins with a whole file.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](int fd, const char* what, const std::string& where) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw IoError(where, std::string(what) + ": " + std::strerror(e), e == ENOSPC || e == EFBIG);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(-1, "cannot create", tmp);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(fd, "cannot write", tmp);
    off += static_cast<size_t>(n);
  }
  // On disk before it takes the name, and the name on disk before this returns: a machine that
  // loses power keeps the old file or the whole new one.
  if (::fsync(fd) != 0) fail(fd, "cannot sync", tmp);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(-1, "cannot rename into", path);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
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
  std::this_thread::sleep_for(latency_ + std::chrono::microseconds(static_cast<int64_t>(bytes / bytes_per_second_ * 1e6)));
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
    std::ofstream(path + ".tmp.torn", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
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
