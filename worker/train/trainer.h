// Trainer: the data-parallel step loop of one rank.
//
// Ranks form data-parallel replicas of spatial groups (world = spatial x data; a group of one rank
// without spatial parallelism). Each step: take this replica's part of the global batch (under
// spatial parallelism, this rank's block of each sample), forward, loss, backward, fuse the
// gradients into buckets, exchange them with the configured strategy (hybrid: the sparse one, then
// the dense one from the switch step on, which every rank computes identically), average, clip,
// optimiser update. With communication.overlap the buckets are exchanged on a second thread while
// the backward pass goes on (BucketExchange), and the step waits only for what is still in flight.
// Records per-step timings (data wait, forward, backward, communication, update), prints a progress
// line, checkpoints every N steps (atomically; a restarted rank resumes from the newest step every
// rank has: agree_checkpoint) and validates at the end of each epoch. Every few seconds the ranks
// measure their links and compute (StragglerWatch) and report a rank or node that holds them back;
// under strategy auto the exchange is chosen from measured figures (AutoExchange).
// A Trainer is driven by one thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "common/error.h"
#include "worker/comm/topology.h"
#include "worker/compress/momentum_correction.h"
#include "worker/data/file_dataset.h"
#include "worker/data/image_folder.h"
#include "worker/data/loader.h"
#include "worker/train/auto_exchange.h"
#include "worker/train/bucket_exchange.h"
#include "worker/train/calibration.h"
#include "worker/train/checkpoint.h"
#include "worker/train/control_agent.h"
#include "worker/train/job_config.h"
#include "worker/train/straggler.h"

namespace tessera {

class Dropout;

struct StepRecord {
  int64_t step = 0;  // 0-based global step
  int epoch = 0;
  double loss = 0;  // mean over the global batch
  double lr = 0;
  std::string strategy;         // exchange strategy used this step
  int64_t exchange_choice = 0;  // strategy auto: the choices the gang has taken by this step (0: none yet)
  double data_s = 0, forward_s = 0, backward_s = 0, update_s = 0;
  double comm_s = 0;                          // communication the step waited for (exposed), after the backward pass
  double comm_total_s = 0;                    // all communication of the step, overlapped with backward or not
  double select_s = 0;                        // of which error feedback and top-k selection (sparse strategies)
  uint64_t bytes_intra = 0, bytes_inter = 0;  // this rank, this step
  bool dense = true;                          // the exchange was dense (dense, torus or a single process)
  double density = 1;                         // fraction of gradient entries the exchange sent
  double checkpoint_s = 0;                    // writing this rank's checkpoint after the step (0: none)
  int64_t global_batch = 0;                   // samples of the step over all replicas (spec.training.batchSize)
  int micro_batches = 1;                      // this replica's micro-batches (more than 1 when an elastic gang shrank)
};

struct EpochRecord {
  int epoch = 0;
  bool validated = true;       // false: the job has no validation set, and the figures below are not set
  double val_loss = 0;         // mean validation loss
  double val_metric = 0;       // MAE (regression) or accuracy
  double val_top5 = -1;        // classifiers of more than 5 classes: top-5 accuracy; -1 otherwise
  double baseline_loss = 0;    // predict-the-mean MSE on the validation set (regression only)
  double baseline_metric = 0;  // accuracy of always predicting the most frequent class (classification, segmentation)
  std::vector<double> iou;     // segmentation: intersection over union of each class
};

struct TrainSummary {
  int64_t first_step = 0;  // where this run started (after a restore)
  int64_t steps = 0;       // last step + 1
  double seconds = 0;
  double samples_per_second = 0;
  int64_t switch_step = -1;  // hybrid: the first dense step
  std::string exchange;      // strategy auto: the exchange chosen ("hitopk at density 0.01, then torus"); empty: none
  std::string exchange_reason;  // and why, where this gang chose it (without a controller)
  EpochRecord last_epoch;
  // The run stopped on request (set_stop_flag) before its last step: every rank stopped after step
  // `steps` - 1, and checkpointed that step unless the job has no spec.checkpoint.path.
  bool stopped = false;
  bool checkpointed = false;
};

// Opens an indexed dataset directory (spec.dataset.<field>) for the job's model, as every rank does:
// ConfigError at the field that names it when it is missing or not indexed, at spec.dataset.inputKey
// or targetKey when it was indexed with other array names, and at the model's field when the model
// does not fit its samples (task, channels, inputSize and spec.dataset.crop, outputs).
std::unique_ptr<FileDataset> open_file_dataset(const JobConfig& config, const Model& model, const std::string& dir,
                                               const std::string& field, FileSystem& remote, TieredCache* cache);

// The samples of a job whose dataset needs neither the model nor a cache, for training or for
// validation, as every rank opens them: format tokens (windows of train.bin or val.bin) or generated
// ones (synthetic; the validation samples from another seed).
std::unique_ptr<Dataset> open_token_or_synthetic_dataset(const JobConfig& config, bool validation);

// Where this rank trains (spec.device): cpu, or cuda where the job says cuda, or says auto and the pod
// was given GPUs (spec.resources.gpu, TESSERA_GPU). A job that wants CUDA on a worker that sees no
// usable device is a ConfigError at spec.device saying why, and that `device: cpu` trains on the
// CPU.
Device resolve_device(const JobConfig& config);
// How the gradients of a job training on `device` cross between ranks (spec.communication.transport):
// "nccl" (device memory) or "gloo" (host memory; staged there from the GPU). ConfigError at
// spec.communication.transport when nccl is asked for a job on the CPU or a build without NCCL.
std::string resolve_transport(const JobConfig& config, Device device);
// The CUDA device of this rank: the TESSERA_GPU_INDEX-th the process sees (its slot's GPU among the
// pod's), else 0.
int rank_gpu_ordinal();

class Trainer {
 public:
  // groups: the rank's communicators, or null for a single process. device_groups: NCCL's, over
  // the same ranks, when the gradients are exchanged in device memory (resolve_transport).
  Trainer(JobConfig config, CommGroups* groups, CommGroups* device_groups = nullptr);
  ~Trainer();

