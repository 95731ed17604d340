// Rendezvous key-value stores: how ranks find each other before any communicator exists.
//
// A Store holds immutable-once-written string values under string keys. Implementations:
// MemoryStore (threads of one process), FileStore (processes sharing a directory), PrefixStore (a
// namespace inside another store); the controller's gRPC store implements the same interface.
// All methods are thread-safe. Waiting methods take a timeout and throw StoreTimeout naming the keys
// that did not appear.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tessera {

using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  // Writes key (overwriting an earlier value).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of key if it has been written, without waiting.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;

  // Waits until every key exists; throws StoreTimeout listing the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout);
  // Waits for key, then returns its value.
  std::string get(const std::string& key, Millis timeout);

 protected:
  // Polling interval used by the default wait(); stores with notification override wait().
  virtual Millis poll_interval() const { return Millis(2); }
};

// Threads of one process.
class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;  // GUARDED_BY(mu_)
};

// Processes that share a directory (local disk or a shared file system). Each key is one file,
// written to a temporary name and renamed, so a reader never sees a partial value.
class FileStore : public Store {
 public:
  // Creates `dir` if needed.
  explicit FileStore(std::string dir);
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  const std::string& dir() const { return dir_; }

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

// Every key of `base` prefixed with "<prefix>/".
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix)), base_(base) {}
  void set(const std::string& key, const std::string& value) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::string prefix_;
  Store& base_;
};

}  // namespace tessera
