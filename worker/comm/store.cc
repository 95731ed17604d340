#include "worker/comm/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"

namespace tessera {
namespace {

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) s += ", ";
    if (i == 8) {
      s += "... (" + std::to_string(keys.size() - 8) + " more)";
      break;
    }
    s += "'" + keys[i] + "'";
  }
  return s;
}

}  // namespace

void Store::wait(const std::vector<std::string>& keys, Millis timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> missing = keys;
  for (;;) {
    std::vector<std::string> still;
    for (const auto& k : missing)
      if (!try_get(k)) still.push_back(k);
    if (still.empty()) return;
    missing = std::move(still);
    if (std::chrono::steady_clock::now() >= deadline)
      throw StoreTimeout(
          detail::concat("store: keys not written within ", timeout.count(), " ms: ", join_keys(missing)));
    std::this_thread::sleep_for(poll_interval());
  }
}

std::string Store::get(const std::string& key, Millis timeout) {
  wait({key}, timeout);
  auto v = try_get(key);
  TESSERA_CHECK(v.has_value(), "key '", key, "' vanished after wait");
  return *v;
}

// ---- MemoryStore ----

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::optional<std::string> MemoryStore::try_get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_present = [&] {
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (cv_.wait_for(lock, timeout, all_present)) return;
  std::vector<std::string> missing;
  for (const auto& k : keys)
    if (!data_.count(k)) missing.push_back(k);
  throw StoreTimeout(detail::concat("store: keys not written within ", timeout.count(), " ms: ", join_keys(missing)));
}

// ---- FileStore ----

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) throw Error("file store: cannot create directory '" + dir_ + "': " + ec.message());
}

std::string FileStore::path_of(const std::string& key) const {
  // Keys may contain '/', which would name subdirectories; escape everything outside [A-Za-z0-9._-].
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      name += buf;
    }
  }
  return dir_ + "/" + name;
}

void FileStore::set(const std::string& key, const std::string& value) {
  const std::string path = path_of(key);
  std::ostringstream tmp;
  tmp << path << ".tmp." << ::getpid() << "." << std::this_thread::get_id();
  const std::string tmp_path = tmp.str();
  int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("file store: cannot write '" + tmp_path + "': " + std::strerror(errno));
  size_t off = 0;
  while (off < value.size()) {
    ssize_t n = ::write(fd, value.data() + off, value.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      ::unlink(tmp_path.c_str());
      throw Error("file store: cannot write '" + tmp_path + "': " + std::strerror(e));
    }
    off += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp_path.c_str());
    throw Error("file store: cannot rename '" + tmp_path + "' to '" + path + "': " + std::strerror(e));
  }
}

std::optional<std::string> FileStore::try_get(const std::string& key) {
  std::ifstream in(path_of(key), std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- PrefixStore ----

void PrefixStore::set(const std::string& k, const std::string& value) { base_.set(key(k), value); }

std::optional<std::string> PrefixStore::try_get(const std::string& k) { return base_.try_get(key(k)); }

void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& k : keys) full.push_back(key(k));
  base_.wait(full, timeout);
}

}  // namespace tessera
