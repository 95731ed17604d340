// WorkerMetrics: what one rank exports to Prometheus (prometheus-cpp), served as text at /metrics.
// Every series carries job, namespace, rank and node; the other labels take a fixed, small set of
// values (stage, strategy, link, tier), so nothing grows without bound. docs/observability.md
// lists each metric and its meaning. Updated by the training thread once per step; read by the
// HTTP thread. Thread-safe.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>

#include "worker/data/sample_cache.h"
#include "worker/data/tiered_cache.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
}  // namespace prometheus

namespace tessera {

struct StepRecord;

struct WorkerIdentity {
  std::string job, namespace_, node, pod;
  int rank = 0;
};

class WorkerMetrics {
 public:
  explicit WorkerMetrics(const WorkerIdentity& who);
  ~WorkerMetrics();

  // One training step of this rank (its stages, loss, learning rate, bytes, density and phase):
  // `samples` is its share of the global batch (the sum over ranks is the job's samples).
  void observe_step(const StepRecord& step, double samples);
  void observe_checkpoint(double seconds);
  // The data cache's counters and the bytes held in its memory and SSD tiers.
  void observe_cache(const TieredCache::Counters& c, int64_t memory_bytes, int64_t ssd_bytes);
  // All of a Trainer's step record: the step, its checkpoint, and the cache (null: none).
  void observe(const StepRecord& step, double samples, const TieredCache* cache,
               const SampleCache* device_cache = nullptr);
  // The cache of whole samples in GPU memory: tier "device" of the cache series.
  void observe_device_cache(const SampleCache::Counters& c, int64_t bytes);

  // The Prometheus text exposition of every series.
  std::string text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* samples_;
  std::array<prometheus::Histogram*, 5> stage_;  // data, forward, backward, comm, update
  prometheus::Histogram* checkpoint_;
  prometheus::Histogram* comm_total_;
  prometheus::Gauge *density_, *phase_, *loss_, *lr_, *step_;
  std::array<prometheus::Counter*, 3> hits_, read_bytes_;
  std::array<prometheus::Counter*, 2> misses_;
  std::array<prometheus::Gauge*, 2> held_bytes_;
  prometheus::Counter *device_hits_ = nullptr, *device_misses_ = nullptr;
  prometheus::Gauge* device_held_ = nullptr;
  std::map<std::string, std::array<prometheus::Counter*, 2>>
      comm_;  // strategy -> {intra, inter}; guarded by Families::mu
  struct Families;
  std::unique_ptr<Families> families_;
};

}  // namespace tessera
