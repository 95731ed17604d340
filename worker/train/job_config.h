// The worker's view of a training job: a TrainingJob manifest, read by the API's parser
// (api/training_job.h: every field, its default and its validation) and turned into the runtime's
// configuration types. Problems are ConfigErrors naming the field path.
#pragma once

#include <string>

#include "api/training_job.h"
#include "worker/comm/exchange.h"
#include "worker/data/dataset.h"
#include "worker/data/tiered_cache.h"
#include "worker/models/model.h"
#include "worker/nn/optim.h"

namespace tessera {

// The manifest's sections the trainer uses as they are.
using CommunicationConfig = api::CommunicationSpec;
using CheckpointConfig = api::CheckpointSpec;

struct TrainingConfig {
  int epochs = 1;
  int batch_size = 8;  // global: summed over data-parallel replicas
  OptimizerConfig optimizer;
  ScheduleConfig schedule;  // base_lr from optimizer.learningRate; epochs turned into steps by the trainer
  double warmup_epochs = 0;
  std::vector<int64_t> milestone_epochs;
  double grad_clip = 0;  // max global gradient norm; 0 = off
  int threads = 0;       // compute threads per rank; 0 = OpenMP default
  double log_every_seconds = 5;
  uint64_t seed = 1;  // data order
};

struct DataConfig {
  std::string format = "synthetic";  // synthetic | hdf5 | tokens | imagefolder
  std::string path,
      validation_path;  // hdf5: directories indexed by `tessera data index`; tokens: path holds train.bin and val.bin
  int token_bytes = 2;  // tokens: 2 (uint16) or 4 (uint32)
  uint64_t windows = 0, validation_windows = 0;  // tokens: samples an epoch and in validation (0: all side by side)
  double validation_split = 0;                   // hdf5 without validation_path: the fraction of path held out; 0: none
  bool crop = false;                  // samples: sub-volumes of the model's input size tiling each file's volume
  std::string input_key, target_key;  // the array names the job expects the index to record; empty: any
  CacheOptions cache;                 // spec.cache: memory, localSSD.{path, sizeLimit}
  int64_t device_cache_bytes = 0;     // spec.cache.device: whole samples in GPU memory
  double remote_mbps = 0;             // emulate a slow remote tier (dataset.remoteThrottle.mbps); 0: off
  double remote_latency_ms = 0;
  int loader_threads = 2;    // training.loaderThreads
  int prefetch_batches = 4;  // training.prefetchBatches
};

struct JobConfig {
  std::string name = "job";
  int workers = 1;              // spec.replicas x spec.ranksPerReplica
  int min_workers = 0;          // spec.elastic.minReplicas x ranksPerReplica: the fewest a gang may
                                // train on; 0: not elastic (always `workers`)
  std::string device = "auto";  // spec.device: auto | cuda | cpu
  int gpus_per_pod = 0;         // spec.resources.gpu
  ModelConfig model;            // model.spatial: parallelism.spatial
  SyntheticConfig dataset;      // synthetic data (data.format == synthetic)
  DataConfig data;
  uint64_t validation_samples = 64;
  TrainingConfig training;
  CommunicationConfig communication;
  CheckpointConfig checkpoint;
  int64_t parameters = 0;  // the model's, counted without allocating them
};

// The runtime configuration of a valid job; checks what only the model knows (ConfigError on
// spec.model.*, e.g. an input size the architecture cannot take).
JobConfig make_job_config(const api::TrainingJob& job);
// Reads and validates a manifest file (one ConfigError listing every problem), then make_job_config.
JobConfig load_job_config(const std::string& file);

}  // namespace tessera
