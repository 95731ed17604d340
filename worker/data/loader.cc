#include "worker/data/loader.h"

#include <chrono>

#include <cstring>

#include "common/error.h"

namespace tessera {

PrefetchLoader::PrefetchLoader(const Dataset& data, int threads, int depth, VolumeBox box, Device device,
                               int cuda_device, SampleCache* cache)
    : data_(data), depth_(std::max(1, depth)), box_(box), device_(device), cuda_device_(cuda_device), cache_(cache) {
  TESSERA_CHECK(device == Device::kCpu || cuda_device >= 0, "loader: batches for the GPU need its device");
  TESSERA_CHECK(!cache || cache->device() == device, "loader: a sample cache on another device than the batches");
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

Sample PrefetchLoader::read(uint64_t index) const {
  return box_ == VolumeBox{} ? data_.get(index) : data_.get_block(index, box_);
}

Batch PrefetchLoader::load(const std::vector<uint64_t>& indices) {
  if (device_ == Device::kCuda) return load_to_device(indices);
  std::vector<Sample> samples;
  samples.reserve(indices.size());
  for (uint64_t i : indices) samples.push_back(read(i));
  return stack_samples(samples);
}

Batch PrefetchLoader::load_to_device(const std::vector<uint64_t>& indices) {
  gpu::set_device(cuda_device_);  // this thread's stream on the batches' device (once per thread)
  const size_t n = indices.size();
  TESSERA_CHECK(n > 0, "empty batch");
  std::vector<Sample> samples(n);
  std::vector<bool> held(n, false);  // found in the device cache
  for (size_t i = 0; i < n; ++i) {
    if (cache_) {
      if (auto s = cache_->get(indices[i])) {
        samples[i] = std::move(*s);
        held[i] = true;
        continue;
      }
    }
    samples[i] = read(indices[i]);
  }
  Shape is = {static_cast<int64_t>(n)}, ts = {static_cast<int64_t>(n)};
  for (int64_t d : samples[0].input.shape()) is.push_back(d);
  for (int64_t d : samples[0].target.shape()) ts.push_back(d);
  const int64_t in_n = samples[0].input.numel(), t_n = samples[0].target.numel();
  Batch out{Tensor(is, Layout::kPlain, Device::kCuda), Tensor(ts, Layout::kPlain, Device::kCuda)};
  Batch staged{Tensor::pinned(is), Tensor::pinned(ts)};  // the rows read from the dataset, page-locked
  for (size_t i = 0; i < n; ++i) {
    const Sample& s = samples[i];
    TESSERA_CHECK(s.input.numel() == in_n && s.target.numel() == t_n, "samples of different shapes");
    float* in_row = out.inputs.data() + i * in_n;
    float* t_row = out.targets.data() + i * t_n;
    if (held[i]) {  // inside the GPU
      gpu::copy(in_row, Device::kCuda, s.input.data(), Device::kCuda, in_n * sizeof(float));
      gpu::copy(t_row, Device::kCuda, s.target.data(), Device::kCuda, t_n * sizeof(float));
      continue;
    }
    float* in_stage = staged.inputs.data() + i * in_n;
    float* t_stage = staged.targets.data() + i * t_n;
    std::memcpy(in_stage, s.input.data(), in_n * sizeof(float));
    std::memcpy(t_stage, s.target.data(), t_n * sizeof(float));
    gpu::copy(in_row, Device::kCuda, in_stage, Device::kCpu, in_n * sizeof(float));  // asynchronous: pinned
    gpu::copy(t_row, Device::kCuda, t_stage, Device::kCpu, t_n * sizeof(float));
  }
  gpu::synchronize();  // this thread's copies are done before the batch is handed over (and `staged` freed)
  if (cache_)
    for (size_t i = 0; i < n; ++i)
      if (!held[i]) cache_->put(indices[i], samples[i]);
  return out;
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
      batch = load(indices);
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
