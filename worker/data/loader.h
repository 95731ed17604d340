// PrefetchLoader: loads the batches of a schedule on a pool of threads, at most `depth` batches
// ahead of the consumer, so reading, decoding and transforming happen off the training thread.
// next() returns batches in schedule order and reports how long it waited (the trainer's data-wait
// time). A failed load is rethrown by the next() that asks for that batch.
// start() and next() are called by one consumer thread.
#pragma once

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"

namespace tessera {

class PrefetchLoader {
 public:
  // box: the block of every sample to load (empty: whole samples).
  PrefetchLoader(const Dataset& data, int threads, int depth, VolumeBox box = {});
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // Replaces the schedule (batches of sample indices); loading starts at once.
  void start(std::vector<std::vector<uint64_t>> batches);
  // The next batch of the schedule; waited: seconds spent blocked.
  Batch next(double* waited = nullptr);

 private:
  void work();

  const Dataset& data_;
  const int depth_;
  const VolumeBox box_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint64_t>> schedule_;  // GUARDED_BY(mu_)
  size_t next_job_ = 0, consumed_ = 0;           // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                      // GUARDED_BY(mu_): bumped by start()
  std::map<size_t, Batch> ready_;                // GUARDED_BY(mu_)
  std::map<size_t, std::exception_ptr> failed_;  // GUARDED_BY(mu_)
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera
