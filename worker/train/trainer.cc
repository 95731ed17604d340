#include "worker/train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "api/training_job.h"
#include "common/error.h"
#include "common/log.h"
#include "tessera/config.h"
#include "worker/core/device.h"
#include "worker/data/file_dataset.h"
#include "worker/data/tokens.h"
#include "worker/nn/batchnorm.h"
#include "worker/nn/elementwise.h"
#include "worker/nn/gpu/ops.h"
#include "worker/spatial/halo.h"
#include "worker/train/checkpoint.h"

namespace tessera {
namespace {

// Adds a batch to tally (resized to 3 x classes): the targets of each class, the predictions (the
// arg-max over dimension 1 of the output) of each class, and the correct predictions of each class.
void tally_classes(const Tensor& out, const Tensor& targets, std::vector<double>& tally) {
  const int64_t n = out.dim(0), c = out.dim(1), per = n ? out.numel() / (n * c) : 0;
  if (tally.size() < static_cast<size_t>(3 * c)) tally.resize(3 * c, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < per; ++s) {
      int64_t best = 0;
      for (int64_t k = 1; k < c; ++k)
        if (out[(i * c + k) * per + s] > out[(i * c + best) * per + s]) best = k;
      const auto t = static_cast<int64_t>(targets[i * per + s]);
      if (t < 0 || t >= c) continue;
      tally[t] += 1;
      tally[c + best] += 1;
      if (best == t) tally[2 * c + t] += 1;
    }
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

std::unique_ptr<FileDataset> open_file_dataset(const JobConfig& config, const Model& model, const std::string& dir,
                                               const std::string& field, FileSystem& remote, TieredCache* cache) {
  const DataConfig& dc = config.data;
  DatasetIndex index;
  try {
    index = read_index(dir);
  } catch (const ConfigError& e) {
    throw ConfigError("spec.dataset." + field, e.problems().front().reason);
  }
  for (auto [key, want, name, flag] : {std::tuple{index.input_key, dc.input_key, "inputKey", "--input-key"},
                                       std::tuple{index.target_key, dc.target_key, "targetKey", "--target-key"}})
    if (!want.empty() && key != want)
      throw ConfigError(
          std::string("spec.dataset.") + name,
          detail::concat("'", want, "', but '", dir, "' was indexed with ",
                         key.empty() ? std::string("unnamed .npy arrays") : "'" + key + "'", " (", index.describe(),
                         "); re-index with `tessera data index ", dir, " ", flag, " ", want, "`"));
  if (index.segmentation() != (model.task() == Task::kSegmentation))
    throw ConfigError("spec.model.name",
                      detail::concat(config.model.name, " does not train on '", dir, "' (", index.describe(), ")"));
  const auto extent = fit_sample(index.volume(), model.sample_shape(), dc.crop, dir);
  if (!index.segmentation() && index.target.shape != model.target_shape())
    throw ConfigError("spec.model.outputs",
                      detail::concat("the model predicts ", model.target_shape().at(0),
                                     " targets but the samples under '", dir, "' have ", index.target_key, " ",
                                     index.target.str(), "; set outputs: ", index.target.shape.at(0)));
  const int classes = config.model.outputs ? config.model.outputs : 3;
  if (index.segmentation() && index.classes > classes)
    throw ConfigError("spec.model.outputs",
                      detail::concat("the labels under '", dir, "' go up to ", index.classes - 1, " (", index.classes,
                                     " classes) but the model has ", classes, "; set outputs: ", index.classes));
  return std::make_unique<FileDataset>(dir, std::move(index), extent, remote, cache);
}

std::unique_ptr<Dataset> open_token_or_synthetic_dataset(const JobConfig& config, bool validation) {
  const auto& dc = config.data;
  const uint64_t seed = config.dataset.seed + (validation ? 1000003 : 0);  // disjoint from the training samples
  if (dc.format == "tokens") {
    // nanoGPT's layout: train.bin and val.bin side by side, ids below the model's vocabulary.
    const auto& mc = config.model;
    return std::make_unique<TokenDataset>(TokenFile{dc.path + (validation ? "/val.bin" : "/train.bin"), dc.token_bytes,
                                                    static_cast<uint32_t>(mc.vocab_size)},
                                          mc.context, seed, validation ? dc.validation_windows : dc.windows);
  }
  SyntheticConfig c = config.dataset;
  if (validation) c.samples = config.validation_samples;
  c.seed = seed;
  return make_synthetic(c);
}

Device resolve_device(const JobConfig& c) {
  if (c.device == "cpu") return Device::kCpu;
  const bool given_gpus = c.gpus_per_pod > 0 || std::getenv("TESSERA_GPU") != nullptr;
  if (c.device == "auto" && !given_gpus) return Device::kCpu;
  std::string why;
  if (gpu::device_count(&why) > 0) return Device::kCuda;
  const std::string asked = c.device == "cuda" ? std::string("cuda")
                                               : detail::concat("auto, and the job asks for ", c.gpus_per_pod,
                                                                " GPU(s) per pod (spec.resources.gpu)");
  throw ConfigError("spec.device", detail::concat(asked, ", but this worker sees no usable CUDA device (", why,
                                                  "); set spec.device: cpu to train on the CPU"));
}

std::string resolve_transport(const JobConfig& c, Device device) {
  const std::string& t = c.communication.transport;
  if (t == "gloo" || (t == "auto" && (device != Device::kCuda || !TESSERA_HAVE_NCCL))) return "gloo";
  if (device != Device::kCuda)
    throw ConfigError("spec.communication.transport",
                      "nccl exchanges gradients in GPU memory, but this job trains on the CPU");
  if (!TESSERA_HAVE_NCCL)
    throw ConfigError("spec.communication.transport",
                      "nccl, but this build of Tessera has no NCCL; set transport: gloo");
  return "nccl";
}

int rank_gpu_ordinal() {
  const char* v = std::getenv("TESSERA_GPU_INDEX");
  return v ? std::max(0, std::atoi(v)) : 0;
}

Trainer::Trainer(JobConfig config, CommGroups* groups, CommGroups* device_groups)
    : config_(std::move(config)), groups_(groups), device_groups_(device_groups) {
  place_replicas();
  build_model();
  open_data();
  build_optimizer();
  build_exchange();
}

Trainer::~Trainer() = default;

void Trainer::place_replicas() {
  const int world = groups_ ? groups_->topology.world_size() : 1;
  const int spatial = config_.model.spatial.size();
  if (groups_) rank_ = groups_->rank;
  // The manifest's rules (the split divides the workers, the batch divides over the replicas) were
  // checked when it was read; what is left is that the ranks that met are the job's workers (or, for
  // an elastic job, whole spatial groups of at least its minimum).
  if (!api::gang_size_fits(world, config_.workers, config_.min_workers, spatial))
    throw ConfigError(
        "spec.replicas",
        detail::concat("the job has ", config_.workers, " workers (replicas x ranksPerReplica",
                       config_.min_workers ? detail::concat(", at least ", config_.min_workers, " elastic") : "",
                       ") but ", world, " ranks met"));
  const auto& tr = config_.training;
  TESSERA_CHECK(config_.workers % spatial == 0 && tr.batch_size % (config_.workers / spatial) == 0,
                "a JobConfig the manifest rules reject: ", config_.workers, " workers, spatial groups of ", spatial,
                ", batch ", tr.batch_size);
  replicas_ = world / spatial;
  replica_ = rank_ / spatial;
  virtual_replicas_ = config_.workers / spatial;
  for (int v = replica_; v < virtual_replicas_; v += replicas_) micro_replicas_.push_back(v);
  if (tr.threads > 0) omp_set_num_threads(tr.threads);
  if (spatial > 1 && (!groups_ || !groups_->spatial || groups_->spatial->size() != spatial))
    throw ConfigError("spec.parallelism.spatial",
                      detail::concat("a spatial group of ", spatial, " ranks needs that many workers"));
}

void Trainer::build_model() {
  device_ = resolve_device(config_);
  if (device_ == Device::kCuda) gpu::set_device(rank_gpu_ordinal());
  TESSERA_CHECK(!device_groups_ || (groups_ && device_ == Device::kCuda),
                "NCCL groups for a job that does not train on CUDA");
  try {
    model_ = make_model(config_.model, groups_ ? groups_->spatial.get() : nullptr);
  } catch (const std::bad_alloc&) {
    throw ConfigError("spec.model",
                      detail::concat("its ", config_.parameters, " parameters (", config_.parameters * 8 / 1e9,
                                     " GB with their gradients) do not fit in this worker's memory"));
  }
  if (device_ == Device::kCuda && config_.model.precision != Precision::kFp32)
    throw ConfigError(
        "spec.training.precision",
        "bf16 runs on the CPU (oneDNN's bf16 kernels); on the GPU it is not available yet: set precision: "
        "fp32 or spec.device: cpu");
  if (device_ == Device::kCuda) model_->to(Device::kCuda);
  for (Layer* l : model_->layers())
    if (auto* d = dynamic_cast<Dropout*>(l)) dropouts_.push_back(d);
  // With NCCL, halos of blocks on the GPU cross between the GPUs' memories; not while buckets are
  // exchanged during the backward pass (which also has halos to exchange): two NCCL communicators in
  // use at once on different threads can deadlock when ranks issue their calls in different orders.
  if (device_groups_ && device_groups_->spatial && !config_.communication.overlap)
    for (Layer* l : model_->layers())
      if (auto* h = dynamic_cast<HaloLayer*>(l)) h->halo().set_device_comm(device_groups_->spatial.get());
  if (const Partition* p = model_->input_partition())
    for (int d = 0; d < 3; ++d) {
      box_.begin[d] = p->owned(d).begin;
      box_.end[d] = p->owned(d).end;
    }
}

namespace {

// An ImageFolder's training and validation splits, as every rank opens them.
std::pair<std::unique_ptr<ImageFolderDataset>, std::unique_ptr<ImageFolderDataset>> open_image_folder(
    const JobConfig& config, FileSystem& remote, TieredCache* cache, int rank) {
  const DataConfig& dc = config.data;
  const ImageFolderIndex index = read_image_folder_index(dc.path);
  const int classes = static_cast<int>(index.classes.size());
  const std::string counted = detail::concat(classes, classes == 1 ? " class" : " classes");
  if (config.model.outputs != classes)
    throw ConfigError("spec.model.outputs", detail::concat(config.model.outputs, " outputs, but the dataset under ",
                                                           dc.path, " has ", counted, " (", index.classes.front(),
                                                           "...", index.classes.back(), "): set outputs to ", classes));
  const ImageCacheChoice keep = choose_image_cache(index, dc.cache);
  if (rank == 0)
    log_info("images: ", index.train.size(), " to train on and ", index.val.size(), " to validate on, ", counted,
             "; the cache keeps ", keep.decoded ? "decoded pixels" : "JPEG bytes", ": ", keep.reason);
  const int size = static_cast<int>(config.model.input_size);
  using Split = ImageFolderDataset::Split;
  return {std::make_unique<ImageFolderDataset>(dc.path, index, Split::kTrain, size, config.training.seed, remote, cache,
                                               keep.decoded),
          std::make_unique<ImageFolderDataset>(dc.path, index, Split::kVal, size, config.training.seed, remote, cache,
                                               keep.decoded)};
}

}  // namespace

void Trainer::open_data() {
  const DataConfig& dc = config_.data;
  posix_ = std::make_unique<PosixFileSystem>();  // checkpoints and the data cache
  FileSystem* remote = posix_.get();
  if (dc.format == "hdf5" || dc.format == "imagefolder") {
    if (dc.remote_mbps > 0) {
      remote_fs_ = std::make_unique<ThrottledFileSystem>(
          *posix_, dc.remote_mbps, std::chrono::microseconds(static_cast<int64_t>(dc.remote_latency_ms * 1000)));
      remote = remote_fs_.get();
    }
    CacheOptions co = dc.cache;
    if (!co.ssd_dir.empty()) co.ssd_dir += "/rank" + std::to_string(rank_);  // each rank caches its own blocks
    cache_ = std::make_unique<TieredCache>(co, *posix_);
  }
  if (dc.format == "hdf5") {
    auto open = [&](const std::string& dir, const char* field) {
      auto data = open_file_dataset(config_, *model_, dir, field, *remote, cache_.get());
      files_.push_back(data.get());
      return data;
    };
    if (dc.validation_split > 0) {
      std::tie(train_, val_) = split_validation(open(dc.path, "path"), dc.validation_split, config_.training.seed);
    } else {
      train_ = open(dc.path, "path");
      if (!dc.validation_path.empty()) val_ = open(dc.validation_path, "validationPath");
    }
  } else if (dc.format == "imagefolder") {
    auto [train, val] = open_image_folder(config_, *remote, cache_.get(), rank_);
    images_ = {train.get(), val.get()};
    train_ = std::move(train);
    val_ = std::move(val);
  } else {
    train_ = open_token_or_synthetic_dataset(config_, false);
    val_ = open_token_or_synthetic_dataset(config_, true);
  }
  if (dc.device_cache_bytes > 0 && device_ == Device::kCuda)
    sample_cache_ = std::make_unique<SampleCache>(dc.device_cache_bytes, Device::kCuda);
  else if (dc.device_cache_bytes > 0 && rank_ == 0)
    log_warn("spec.cache.device has no effect: this job trains on the CPU");
  loader_ =
      std::make_unique<PrefetchLoader>(*train_, dc.loader_threads, dc.prefetch_batches, box_, device_,
                                       device_ == Device::kCuda ? gpu::current_device() : -1, sample_cache_.get());
  if (train_->input_shape() != model_->sample_shape())
    throw ConfigError("spec.dataset", detail::concat("samples of shape ", shape_str(train_->input_shape()),
                                                     " do not fit model input ", shape_str(model_->sample_shape())));
  const auto& tr = config_.training;
  steps_per_epoch_ = static_cast<int64_t>(train_->size()) / tr.batch_size;
  if (steps_per_epoch_ < 1)
    throw ConfigError("spec.dataset.samples",
                      detail::concat(train_->size(), " samples make no full batch of ", tr.batch_size));
  total_steps_ = steps_per_epoch_ * tr.epochs;
}

void Trainer::build_optimizer() {
  const auto& tr = config_.training;
  ScheduleConfig& s = config_.training.schedule;
  s.warmup_steps = static_cast<int64_t>(std::llround(tr.warmup_epochs * steps_per_epoch_));
  s.total_steps = total_steps_;
  s.milestones.clear();
  for (int64_t e : tr.milestone_epochs) s.milestones.push_back(e * steps_per_epoch_);
  if (!groups_ || !config_.communication.momentum_correction) {
    optimizer_ = make_optimizer(tr.optimizer);
    return;
  }
  // the velocity goes through the exchange: the optimiser steps by it as it comes
  velocity_ = std::make_unique<MomentumCorrection>(static_cast<float>(tr.optimizer.momentum));
  velocity_decay_ = static_cast<float>(tr.optimizer.weight_decay);
  OptimizerConfig plain = tr.optimizer;
  plain.momentum = 0;
  plain.weight_decay = 0;
  optimizer_ = make_optimizer(plain);
  if (rank_ == 0)
    log_info("momentum correction: each rank keeps SGD's velocity (momentum ", tr.optimizer.momentum,
             ") before the exchange, and a sparse exchange sends velocity");
}

void Trainer::build_exchange() {
  if (!groups_) return;
  const auto& cc = config_.communication;
  const bool hybrid = cc.strategy == "hybrid";
  // In device memory (NCCL) or on the host (the buckets staged there when the model is on the GPU).
  CommGroups& exchange_groups = device_groups_ ? *device_groups_ : *groups_;
  const Device buckets_on = device_groups_ ? Device::kCuda : Device::kCpu;
  buckets_ = std::make_unique<BucketExchange>(model_->params(), cc.bucket_bytes, cc.overlap, device_groups_ != nullptr);
  stragglers_ = std::make_unique<StragglerWatch>(*groups_);
  if (cc.strategy == "auto")
    auto_ = std::make_unique<AutoExchange>(config_, *groups_, exchange_groups, buckets_on, buckets_->bucket_sizes(),
                                           model_->cost_layers());
  // auto: the ring all-reduce until the controller's choice
  const std::string first = hybrid ? cc.sparse : auto_ ? "dense" : cc.strategy;
  schedule_.sparse = make_exchange(
      ExchangeConfig{first, cc.density, cc.selector, buckets_on, wire_type(cc.gradient_precision)}, exchange_groups);
  if (hybrid) {
    schedule_.dense =
        make_exchange(ExchangeConfig{cc.dense, cc.density, cc.selector, buckets_on, wire_type(cc.gradient_precision)},
                      exchange_groups);
    schedule_.switch_step = static_cast<int64_t>(cc.switch_at_epoch) * steps_per_epoch_;
  }
}

uint64_t Trainer::remote_bytes_read() const {
  uint64_t n = 0;
  for (const FileDataset* f : files_) n += f->remote_bytes_read();
  for (const ImageFolderDataset* f : images_) n += f->remote_bytes_read();
  return n;
}

Batch Trainer::select_held(Batch b) const {
  const auto held = model_->held_samples(b.targets.dim(0));
  if (static_cast<int64_t>(held.size()) == b.targets.dim(0)) return b;
  Shape ts = b.targets.shape();
  ts[0] = static_cast<int64_t>(held.size());
  Tensor t(ts, Layout::kPlain, b.targets.device());
  const int64_t per = b.targets.numel() / std::max<int64_t>(1, b.targets.dim(0));
  const size_t bytes = static_cast<size_t>(per) * sizeof(float);
  for (size_t i = 0; i < held.size(); ++i) {
    if (t.on_device())
      gpu::copy(t.data() + i * per, Device::kCuda, b.targets.data() + held[i] * per, Device::kCuda, bytes);
    else std::memcpy(t.data() + i * per, b.targets.data() + held[i] * per, bytes);
  }
  b.targets = t;
  return b;
}

std::vector<std::vector<uint64_t>> Trainer::epoch_schedule(int epoch, int64_t from) const {
  const auto order = epoch_order(train_->size(), config_.training.seed, epoch);
  std::vector<std::vector<uint64_t>> out;
  for (int64_t s = from; s < steps_per_epoch_; ++s)
    for (int v : micro_replicas_)
      out.push_back(shard_batch(order, s, config_.training.batch_size, v, virtual_replicas_));
  return out;
}

void Trainer::set_control(ControlAgent* agent) {
  control_ = agent;
  if (control_ && schedule_.dense) schedule_.switch_step = -1;  // the controller chooses the switch step
}

double Trainer::allreduce_weighted(double weighted_sum, double weight, bool* stop) {
  double v[3] = {weighted_sum, weight, stop && *stop ? 1.0 : 0.0};
  if (groups_) groups_->world->allreduce(std::span<double>(v, 3));
  if (stop) *stop = v[2] > 0;
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

namespace {

// Runs fn on the bucket's values on the host: in place, or for a device bucket on a copy, copied
// back after it unless `write` is false.
template <class Fn>
void with_host(std::span<float> bucket, bool on_device, Fn&& fn, bool write = true) {
  if (!on_device) return fn(bucket);
  std::vector<float> h(bucket.size());
  gpu::copy(h.data(), Device::kCpu, bucket.data(), Device::kCuda, h.size() * sizeof(float));
  fn(std::span<float>(h));
  if (write) gpu::copy(bucket.data(), Device::kCuda, h.data(), Device::kCpu, h.size() * sizeof(float));
}

}  // namespace

void Trainer::start_gradients(int micro_batches) {
  for (Param* p : model_->params()) {
    if (!velocity_ || velocity_decay_ == 0 || !p->decay) {
      p->grad.zero();
      continue;
    }
    // every rank adds its share (its micro-batches, over the ranks of a spatial group, which sum
    // one replica's gradient): summed over the gang and scaled by 1 / its virtual replicas,
    // weightDecay x w, inside the velocity as in SGD
    const float f =
        velocity_decay_ * static_cast<float>(micro_batches) / static_cast<float>(config_.model.spatial.size());
    if (p->grad.on_device()) {
      gpu::copy(p->grad.data(), Device::kCuda, p->value.data(), Device::kCuda,
                static_cast<size_t>(p->value.numel()) * sizeof(float));
      gpu::scale(p->grad.data(), static_cast<size_t>(p->grad.numel()), f);
      continue;
    }
    const float* w = p->value.data();
    float* g = p->grad.data();
    for (int64_t i = 0; i < p->value.numel(); ++i) g[i] = f * w[i];
  }
}

void Trainer::begin_exchange(StepRecord& rec) {
  if (!groups_) {
    rec.strategy = "local";
    return;
  }
  const bool dense_phase = schedule_.dense_phase(step_);
  GradientExchange* ex = &schedule_.at(step_);
  rec.strategy = ex->name();
  rec.exchange_choice = auto_ ? auto_->taken_choice() : 0;
  rec.dense = rec.strategy == "dense" || rec.strategy == "torus";
  rec.density = rec.dense ? 1.0 : config_.communication.density;
  // First dense step after the switch: what the sparse phase still owed is sent now.
  const bool flush = dense_phase && !schedule_.flushed_residuals;
  if (dense_phase) schedule_.flushed_residuals = true;
  // strategy auto: what an exchange replaced (or the checkpoint) still owed goes with this step; the
  // communication thread reads it, which the step loop clears when the step's buckets are done
  const AutoExchange* owed = auto_ && auto_->owes() ? auto_.get() : nullptr;
  const bool on_device = device_groups_ != nullptr;
  const bool mask = !rec.dense;
  // the velocity first: what the earlier exchanges owe is velocity already. Gradients on the host
  // become velocity as they are fused into the bucket (one pass); others in the bucket, here.
  const bool fill_velocity = velocity_ && buckets_->host_gradients();
  BucketExchange::Fill fill;
  if (fill_velocity)
    fill = [this](int b, size_t offset, std::span<const float> grad, std::span<float> into) {
      velocity_->accumulate_into(b, buckets_->bucket_size(static_cast<size_t>(b)), offset, grad, into);
    };
  buckets_->begin(
      [this, ex, flush, owed, on_device, mask, fill_velocity, &rec](int b, std::span<float> bucket) {
        if (velocity_ && !fill_velocity)
          with_host(bucket, on_device, [&](std::span<float> h) { velocity_->accumulate(b, h); });
        if (flush) schedule_.sparse->add_residual(b, bucket);
        if (owed) owed->add_owed(b, bucket, on_device);
        const ExchangeStats st = ex->exchange(b, bucket);
        if (velocity_ && mask)
          with_host(
              bucket, on_device, [&](std::span<float> h) { velocity_->mask(b, h); }, false);
        rec.bytes_intra += st.bytes.intra;
        rec.bytes_inter += st.bytes.inter;
        rec.select_s += st.select_seconds;
      },
      1.0f / static_cast<float>(virtual_replicas_), std::move(fill));
}

EpochRecord Trainer::validate(int epoch) {
  EpochRecord r;
  r.epoch = epoch;
  if (!val_) {
    r.validated = false;
    return r;
  }
  const int64_t n = static_cast<int64_t>(val_->size());
  const int64_t b = std::max<int64_t>(1, config_.training.batch_size / replicas_);
  double loss_sum = 0, metric_sum = 0, count = 0, top5_sum = 0;
  std::vector<double> target_sum, target_sq;
  std::vector<double> tally;  // classes: [targets of class c..., predictions of c..., correct c...]
  for (int64_t start = replica_ * b; start < n; start += b * replicas_) {
    std::vector<uint64_t> idx;
    for (int64_t i = start; i < std::min(n, start + b); ++i) idx.push_back(static_cast<uint64_t>(i));
    std::vector<Sample> samples;
    for (uint64_t i : idx) samples.push_back(box_ == VolumeBox{} ? val_->get(i) : val_->get_block(i, box_));
    Batch batch = select_held(stack_samples(samples));
    const Tensor targets = batch.targets.to(device_);
    Tensor out = model_->forward(batch.inputs.to(device_), false);
    const double k = model_->loss_share(static_cast<int64_t>(idx.size())) * static_cast<double>(idx.size());
    if (out.dim(0) == 0) continue;
    loss_sum += model_->loss(out, targets).loss * k;
    metric_sum += model_->metric(out, targets) * k;
    count += k;
    if (model_->task() != Task::kRegression) {
      const Tensor host = out.to(Device::kCpu);
      tally_classes(host, batch.targets, tally);
      if (model_->task() == Task::kClassification && host.dim(1) > 5) top5_sum += accuracy(host, batch.targets, 5) * k;
    }
    if (model_->task() == Task::kRegression) {
      const int64_t t = batch.targets.numel() / batch.targets.dim(0);
      target_sum.resize(t, 0.0);
      target_sq.resize(t, 0.0);
      for (int64_t i = 0; i < batch.targets.numel(); ++i) {
        target_sum[i % t] += batch.targets[i];
        target_sq[i % t] += double(batch.targets[i]) * batch.targets[i];
      }
    }
  }
  // Sums over replicas: [loss, metric, count, target sums..., target squares...].
  std::vector<double> v = {loss_sum, metric_sum, count};
  const size_t t = model_->task() == Task::kRegression ? static_cast<size_t>(shape_numel(model_->target_shape())) : 0;
  target_sum.resize(t, 0.0);
  target_sq.resize(t, 0.0);
  v.insert(v.end(), target_sum.begin(), target_sum.end());
  v.insert(v.end(), target_sq.begin(), target_sq.end());
  v.push_back(top5_sum);
  if (groups_) groups_->world->allreduce(std::span<double>(v));
  r.val_loss = v[0] / v[2];
  r.val_metric = v[1] / v[2];
  const double top5 = v.back() / v[2];
  // Predict-the-mean baseline: the variance of each target, averaged over targets.
  for (size_t i = 0; i < t; ++i) {
    const double mean = v[3 + i] / v[2];
    r.baseline_loss += (v[3 + t + i] / v[2] - mean * mean) / static_cast<double>(t);
  }
  if (model_->task() != Task::kRegression) {
    // Every rank sums the same classes, also one that validated nothing.
    int64_t classes = static_cast<int64_t>(tally.size() / 3);
    if (groups_) groups_->world->allreduce(&classes, 1, DType::kInt64, ReduceOp::kMax, Millis(0));
    tally.resize(3 * static_cast<size_t>(classes), 0.0);
    if (groups_) groups_->world->allreduce(std::span<double>(tally));
    const size_t c = static_cast<size_t>(classes);
    double total = 0, most = 0;
    for (size_t k = 0; k < c; ++k) {
      total += tally[k];
      most = std::max(most, tally[k]);
    }
    r.baseline_metric = total > 0 ? most / total : 0.0;
    if (model_->task() == Task::kClassification && classes > 5) r.val_top5 = top5;
    if (model_->task() == Task::kSegmentation)
      for (size_t k = 0; k < c; ++k) {
        const double joined = tally[k] + tally[c + k] - tally[2 * c + k];
        r.iou.push_back(joined > 0 ? tally[2 * c + k] / joined : 1.0);  // a class absent and never predicted: perfect
      }
  }
  return r;
}

void Trainer::save(int64_t next_step) {
  CheckpointData d;
  d.counters["step"] = next_step;
  d.counters["optimizer_steps"] = optimizer_->steps();
  d.counters["flushed_residuals"] = schedule_.flushed_residuals;
  // The gang that wrote it, and where this rank's residuals lie in their buckets: a gang of another
  // size (elastic) re-shards them.
  d.counters["world"] = groups_ ? groups_->world->size() : 1;
  auto host = [](const Tensor& t) {
    const Tensor h = t.to(Device::kCpu);
    return std::vector<float>(h.span().begin(), h.span().end());
  };
  for (Param* p : model_->params()) d.arrays["param/" + p->name] = host(p->value);
  for (auto& [name, t] : optimizer_->state()) d.arrays["opt/" + name] = host(t);
  for (Layer* l : model_->layers())
    if (auto* bn = dynamic_cast<BatchNorm*>(l)) {
      d.arrays["bn/" + l->name() + "/mean"] = host(bn->running_mean());
      d.arrays["bn/" + l->name() + "/var"] = host(bn->running_var());
    }
  // auto: once the dense phase has sent the sparse phase's residuals, a restore must not send them again
  if (schedule_.sparse && !(auto_ && schedule_.flushed_residuals))
    for (auto& [b, r] : schedule_.sparse->residuals()) {
      d.arrays["residual/" + std::to_string(b)] = r;
      d.counters["residual_offset/" + std::to_string(b)] =
          static_cast<int64_t>(schedule_.sparse->residual_offset(buckets_->bucket_size(b)));
    }
  if (velocity_)
    for (const auto& [b, u] : velocity_->velocities()) d.arrays["velocity/" + std::to_string(b)] = u;
  try {
    write_checkpoint(*posix_, config_.checkpoint.path, next_step, rank_, d);
  } catch (const Error& e) {
    const auto kept = latest_checkpoint(config_.checkpoint.path, rank_);
    throw Error(detail::concat(
        "the checkpoint of step ", next_step, " was not written (", e.what(), "); ",
        kept ? detail::concat("the one of step ", *kept, " is kept") : std::string("there is no older one"),
        ". Free space under spec.checkpoint.path (", config_.checkpoint.path, ") or point it elsewhere"));
  }
  prune_checkpoints(*posix_, config_.checkpoint.path, rank_, config_.checkpoint.keep);
}

void Trainer::restore() {
  if (config_.checkpoint.path.empty()) return;
  const AgreedCheckpoint c = agree_checkpoint(*posix_, config_.checkpoint.path, rank_, config_.min_workers > 0,
                                              groups_ ? groups_->world.get() : nullptr);
  if (c.step < 0) return;
  restore_model(c);
  const int world = groups_ ? groups_->world->size() : 1;
  const auto w = c.data.counters.find("world");
  const int64_t writers = w == c.data.counters.end() ? world : w->second;  // older checkpoints: this gang
  if (writers != world && rank_ == 0)
    log_info("step ", c.step, " was written by a gang of ", writers, " ranks; this one has ", world,
             ": its error-feedback residuals are re-sharded, none dropped");
  restore_residuals(c, writers);
  restore_velocity(c, writers);
  optimizer_->set_steps(c.data.counters.at("optimizer_steps"));
  schedule_.flushed_residuals = c.data.counters.count("flushed_residuals") && c.data.counters.at("flushed_residuals");
  step_ = c.data.counters.at("step");
  log_info("restored checkpoint ", c.file, ": resuming at step ", step_);
}

ConfigError Trainer::mismatch(const AgreedCheckpoint& c, const std::string& what) const {
  return ConfigError(
      "spec.checkpoint.path",
      detail::concat("'", c.file, "' was written by another configuration of the job: ", what,
                     ". To start afresh, remove the job's checkpoints (`tessera run --fresh`) or set a new "
                     "spec.checkpoint.path"));
}

void Trainer::restore_model(const AgreedCheckpoint& c) {
  auto load = [&](const std::string& key, Tensor& into) {
    auto it = c.data.arrays.find(key);
    if (it == c.data.arrays.end()) throw mismatch(c, "it has no '" + key + "' (did spec.model change?)");
    if (static_cast<int64_t>(it->second.size()) != into.numel())
      throw mismatch(c, detail::concat("its '", key, "' has ", it->second.size(), " values, this model's ",
                                       into.numel(), " (did spec.model change?)"));
    Tensor h(into.shape());
    std::memcpy(h.data(), it->second.data(), it->second.size() * sizeof(float));
    into.copy_from(h);  // on the device, where the model trains there
  };
  for (Param* p : model_->params()) load("param/" + p->name, p->value);
  for (const auto& [key, v] : c.data.arrays) {
    if (key.rfind("opt/", 0) != 0) continue;
    Tensor t(Shape{static_cast<int64_t>(v.size())});
    std::memcpy(t.data(), v.data(), v.size() * sizeof(float));
    // Optimiser state keeps the shape of its parameter.
    const std::string name = key.substr(4);
    for (Param* p : model_->params())
      if (name.rfind(p->name + "/", 0) == 0) t = t.reshape(p->value.shape());
    optimizer_->state()[name] = t;
  }
  for (Layer* l : model_->layers())
    if (auto* bn = dynamic_cast<BatchNorm*>(l)) {
      load("bn/" + l->name() + "/mean", bn->running_mean());
      load("bn/" + l->name() + "/var", bn->running_var());
    }
}

void Trainer::restore_residuals(const AgreedCheckpoint& c, int64_t writers) {
  const int world = groups_ ? groups_->world->size() : 1;
  const bool resharded = writers != world;
  std::map<int, std::vector<float>> residuals;
  if (resharded && schedule_.sparse) {
    // The ranks of rank 0's node hold the sum: under hitopk their shards cover each bucket once;
    // otherwise each holds a whole bucket, and rank 0 alone keeps it.
    const size_t probe = buckets_->size() ? buckets_->bucket_size(0) : 0;
    const bool sharded = probe > 0 && schedule_.sparse->residual_size(probe) != probe;
    const bool holds =
        rank_ == 0 || (sharded && groups_->topology.node_index(rank_) == groups_->topology.node_index(0));
    residuals = reshard_residuals(*posix_, config_.checkpoint.path, c.step, static_cast<int>(writers),
                                  buckets_->bucket_sizes(), *schedule_.sparse, holds);
  } else if (!resharded) {
    for (const auto& [key, v] : c.data.arrays)
      if (key.rfind("residual/", 0) == 0) residuals[std::stoi(key.substr(9))] = v;
  }
  const std::string changed = " does not fit this job's gradient buckets (was spec.communication.bucketSize changed?)";
  if (auto_) {
    // Whatever exchange wrote them, the residuals go with the first step, each at its place in its
    // bucket (re-sharded ones: at this rank's offset of the exchange in use).
    for (auto& [b, v] : residuals) {
      const auto off = c.data.counters.find("residual_offset/" + std::to_string(b));
      const size_t offset = resharded || off == c.data.counters.end() ? 0 : static_cast<size_t>(off->second);
      if (b < 0 || static_cast<size_t>(b) >= buckets_->size() ||
          offset + v.size() > buckets_->bucket_size(static_cast<size_t>(b)))
        throw mismatch(c, detail::concat("its error-feedback residual of bucket ", b, " (", v.size(), " entries at ",
                                         offset, ")", changed));
      auto_->owe(b, offset, std::move(v));
    }
    return;
  }
  for (const auto& [b, v] : residuals)
    if (!schedule_.sparse || b < 0 || static_cast<size_t>(b) >= buckets_->size() ||
        v.size() != schedule_.sparse->residual_size(buckets_->bucket_size(b)))
      throw mismatch(c,
                     detail::concat("its error-feedback residual of bucket ", b, " (", v.size(), " entries)", changed));
  if (schedule_.sparse) schedule_.sparse->restore_residuals(residuals);
}

void Trainer::restore_velocity(const AgreedCheckpoint& c, int64_t writers) {
  if (!velocity_) return;
  const int world = groups_ ? groups_->world->size() : 1;
  // A gang of another size: rank 0 takes the writers' sum (the sum is the gang's momentum), the
  // others start from none.
  std::map<int, std::vector<float>> velocities;
  if (writers != world) {
    if (rank_ == 0)
      for (auto& [b, v] : summed_bucket_arrays(*posix_, config_.checkpoint.path, c.step, static_cast<int>(writers),
                                               buckets_->bucket_sizes(), "velocity"))
        velocities[b] = std::vector<float>(v.begin(), v.end());
    velocity_->restore(std::move(velocities));
    return;
  }
  for (const auto& [key, v] : c.data.arrays) {
    if (key.rfind("velocity/", 0) != 0) continue;
    const int b = std::stoi(key.substr(9));
    if (b < 0 || static_cast<size_t>(b) >= buckets_->size() ||
        v.size() != buckets_->bucket_size(static_cast<size_t>(b)))
      throw mismatch(
          c, detail::concat(
                 "its momentum-correction velocity of bucket ", b, " (", v.size(),
                 " entries) does not fit this job's gradient buckets (was spec.communication.bucketSize changed?)"));
    velocities[b] = v;
  }
  velocity_->restore(std::move(velocities));
}

namespace {

// The timings of the steps since the last progress line.
class ProgressWindow {
 public:
  void add(const StepRecord& rec) {
    sum_.data_s += rec.data_s;
    sum_.forward_s += rec.forward_s;
    sum_.backward_s += rec.backward_s;
    sum_.comm_s += rec.comm_s;
    sum_.comm_total_s += rec.comm_total_s;
    sum_.update_s += rec.update_s;
    ++steps_;
    samples_ += rec.global_batch;
  }
  double seconds() const { return seconds_since(start_); }
  // "epoch 2/4 step 10/20 | 812 samples/s | loss ... | comm exposed 12 of 30 ms/step", and a new window.
  std::string take_line(const StepRecord& last, int epochs, int64_t total_steps, bool overlapped) {
    const double since = seconds();
    const StepRecord& w = sum_;
    const double total = w.data_s + w.forward_s + w.backward_s + w.comm_s + w.update_s;
    auto pct = [&](double v) { return static_cast<int>(std::lround(100 * v / std::max(total, 1e-12))); };
    auto per_step_ms = [&](double v) { return static_cast<int>(std::lround(1000 * v / steps_)); };
    const std::string line = detail::concat(
        "epoch ", last.epoch + 1, "/", epochs, " step ", last.step + 1, "/", total_steps, " | ",
        static_cast<int>(samples_ / since), " samples/s | loss ", last.loss, " | lr ", last.lr, " | ", last.strategy,
        " | data ", pct(w.data_s), "% fwd ", pct(w.forward_s), "% bwd ", pct(w.backward_s), "% comm ", pct(w.comm_s),
        "% update ", pct(w.update_s), "% | comm exposed ", per_step_ms(w.comm_s), " of ", per_step_ms(w.comm_total_s),
        " ms/step", overlapped ? " (overlapped)" : "");
    *this = ProgressWindow{};
    return line;
  }

 private:
  Clock::time_point start_ = Clock::now();
  StepRecord sum_;
  int64_t steps_ = 0, samples_ = 0;
};

}  // namespace

void Trainer::log_start() const {
  if (rank_ != 0) return;
  const auto& tr = config_.training;
  const int local_batch = tr.batch_size / virtual_replicas_;
  const std::string elastic =
      replicas_ != virtual_replicas_
          ? detail::concat(" (", virtual_replicas_, " micro-batches of ", local_batch, " over ", replicas_,
                           " replicas: elastic, the job's ", virtual_replicas_, " replicas' batch kept)")
          : "";
  const std::string switching = schedule_.switch_step >= 0 ? detail::concat(" (switch to ", config_.communication.dense,
                                                                            " at step ", schedule_.switch_step, ")")
                                                           : "";
  const std::string where = device_ == Device::kCuda
                                ? detail::concat(", on CUDA device ", gpu::current_device(),
                                                 !groups_         ? ""
                                                 : device_groups_ ? " (gradients exchanged by NCCL)"
                                                                  : " (gradients exchanged through host memory)")
                                : ", on the CPU";
  log_info("training ", model_->name(), " (", model_->num_params(), " parameters, ", model_->forward_flops() / 1e9,
           " GFLOP per sample forward on this rank) on ", replicas_ * config_.model.spatial.size(), " rank(s) (",
           config_.model.spatial.size(), " spatial x ", replicas_, " data-parallel): ", tr.epochs, " epochs x ",
           steps_per_epoch_, " steps, global batch ", tr.batch_size, elastic, ", strategy ",
           config_.communication.strategy, switching, where, ", in ", precision_name(config_.model.precision),
           config_.model.precision == Precision::kBf16
               ? (bf16_native() ? " (native bf16 instructions)" : " (bf16 emulated on AVX-512)")
               : "",
           groups_ ? ", gradients sent in " + config_.communication.gradient_precision : std::string());
}

void Trainer::heartbeat(int epoch, TrainSummary& summary) {
  // auto: rank 0 reports the calibration once the first steps are timed
  const GangCalibration* cal = auto_ && rank_ == 0 ? auto_->take_report() : nullptr;
  const ControlAgent::Answer a = control_->heartbeat({step_, epoch, steps_per_epoch_, last_loss_, last_sps_,
                                                      stragglers_ ? stragglers_->report() : StragglerReport{}, cal},
                                                     stop_flag_);
  const int64_t s = a.switch_step;
  if ((schedule_.dense || auto_) && schedule_.switch_step < 0 && s >= 0) {
    schedule_.switch_step = s;
    summary.switch_step = s;
    if (rank_ == 0 && schedule_.dense)
      log_info("the controller chose step ", s, " to switch to ", schedule_.dense->name());
  }
  if (auto_) auto_->offer(a.exchange);
}

std::pair<double, double> Trainer::compute(StepRecord& rec) {
  const int local_batch =
      config_.training.batch_size / virtual_replicas_;  // a micro-batch: one virtual replica's share
  const int micro = rec.micro_batches;
  start_gradients(micro);
  // The replica's micro-batches (one unless an elastic gang shrank): their gradients add up, and
  // the last one's backward pass sends the buckets.
  const double share = model_->loss_share(local_batch);
  double loss_sum = 0, loss_weight = 0;
  for (int m = 0; m < micro; ++m) {
    double data_s = 0;
    Batch batch = select_held(loader_->next(&data_s));
    rec.data_s += data_s;
    batch.inputs.adopt_stream();  // on the GPU: made on a loader thread's stream, used last on this one
    batch.targets.adopt_stream();
    auto t0 = Clock::now();
    for (Dropout* d : dropouts_) d->set_call(static_cast<uint64_t>(step_));
    Tensor out = model_->forward(batch.inputs.to(device_), true);
    LossResult loss = model_->loss(out, batch.targets.to(device_));
    // The loss is a mean over the terms this rank computed (its samples, or its block's voxels); the
    // gradient of the replica's mean is that scaled by their share (1 without spatial parallelism).
    if (share != 1.0 && loss.grad.on_device())
      gpu::scale(loss.grad.data(), static_cast<size_t>(loss.grad.numel()), static_cast<float>(share));
    else if (share != 1.0)
      for (float& g : loss.grad.span()) g *= static_cast<float>(share);
    rec.forward_s += seconds_since(t0);
    t0 = Clock::now();
    const bool last = m + 1 == micro;
    if (last) begin_exchange(rec);
    model_->backward(loss.grad,
                     last && buckets_ ? buckets_->hook() : nullptr);  // with overlap, buckets leave as they are ready
    rec.backward_s += seconds_since(t0);
    loss_sum += (out.dim(0) ? loss.loss : 0.0) * (share * local_batch);
    loss_weight += share * local_batch;
  }
  return {loss_sum, loss_weight};
}

bool Trainer::finish_step(StepRecord& rec, std::pair<double, double> loss) {
  const auto& tr = config_.training;
  auto t0 = Clock::now();
  const double waited = buckets_ ? buckets_->finish() : 0.0;
  if (auto_) auto_->clear_owed();  // sent with this step's buckets
  bool stop = stop_flag_ && stop_flag_->load();
  rec.loss = allreduce_weighted(loss.first, loss.second, &stop);
  rec.comm_s = seconds_since(t0);
  // All of the step's communication: the buckets' work on the communication thread, or what the step
  // waited for them if that was longer (the thread waiting for a core), plus the loss all-reduce.
  rec.comm_total_s = std::max(buckets_ ? buckets_->busy_seconds() : 0.0, waited) + (rec.comm_s - waited);

  t0 = Clock::now();
  auto params = model_->params();
  if (tr.grad_clip > 0) clip_grad_norm(params, tr.grad_clip);
  rec.lr = learning_rate(config_.training.schedule, step_);
  optimizer_->step(params, rec.lr);
  rec.update_s = seconds_since(t0);
  if (!std::isfinite(rec.loss))
    throw NumericError(detail::concat("training diverged: loss is ", rec.loss, " at step ", step_,
                                      " (lower spec.training.optimizer.learningRate or set spec.training.gradClip)"));
  last_loss_ = rec.loss;
  const double step_s = rec.data_s + rec.forward_s + rec.backward_s + rec.comm_s + rec.update_s;
  last_sps_ = tr.batch_size / std::max(1e-9, step_s);
  auto ms = [](double s) { return Fixed{1e3 * s, 1}; };
  log_debug("step ", step_ + 1, ": data ", ms(rec.data_s), " ms, forward ", ms(rec.forward_s), " ms, backward ",
            ms(rec.backward_s), " ms, communication ", ms(rec.comm_s), " ms exposed of ", ms(rec.comm_total_s),
            " ms (selection ", ms(rec.select_s), " ms), update ", ms(rec.update_s), " ms");
  return stop;
}

void Trainer::after_step(const StepRecord& rec, TrainSummary& summary) {
  const double compute_s = rec.forward_s + rec.backward_s + rec.update_s;
  // auto: a step's compute from the run's first steps, then the choice: the controller's, from rank
  // 0's report; or, for a gang without a controller, every rank's own from the same figures, from
  // the next step.
  auto choose_here = [&] {
    summary.exchange_reason = auto_->choose_here(step_, schedule_, steps_per_epoch_, total_steps_, rank_);
    summary.switch_step = schedule_.switch_step;
  };
  if (auto_ && auto_->add_step_compute(rec.step - summary.first_step, compute_s) && !control_) choose_here();
  const double step_s = rec.data_s + rec.forward_s + rec.backward_s + rec.comm_s + rec.update_s;
  if (stragglers_ && stragglers_->after_step(compute_s, step_s) && rank_ == 0) {
    const StragglerReport& s = stragglers_->report();
    if (s.ranks.empty()) log_info("no rank holds the gang back any more");
    else log_warn("straggler: ", s.message);
  }
  // auto: links that changed are measured again, and the exchange chosen again from them
  if (auto_ && stragglers_->take_link_change() && auto_->remeasure_links(rank_) && !control_ && auto_->calibrated())
    choose_here();
}

void Trainer::checkpoint_if_due(StepRecord& rec, TrainSummary& summary, bool stop) {
  // Asked to stop (SIGTERM): the last step of the run is this one, which every rank checkpoints.
  summary.stopped = stop && step_ < total_steps_;
  const auto& ck = config_.checkpoint;
  if (ck.path.empty()) return;
  if (!((ck.every_steps > 0 && step_ % ck.every_steps == 0) || step_ == total_steps_ || summary.stopped)) return;
  const auto t_save = Clock::now();
  save(step_);
  rec.checkpoint_s = seconds_since(t_save);
  summary.checkpointed = summary.stopped;
}

void Trainer::end_epoch(int epoch, TrainSummary& summary) {
  summary.last_epoch = validate(epoch + 1);
  if (on_epoch) on_epoch(summary.last_epoch);
  if (rank_ != 0) return;
  if (cache_) {
    const auto c = cache_->counters();
    log_info("data cache: memory ", c.hits[0], " hits, SSD ", c.hits[1], " hits, remote ", c.hits[2], " reads (",
             c.bytes[2] / 1e6, " MB)",
             c.ssd_write_failures ? detail::concat(", ", c.ssd_write_failures, " SSD write failures") : "");
  }
  const auto& e = summary.last_epoch;
  if (!e.validated) {
    log_info("epoch ", epoch + 1, ": no validation set (spec.dataset.validationPath or validationSplit gives one)");
    return;
  }
  const std::string scale =  // what the figures compare with
      model_->task() == Task::kRegression ? detail::concat(", predict-the-mean baseline ", e.baseline_loss, " (",
                                                           e.val_loss / std::max(e.baseline_loss, 1e-12), "x)")
                                          : class_scores_text(e.baseline_metric, e.iou);
  log_info("epoch ", epoch + 1, " validation: loss ", e.val_loss, ", ", model_->metric_name(), " ", e.val_metric,
           e.val_top5 >= 0 ? detail::concat(", top-5 ", e.val_top5) : "", scale);
}

TrainSummary Trainer::run() {
  restore();
  // auto: the links and the sparse exchanges' CPU costs now; a step's compute from the first steps
  if (auto_) auto_->calibrate_links();
  TrainSummary summary;
  summary.first_step = step_;
  summary.switch_step = schedule_.switch_step;
  const auto& tr = config_.training;
  const auto t_start = Clock::now();
  ProgressWindow window;
  log_start();
  while (step_ < total_steps_) {
    const int epoch = static_cast<int>(step_ / steps_per_epoch_);
    if (epoch != loader_epoch_) {
      if (!images_.empty())
        images_[0]->set_epoch(epoch);  // the loader is idle: the last epoch's batches are all consumed
      loader_->start(epoch_schedule(epoch, step_ % steps_per_epoch_));
      loader_epoch_ = epoch;
    }
    if (control_) heartbeat(epoch, summary);
    if (auto_) auto_->apply_due(step_, schedule_, rank_);
    if (schedule_.dense && schedule_.switch_step >= 0 && step_ == schedule_.switch_step && rank_ == 0)
      log_info("switching gradient exchange ", schedule_.sparse->name(), " -> ", schedule_.dense->name(), " at step ",
               step_, " (epoch ", epoch, ")");
    StepRecord rec;
    rec.step = step_;
    rec.epoch = epoch;
    rec.global_batch = tr.batch_size;
    rec.micro_batches = static_cast<int>(micro_replicas_.size());
    const bool stop = finish_step(rec, compute(rec));
    ++step_;
    after_step(rec, summary);
    window.add(rec);
    if (rank_ == 0 && (window.seconds() >= tr.log_every_seconds || step_ == total_steps_))
      log_info(window.take_line(rec, tr.epochs, total_steps_, buckets_ && buckets_->overlap()));
    checkpoint_if_due(rec, summary, stop);
    if (on_step) on_step(rec);
    if (summary.stopped) {
      if (rank_ == 0)
        log_info("stopping at step ", step_, " of ", total_steps_, " on request (SIGTERM), agreed by every rank",
                 summary.checkpointed
                     ? detail::concat("; checkpoint of step ", step_, " written in ", Fixed{rec.checkpoint_s, 2}, " s")
                     : std::string("; no checkpoint: spec.checkpoint.path is not set"));
      break;
    }
    if (step_ % steps_per_epoch_ == 0) end_epoch(epoch, summary);
  }
  if (summary.first_step == total_steps_ && total_steps_ > 0) {
    // Restored at the last step: nothing to train, but the summary still reports the trained model.
    if (rank_ == 0) log_info("the checkpoint is at the last step (", total_steps_, "): nothing left to train");
    summary.last_epoch = validate(tr.epochs);
  }
  summary.steps = step_;
  summary.exchange = auto_ ? auto_->chosen() : std::string();
  summary.seconds = seconds_since(t_start);
  summary.samples_per_second = (step_ - summary.first_step) * tr.batch_size / std::max(summary.seconds, 1e-9);
  return summary;
}

}  // namespace tessera
