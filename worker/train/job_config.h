// The worker's view of a training job: the `spec` of a TrainingJob manifest (or the spec alone),
// parsed and validated. Every problem is a ConfigError naming the field path.
#pragma once

#include <string>

#include "worker/comm/exchange.h"
#include "worker/core/config_node.h"
#include "worker/data/dataset.h"
#include "worker/data/tiered_cache.h"
#include "worker/models/model.h"
#include "worker/nn/optim.h"

namespace tessera {

struct CommunicationConfig {
  std::string strategy = "dense";  // dense | torus | topk | hitopk | hybrid
  std::string sparse = "hitopk";   // hybrid: the strategy of the first epochs (topk | hitopk)
  std::string dense = "torus";     // hybrid: the strategy after the switch (dense | torus)
  double density = 0.01;
  int switch_at_epoch = 1;         // hybrid: first dense epoch
  std::string selector = "mstopk";
  int64_t bucket_bytes = 25 << 20; // gradients are fused into buckets of at most this size
  int64_t timeout_ms = 120000;     // deadline of every collective
};

struct CheckpointConfig {
  std::string path;          // empty: no checkpoints
  int64_t every_steps = 0;   // 0: only at the end
  int keep = 2;              // newest checkpoints kept per rank
};

struct TrainingConfig {
  int epochs = 1;
  int batch_size = 8;        // global: summed over data-parallel replicas
  OptimizerConfig optimizer;
  ScheduleConfig schedule;   // base_lr from optimizer.learningRate; epochs turned into steps by the trainer
  double warmup_epochs = 0;
  std::vector<int64_t> milestone_epochs;
  double grad_clip = 0;      // max global gradient norm; 0 = off
  int threads = 0;           // compute threads per rank; 0 = OpenMP default
  double log_every_seconds = 5;
  uint64_t seed = 1;         // data order
};

struct DataConfig {
  std::string format = "synthetic";  // synthetic | hdf5
  std::string path, validation_path; // hdf5: directories with a manifest.tsv
  CacheOptions cache;                // spec.cache: memory, localSSD.{path, sizeLimit}
  double remote_mbps = 0;            // emulate a slow remote tier (dataset.remoteThrottle.mbps); 0: off
  double remote_latency_ms = 0;
  int loader_threads = 2;            // training.loaderThreads
  int prefetch_batches = 4;          // training.prefetchBatches
};

struct JobConfig {
  std::string name = "job";
  ModelConfig model;               // model.spatial: parallelism.spatial
  int data_replicas = 0;           // parallelism.data; 0: world size / spatial group size
  SyntheticConfig dataset;         // synthetic data (data.format == synthetic)
  DataConfig data;
  uint64_t validation_samples = 64;
  TrainingConfig training;
  CommunicationConfig communication;
  CheckpointConfig checkpoint;
};

// Reads a manifest (kind TrainingJob: uses metadata.name and spec) or a bare spec.
JobConfig parse_job_config(const ConfigNode& root);
JobConfig load_job_config(const std::string& file);

}  // namespace tessera
