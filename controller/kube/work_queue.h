// WorkQueue: the keys of objects to reconcile. A key is held once however often it is added; a key
// being processed that is added again is processed once more after done(). Failed keys come back
// after a per-key exponential backoff (base doubling to max), reset by forget(). Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>

namespace tessera::kube {

class WorkQueue {
 public:
  using Clock = std::chrono::steady_clock;
  explicit WorkQueue(std::chrono::milliseconds base = std::chrono::milliseconds(50),
                     std::chrono::milliseconds max = std::chrono::milliseconds(30000))
      : base_(base), max_(max) {}

  void add(const std::string& key);
  // Adds the key once `delay` has passed (an earlier pending time wins).
  void add_after(const std::string& key, std::chrono::milliseconds delay);
  // Adds the key after its backoff, which doubles with each call until forget(key).
  void add_rate_limited(const std::string& key);
  void forget(const std::string& key);
  int failures(const std::string& key) const;

  // Waits for a key; false once shut down.
  bool get(std::string* key);
  void done(const std::string& key);
  void shutdown();
  // Keys waiting (not counting those being processed or delayed).
  size_t depth() const;

 private:
  void push_locked(const std::string& key);
  const std::chrono::milliseconds base_, max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;  // GUARDED_BY(mu_)
  std::set<std::string> queued_, processing_, dirty_;
  std::map<std::string, Clock::time_point> delayed_;
  std::map<std::string, int> failures_;
  bool shutdown_ = false;
};

}  // namespace tessera::kube
