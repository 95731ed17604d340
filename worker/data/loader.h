// PrefetchLoader: loads the batches of a schedule on a pool of threads, at most `depth` batches
// ahead of the consumer, so reading, decoding and transforming happen off the training thread.
// next() returns batches in schedule order and reports how long it waited (the trainer's data-wait
// time). A failed load is rethrown by the next() that asks for that batch.
// start() and next() are called by one consumer thread.
//
// For a model on the GPU (device kCuda) the loader's threads also move each batch there: samples
// read from the dataset are stacked in pinned host memory and copied on the thread's own stream, so
// the copy overlaps the training stream's compute; samples found in the device cache (SampleCache,
// tier 0) are copied inside the GPU, and the others are put there. next() then returns device
// tensors whose copies are complete.
#pragma once

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/sample_cache.h"

namespace tessera {

class PrefetchLoader {
 public:
  // box: the block of every sample to load (empty: whole samples). device: where the batches go
  // (kCuda: to CUDA device `cuda_device`, through `cache` when given; not owned).
  PrefetchLoader(const Dataset& data, int threads, int depth, VolumeBox box = {}, Device device = Device::kCpu,
                 int cuda_device = -1, SampleCache* cache = nullptr);
  ~PrefetchLoader();
  PrefetchLoader(const PrefetchLoader&) = delete;
  PrefetchLoader& operator=(const PrefetchLoader&) = delete;

  // Replaces the schedule (batches of sample indices); loading starts at once.
  void start(std::vector<std::vector<uint64_t>> batches);
  // The next batch of the schedule; waited: seconds spent blocked.
  Batch next(double* waited = nullptr);

 private:
  void work();
  Batch load(const std::vector<uint64_t>& indices);
  Batch load_to_device(const std::vector<uint64_t>& indices);
  Sample read(uint64_t index) const;

  const Dataset& data_;
  const int depth_;
  const VolumeBox box_;
  const Device device_;
  const int cuda_device_;
  SampleCache* cache_;
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
