#include "worker/data/loader.h"

#include <chrono>

#include "common/error.h"

namespace tessera {

PrefetchLoader::PrefetchLoader(const Dataset& data, int threads, int depth, VolumeBox box)
    : data_(data), depth_(std::max(1, depth)), box_(box) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { work(); });
}

PrefetchLoader::~PrefetchLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void PrefetchLoader::start(std::vector<std::vector<uint64_t>> batches) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    schedule_ = std::move(batches);
    next_job_ = consumed_ = 0;
    ++generation_;
    ready_.clear();
    failed_.clear();
  }
  cv_.notify_all();
}

void PrefetchLoader::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (next_job_ < schedule_.size() && next_job_ < consumed_ + depth_); });
    if (stop_) return;
    const size_t job = next_job_++;
    const uint64_t gen = generation_;
    const std::vector<uint64_t> indices = schedule_[job];
    lock.unlock();
    Batch batch;
    std::exception_ptr error;
    try {
      std::vector<Sample> samples;
      samples.reserve(indices.size());
      for (uint64_t i : indices) samples.push_back(box_ == VolumeBox{} ? data_.get(i) : data_.get_block(i, box_));
      batch = stack_samples(samples);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (gen != generation_) continue;  // the schedule was replaced meanwhile
    if (error) {
      failed_[job] = error;
    } else {
      ready_[job] = std::move(batch);
    }
    cv_.notify_all();
  }
}

Batch PrefetchLoader::next(double* waited) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  TESSERA_CHECK_LT(consumed_, schedule_.size(), "loader: no batch left in the schedule");
  const size_t want = consumed_;
  cv_.wait(lock, [&] { return ready_.count(want) || failed_.count(want); });
  if (waited) *waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++consumed_;
  cv_.notify_all();
  if (auto it = failed_.find(want); it != failed_.end()) std::rethrow_exception(it->second);
  Batch b = std::move(ready_[want]);
  ready_.erase(want);
  return b;
}

}  // namespace tessera
