// The TrainingJob API (tessera.dev/v1alpha1): the manifest users write, read by the controller (to
// place, launch and watch the job) and by every worker (to train it). This is the one parser of a
// manifest and the one place its defaults live, so the two sides cannot disagree. It depends on
// common/ only; crds/trainingjobs.tessera.dev.yaml carries the same schema for the API server.
//
// Reading a manifest reports every problem at once, each with its field path and reason
// ("spec.parallelism.spatial.d: 3 does not divide the 4 workers"). Rules that belong to one model
// (CosmoFlow needs a power-of-two input size) are the model's, checked where it is built.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config_node.h"

namespace tessera::api {

inline constexpr const char* kApiVersion = "tessera.dev/v1alpha1";
inline constexpr const char* kKind = "TrainingJob";

struct ResourcesSpec {
  int gpu = 0;         // per pod; 0: the ranks train on CPU
  double cpu = 0;      // cores requested per pod; 0: none requested
  int64_t memory = 0;  // bytes requested per pod; 0: none requested
};

struct ModelSpec {
  std::string name = "cosmoflow";                        // cosmoflow | unet3d | cnn2d | resnet50 | transformer
  int input_size = 32;                                   // W: input C x W^3 (cnn2d: C x W^2)
  int context = 256, width = 256, depth = 4, heads = 4;  // transformer
  int in_channels = 0;                                   // 0: the model's default
  int base_channels = 0;                                 // 0: the model's default
  int max_channels = 256;
  std::vector<int64_t> hidden;  // fully connected widths (cosmoflow, cnn2d); empty: the model's default
  int outputs = 0;              // 0: the model's default
  double dropout = 0;
  double leaky_slope = 0.3;
  bool batch_norm = false;
  uint64_t seed = 1;
  std::string weight_init;            // uniform (PyTorch's default) | heNormal; empty: the model's own
  std::string bias_init = "uniform";  // uniform (PyTorch's default) | zero
};

// A directory every pod of the job mounts: exactly one source. Empty kind: none given.
struct VolumeSpec {
  std::string kind;        // hostPath | persistentVolumeClaim | nfs
  std::string path;        // hostPath and nfs: the directory
  std::string server;      // nfs
  std::string claim_name;  // persistentVolumeClaim
  bool given() const { return !kind.empty(); }
};

struct DatasetSpec {
  std::string format = "synthetic";  // synthetic | hdf5 | tokens | imagefolder
  std::string synthetic;             // cosmo | shapes | images; empty: the model's (cosmoflow: cosmo, ...)
  uint64_t samples = 256;            // synthetic: training samples; tokens: windows an epoch (0: all side by side)
  uint64_t validation_samples = 64;  // synthetic: validation samples; tokens: validation windows (0: all)
  uint64_t seed = 1;
  std::string path,
      validation_path;          // hdf5: directories with a manifest.tsv; tokens: the directory of train.bin and val.bin
  int token_bytes = 2;          // tokens: 2 (uint16) or 4 (uint32)
  int64_t vocab_size = 0;       // tokens: every id is below it
  double validation_split = 0;  // hdf5: the fraction of path held out for validation; 0: none
  bool crop = false;            // hdf5: train on sub-volumes of model.inputSize that tile each file's volume
  std::string input_key, target_key;  // hdf5: the array names the directories were indexed with; empty: any
  double remote_mbps = 0;             // remoteThrottle: emulate a slow remote tier; 0: off
  double remote_latency_ms = 0;
  VolumeSpec volume;  // in a cluster: what is mounted (read-only) at path and validationPath
};

struct OptimizerSpec {
  std::string name = "sgd";  // sgd | adam | adamw | lars
  double learning_rate = 0.01;
  double momentum = 0.9;  // sgd, lars
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double trust = 0.001;                           // lars
};

struct ScheduleSpec {
  double warmup_epochs = 0;
  std::string decay = "none";       // none | step | cosine | poly
  std::vector<int64_t> milestones;  // step decay: epochs at which the rate is multiplied by gamma
  double gamma = 0.1;
  double power = 2.0;            // poly
  double min_learning_rate = 0;  // cosine and poly floor
};

struct TrainingSpec {
  int epochs = 1;
  int batch_size = 8;  // global: summed over data-parallel replicas
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  double grad_clip = 0;  // max global gradient norm; 0: off
  // Classifiers: the cross-entropy's target puts 1 - eps on the label, eps / C on each class.
  double label_smoothing = 0;
  // fp32 | bf16: bf16 as torch.autocast(bfloat16) means it: convolutions and matrix products take
  // bf16 inputs and accumulate in fp32; everything else, weights and optimiser state stay fp32.
  std::string precision = "fp32";
  int threads = 0;  // compute threads per rank; 0: the launcher's or OpenMP's choice
  double log_every_seconds = 5;
  uint64_t seed = 1;  // data order
  int loader_threads = 2;
  int prefetch_batches = 4;
};

struct ParallelismSpec {
  int d = 1, h = 1, w = 1;  // spatial split of each sample
  int data = 0;             // data-parallel replicas; 0: workers / (d*h*w)
  int spatial_size() const { return d * h * w; }
};

struct CommunicationSpec {
  // auto | dense | torus | topk | hitopk | hybrid (auto, the default: the controller chooses)
  std::string strategy = "auto";
  std::string sparse = "hitopk";  // hybrid: the strategy of the first epochs (topk | hitopk)
  std::string dense = "torus";    // hybrid: the strategy from the switch on (dense | torus)
  double density = 0.01;
  int switch_at_epoch = 1;          // hybrid: the first dense epoch; auto: the latest (default: half the epochs)
  std::string selector = "mstopk";  // mstopk | exact
  int64_t bucket_bytes = 25 << 20;  // gradients are fused into buckets of at most this size
  bool overlap = true;              // buckets are exchanged during the backward pass
  int64_t timeout_ms = 120000;      // deadline of every collective
  // How a job on the GPU exchanges gradients: nccl (device memory), gloo (staged through host
  // memory), or auto (nccl where the job trains on CUDA and NCCL was built, gloo otherwise).
  std::string transport = "auto";
  // SGD's momentum kept by each rank before the exchange (Deep Gradient Compression's momentum
  // correction): what a sparse exchange sends is velocity, and a sent entry's velocity restarts.
  // Default: on where sgd (momentum > 0, not Nesterov, no gradClip) may exchange sparsely.
  bool momentum_correction = false;
  // fp32 | bf16: how gradient values travel. bf16 halves dense and torus's bytes (summed in bf16
  // along the rings) and sends the sparse strategies' values as bf16 (6-byte pairs), their residuals
  // kept in fp32. Default: the training precision.
  std::string gradient_precision = "fp32";
};

struct CacheSpec {
  int64_t memory_bytes = int64_t{1} << 30;  // tier 0; 0: none
  int64_t device_bytes = 0;                 // whole samples in GPU memory, before tier 0 (jobs on CUDA); 0: none
  std::string ssd_path;                     // tier 1 directory; empty: none
  std::string ssd_volume = "hostPath";      // in a cluster: hostPath | emptyDir
  int64_t ssd_bytes = int64_t{10} << 30;
  std::string nfs_server, nfs_path;  // tier 2 in a cluster: the NFS export mounted at dataset.path
};

struct Toleration {
  std::string key, op = "Equal", value, effect;  // op: Equal | Exists; empty key with Exists: all taints
};

struct PlacementSpec {
  std::map<std::string, std::string> node_selector;
  std::vector<Toleration> tolerations;
  std::vector<std::string> topology_keys = {"topology.kubernetes.io/zone", "kubernetes.io/hostname"};
};

struct CheckpointSpec {
  std::string path;         // empty: no checkpoints
  int64_t every_steps = 0;  // 0: only at the end
  int keep = 2;             // newest checkpoints kept per rank
  VolumeSpec volume;        // in a cluster: the shared volume mounted at path
};

struct RunPolicy {
  int backoff_limit = 3;                    // gang restarts before the job fails
  int64_t active_deadline_seconds = 0;      // 0: none
  int64_t ttl_seconds_after_finished = -1;  // -1: kept
  int64_t start_timeout_seconds = 300;      // how long a pod's containers may wait to start (image pull, creation)
  int64_t termination_grace_period_seconds = 30;  // the pods' grace period: SIGTERM to SIGKILL
  bool restart_in_place = true;  // a failed rank restarts the gang's ranks in their pods (else new pods)
  bool suspend = false;
};

// Elastic data parallelism: the job goes on with fewer data-parallel replicas (at least
// min_replicas pods, whole spatial groups), keeping its global batch by accumulating gradients.
struct ElasticSpec {
  int min_replicas = 0;  // 0: not elastic (the gang is always spec.replicas pods)
};

// The virtual cluster of `tessera run`: nodes with GPU slots (one per rank). Defaults: one node
// per replica, with one slot per rank of a replica.
struct LocalSpec {
  int nodes = 0;          // 0: replicas
  int gpus_per_node = 0;  // 0: ranksPerReplica
  std::string work_dir;   // logs, status, SSD cache; empty: .tessera/<name>
  // An emulated cloud network (the tessera-netns program): each virtual node in its own network
  // namespace, its link limited to network_rate (tc, "1gbit") and delayed by network_delay
  // ("0.2ms", where the kernel has netem). Empty: every worker on loopback.
  std::string network_rate, network_delay;
};

struct TrainingJobSpec {
  int replicas = 1;
  int ranks_per_replica = 1;
  ResourcesSpec resources;
  std::string image = "tessera/worker:0.1.0";  // the chart's appVersion (scripts/images.sh builds it)
  // Where the layers and the exchange's arithmetic run: auto (CUDA where the pod was given GPUs,
  // else the CPU), cuda, or cpu.
  std::string device = "auto";
  ModelSpec model;
  DatasetSpec dataset;
  TrainingSpec training;
  ParallelismSpec parallelism;
  CommunicationSpec communication;
  CacheSpec cache;
  PlacementSpec placement;
  CheckpointSpec checkpoint;
  RunPolicy run_policy;
  ElasticSpec elastic;
  LocalSpec local;