  TrainSummary run();

  // Lets the controller decide (the hybrid switch step) and see progress; not owned.
  void set_control(ControlAgent* agent);
  // A flag that asks the run to stop (a signal handler sets it; not owned). The ranks agree on it
  // with the step's loss all-reduce: after the first step whose all-reduce one rank entered with the
  // flag set, every rank checkpoints that step and run() returns with `stopped`.
  void set_stop_flag(const std::atomic<bool>* flag) { stop_flag_ = flag; }

  // Called after each step (and its checkpoint, if one was written).
  std::function<void(const StepRecord&)> on_step;
  std::function<void(const EpochRecord&)> on_epoch;
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t switch_step() const { return schedule_.switch_step; }
  // The data cache of an hdf5 dataset (null for synthetic data): its counters feed the metrics.
  const TieredCache* cache() const { return cache_.get(); }
  // The cache of whole samples in GPU memory (spec.cache.device), or null.
  const SampleCache* sample_cache() const { return sample_cache_.get(); }
  Device device() const { return device_; }
  // Bytes read from the remote dataset directory (file chunks, before decompression).
  uint64_t remote_bytes_read() const;

 private:
  // The constructor's parts, in order: the gang's replicas, the model on its device, the datasets
  // and their loader, the optimiser (and momentum correction's velocity), the exchange.
  void place_replicas();
  void build_model();
  void open_data();
  void build_optimizer();
  void build_exchange();

  // The steps of run(), in order.
  void log_start() const;
  // Reports progress to the controller and takes its decisions (the switch step, auto's choice).
  void heartbeat(int epoch, TrainSummary& summary);
  // The replica's micro-batches: forward, loss, backward; the last one's backward pass sends the
  // buckets. Returns the loss summed as (weighted sum, weight).
  std::pair<double, double> compute(StepRecord& rec);
  // Waits for the exchange, agrees on the loss (and on stopping: returned), updates the weights.
  bool finish_step(StepRecord& rec, std::pair<double, double> loss);
  // After the step: auto's calibration and choice, stragglers, links that changed.
  void after_step(const StepRecord& rec, TrainSummary& summary);
  // A checkpoint when one is due (every_steps, the last step, or a stop).
  void checkpoint_if_due(StepRecord& rec, TrainSummary& summary, bool stop);
  void end_epoch(int epoch, TrainSummary& summary);

