#include "worker/train/job_config.h"

namespace tessera {
namespace {

void set_model(const api::TrainingJobSpec& s, JobConfig& j) {
  j.model.name = s.model.name;
  j.model.input_size = s.model.input_size;
  j.model.in_channels = s.model.in_channels;
  j.model.base_channels = s.model.base_channels;
  j.model.max_channels = s.model.max_channels;
  j.model.hidden.assign(s.model.hidden.begin(), s.model.hidden.end());
  j.model.outputs = s.model.outputs;
  j.model.dropout = static_cast<float>(s.model.dropout);
  j.model.leaky_slope = static_cast<float>(s.model.leaky_slope);
  j.model.batchnorm = s.model.batch_norm;
  j.model.init.weights = s.model.weight_init == "heNormal"  ? ParamInit::Weights::kHeNormal
                         : s.model.weight_init == "uniform" ? ParamInit::Weights::kUniform
                                                            : ParamInit::Weights::kDefault;
  j.model.init.biases = s.model.bias_init == "zero" ? ParamInit::Biases::kZero : ParamInit::Biases::kUniform;
  j.model.seed = s.model.seed;
  j.model.spatial = SpatialGrid{s.parallelism.d, s.parallelism.h, s.parallelism.w};
  j.model.vocab_size = static_cast<int>(s.dataset.vocab_size);
  j.model.context = s.model.context;
  j.model.width = s.model.width;
  j.model.depth = s.model.depth;
  j.model.heads = s.model.heads;
  j.model.label_smoothing = s.training.label_smoothing;
  j.model.precision = parse_precision(s.training.precision);
}

void set_data(const api::TrainingJobSpec& s, JobConfig& j) {
  j.dataset.kind = s.dataset.synthetic;
  j.dataset.size = s.model.input_size;
  j.dataset.samples = s.dataset.samples;
  j.dataset.seed = s.dataset.seed;
  if (s.model.outputs && j.dataset.kind != "cosmo") j.dataset.classes = s.model.outputs;
  if (j.dataset.kind == "images")
    j.dataset.channels = s.model.in_channels ? s.model.in_channels : s.model.name == "resnet50" ? 3 : 1;
  j.validation_samples = s.dataset.validation_samples;
  j.data.format = s.dataset.format;
  j.data.path = s.dataset.path;
  j.data.token_bytes = s.dataset.token_bytes;
  if (s.dataset.format == "tokens") {
    j.data.windows = s.dataset.samples;
    j.data.validation_windows = s.dataset.validation_samples;
  }
  j.data.validation_path = s.dataset.validation_path;
  j.data.validation_split = s.dataset.validation_split;
  j.data.crop = s.dataset.crop;
  j.data.input_key = s.dataset.input_key;
  j.data.target_key = s.dataset.target_key;
  j.data.remote_mbps = s.dataset.remote_mbps;
  j.data.remote_latency_ms = s.dataset.remote_latency_ms;
  j.data.cache.memory_bytes = s.cache.memory_bytes;
  j.data.device_cache_bytes = s.cache.device_bytes;
  j.data.cache.ssd_dir = s.cache.ssd_path;
  j.data.cache.ssd_bytes = s.cache.ssd_bytes;
  j.data.loader_threads = s.training.loader_threads;
  j.data.prefetch_batches = s.training.prefetch_batches;
}

void set_training(const api::TrainingJobSpec& s, JobConfig& j) {
  auto& tr = j.training;
  tr.epochs = s.training.epochs;
  tr.batch_size = s.training.batch_size;
  tr.grad_clip = s.training.grad_clip;
  tr.threads = s.training.threads;
  tr.log_every_seconds = s.training.log_every_seconds;
  tr.seed = s.training.seed;
  const api::OptimizerSpec& o = s.training.optimizer;
  tr.optimizer.name = o.name;
  tr.optimizer.momentum = o.momentum;
  tr.optimizer.nesterov = o.nesterov;
  tr.optimizer.weight_decay = o.weight_decay;
  tr.optimizer.beta1 = o.beta1;
  tr.optimizer.beta2 = o.beta2;
  tr.optimizer.eps = o.eps;
  tr.optimizer.trust = o.trust;
  const api::ScheduleSpec& sc = s.training.schedule;
  tr.schedule.base_lr = o.learning_rate;
  tr.schedule.decay = sc.decay;
  tr.schedule.gamma = sc.gamma;
  tr.schedule.power = sc.power;
  tr.schedule.min_lr = sc.min_learning_rate;
  tr.warmup_epochs = sc.warmup_epochs;
  tr.milestone_epochs = sc.milestones;
}

}  // namespace

JobConfig make_job_config(const api::TrainingJob& job) {
  const api::TrainingJobSpec& s = job.spec;
  JobConfig j;
  j.name = job.name;
  j.workers = s.workers();
  j.min_workers = s.elastic.min_replicas * s.ranks_per_replica;
  j.device = s.device;
  j.gpus_per_pod = s.resources.gpu;
  set_model(s, j);
  set_data(s, j);
  set_training(s, j);
  j.communication = s.communication;
  j.checkpoint = s.checkpoint;

  // What only the model knows: build it once on one rank, its tensors without storage (a model of
  // any size is checked without allocating it), and check its spatial split's rule.
  ModelConfig single = j.model;
  single.spatial = SpatialGrid{};
  try {
    ShapeOnlyTensors shapes_only;
    j.parameters = make_model(single)->num_params();
    check_spatial_grid(j.model);
  } catch (const ConfigError& e) {
    std::vector<FieldProblem> problems = e.problems();
    for (auto& p : problems) p.field = "spec." + p.field;
    throw ConfigError(problems);
  }
  return j;
}

JobConfig load_job_config(const std::string& file) { return make_job_config(api::load_training_job(file)); }

}  // namespace tessera
