#include "controller/kube/work_queue.h"

#include <algorithm>

namespace tessera::kube {

void WorkQueue::push_locked(const std::string& key) {
  if (processing_.count(key)) {
    dirty_.insert(key);
    return;
  }
  if (queued_.insert(key).second) queue_.push_back(key);
}

void WorkQueue::add(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    delayed_.erase(key);
    push_locked(key);
  }
  cv_.notify_all();
}

void WorkQueue::add_after(const std::string& key, std::chrono::milliseconds delay) {
  if (delay.count() <= 0) return add(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    const auto when = Clock::now() + delay;
    auto it = delayed_.find(key);
    if (it == delayed_.end() || when < it->second) delayed_[key] = when;
  }
  cv_.notify_all();
}

void WorkQueue::add_rate_limited(const std::string& key) {
  std::chrono::milliseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int n = failures_[key]++;
    delay = std::min<std::chrono::milliseconds>(max_, base_ * (int64_t{1} << std::min(n, 20)));
  }
  add_after(key, delay);
}

void WorkQueue::forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::failures(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

bool WorkQueue::get(std::string* key) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (shutdown_) return false;
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (auto it = delayed_.begin(); it != delayed_.end();) {
      if (it->second <= now) {
        push_locked(it->first);
        it = delayed_.erase(it);
      } else {
        next = std::min(next, it->second);
        ++it;
      }
    }
    if (!queue_.empty()) {
      *key = queue_.front();
      queue_.pop_front();
      queued_.erase(*key);
      processing_.insert(*key);
      return true;
    }
    if (next == Clock::time_point::max()) cv_.wait(lock);
    else cv_.wait_until(lock, next);
  }
}

void WorkQueue::done(const std::string& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    processing_.erase(key);
    if (dirty_.erase(key)) push_locked(key);
  }
  cv_.notify_all();
}

void WorkQueue::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

size_t WorkQueue::depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace tessera::kube