  // Starts a step's gradients: zero, or under momentum correction the weight decay of this rank's
  // share of the step (summed over the ranks and scaled by the exchange: weightDecay x w).
  void start_gradients(int micro_batches);
  // Starts the step's exchange: which strategy, and what each bucket's send does.
  void begin_exchange(StepRecord& rec);
  EpochRecord validate(int epoch);
  // The weighted mean over the ranks of what each holds as (weighted sum, weight); *stop: whether any
  // rank asked to stop (in: this rank's flag, out: the gang's).
  double allreduce_weighted(double weighted_sum, double weight, bool* stop = nullptr);
  // Keeps the targets of the samples whose outputs this rank produces (spatial parallelism).
  Batch select_held(Batch batch) const;
  // The replica's batches of `epoch` from in-epoch step `from` on.
  std::vector<std::vector<uint64_t>> epoch_schedule(int epoch, int64_t from) const;

  // Checkpoints (worker/train/checkpoint.h): this rank's state after `next_step` - 1, and the
  // gang's agreed step restored.
  void save(int64_t next_step);
  void restore();
  // The parts of a restore: the model's and optimiser's state; the error-feedback residuals (and
  // momentum correction's velocities) of a gang of `writers` ranks.
  void restore_model(const AgreedCheckpoint& c);
  void restore_residuals(const AgreedCheckpoint& c, int64_t writers);
  void restore_velocity(const AgreedCheckpoint& c, int64_t writers);
  // A checkpoint of another configuration of the job: its configuration, not a fault.
  ConfigError mismatch(const AgreedCheckpoint& c, const std::string& what) const;

  // What the job is, and where this rank stands in its gang.
  JobConfig config_;
  CommGroups* groups_;
  CommGroups* device_groups_;                  // null: gradients exchanged in host memory
  int rank_ = 0, replicas_ = 1, replica_ = 0;  // data-parallel replicas; each is a spatial group
  // The job's data-parallel replicas (spec.replicas' gang); fewer run (replicas_) when an elastic gang
  // shrank, each training the micro-batches of the virtual replicas micro_replicas_ every step.
  int virtual_replicas_ = 1;
  std::vector<int> micro_replicas_;

  // The model.
  Device device_ = Device::kCpu;  // of the model, its gradients and the optimiser's state
  std::unique_ptr<Model> model_;
  std::vector<Dropout*> dropouts_;  // the model's: their masks follow the step

  // The data.
  std::unique_ptr<FileSystem> posix_, remote_fs_;
  std::unique_ptr<TieredCache> cache_;
  std::unique_ptr<SampleCache> sample_cache_;
  std::unique_ptr<Dataset> train_, val_;
  std::vector<const FileDataset*> files_;    // the file datasets under train_ and val_
  std::vector<ImageFolderDataset*> images_;  // format imagefolder: train_ and val_
  std::unique_ptr<PrefetchLoader> loader_;
  VolumeBox box_;  // this rank's block of each sample (empty: whole samples)

  // The optimiser. communication.momentumCorrection (with an exchange): SGD's velocity, kept per rank
  // before the exchange; the optimiser then steps without momentum or weight decay (the decay is in
  // the velocity).
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<MomentumCorrection> velocity_;
  float velocity_decay_ = 0;

  // The exchange (none for a single process). Under strategy auto (auto_ set) the schedule is the
  // controller's choice, and until it comes the dense strategy alone.
  ExchangeSchedule schedule_;
  std::unique_ptr<AutoExchange> auto_;
  std::unique_ptr<BucketExchange> buckets_;
  std::unique_ptr<StragglerWatch> stragglers_;

  // The run.
  int64_t steps_per_epoch_ = 0, total_steps_ = 0, step_ = 0;
  int loader_epoch_ = -1;                // the epoch the loader serves
  double last_loss_ = 0, last_sps_ = 0;  // the last step's, reported to the controller
  ControlAgent* control_ = nullptr;
  const std::atomic<bool>* stop_flag_ = nullptr;
};

}  // namespace tessera
