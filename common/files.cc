#include "common/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace tessera {

void write_file_atomic(const std::string& path, const std::string& bytes) {
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

}  // namespace tessera