  int workers() const { return replicas * ranks_per_replica; }
  int data_replicas() const { return workers() / parallelism.spatial_size(); }
};

struct TrainingJob {
  std::string name;
  std::string namespace_ = "default";
  TrainingJobSpec spec;
};

// A manifest read with every problem found (empty: valid). The job holds the defaults for every
// field that was absent or wrong.
struct ParsedJob {
  TrainingJob job;
  std::vector<FieldProblem> problems;
  // Fields that are valid but have no effect where they stand (communication.sparse with a strategy
  // other than hybrid, ...): reported, never silently ignored; `tessera validate --strict` makes
  // them problems.
  std::vector<FieldProblem> warnings;
  bool ok() const { return problems.empty(); }
};

ParsedJob parse_training_job(const ConfigNode& root);

// Whether the optimizer applies momentum to the exchanged (summed) gradient: sgd without momentum
// correction and lars, with a momentum above 0. communication.strategy auto then takes no sparse
// phase unless switchAtEpoch is set.
bool momentum_after_exchange(const TrainingSpec& t, const CommunicationSpec& c);
// Whether communication.strategy may exchange sparsely: every strategy but dense and torus.
bool may_exchange_sparsely(const std::string& strategy);
// Why communication.momentumCorrection cannot serve this optimizer (it needs sgd with momentum above
// 0, not Nesterov, without gradClip), or "" where it can.
std::string momentum_correction_refusal(const std::string& optimizer, double momentum, bool nesterov, double grad_clip);
// communication.momentumCorrection's default: on where the strategy may exchange sparsely and the
// optimizer can be served.
bool momentum_correction_default(const std::string& strategy, const std::string& optimizer, double momentum,
                                 bool nesterov, double grad_clip);
// Reads a file; a file that cannot be read or parsed is one problem naming the file.
ParsedJob read_training_job(const std::string& file);
// read_training_job, throwing one ConfigError listing every problem.
TrainingJob load_training_job(const std::string& file);

// Whether a gang of `world` ranks may train a job of `workers` ranks (spec.replicas x
// spec.ranksPerReplica): all of them, or for an elastic job (`min_workers` > 0: spec.elastic.
// minReplicas x ranksPerReplica) whole spatial groups of `spatial` ranks, at least min_workers.
bool gang_size_fits(int world, int workers, int min_workers, int spatial);

// A path of a `tessera run` job (spec.checkpoint.path, spec.cache.ssdPath): as given when absolute
// or empty, else inside the job's work directory, so a run's state goes where its logs go.
std::string under_work_dir(const std::string& path, const std::string& work_dir);

}  // namespace tessera::api
