#include "api/training_job.h"

#include <regex>

namespace tessera::api {
namespace {

constexpr int64_t kMaxInt = 1 << 30;

// spec.dataset.volume / spec.checkpoint.volume: one of hostPath, persistentVolumeClaim, nfs.
VolumeSpec parse_volume(const ConfigNode& v) {
  v.allow_only({"hostPath", "persistentVolumeClaim", "nfs"});
  VolumeSpec s;
  int sources = 0;
  if (v.has("hostPath")) {
    ++sources;
    ConfigNode h = v.child("hostPath");
    h.allow_only({"path"});
    s.kind = "hostPath";
    s.path = h.str("path", "");
    if (s.path.empty()) h.problem("path", "required for a hostPath volume");
  }
  if (v.has("persistentVolumeClaim")) {
    ++sources;
    ConfigNode c = v.child("persistentVolumeClaim");
    c.allow_only({"claimName"});
    s.kind = "persistentVolumeClaim";
    s.claim_name = c.str("claimName", "");
    if (s.claim_name.empty()) c.problem("claimName", "required for a persistentVolumeClaim volume");
  }
  if (v.has("nfs")) {
    ++sources;
    ConfigNode n = v.child("nfs");
    n.allow_only({"server", "path"});
    s.kind = "nfs";
    s.server = n.str("server", "");
    s.path = n.str("path", "");
    if (s.server.empty()) n.problem("server", "required for an NFS volume");
    if (s.path.empty()) n.problem("path", "required for an NFS volume");
  }
  if (sources > 1) v.problem("", "give exactly one of hostPath, persistentVolumeClaim and nfs");
  return s;
}

ModelSpec parse_model(const ConfigNode& m) {
  m.allow_only({"name", "inputSize", "inChannels", "baseChannels", "maxChannels", "hidden", "outputs", "dropout",
                "leakySlope", "batchNorm", "seed", "weightInit", "biasInit", "context", "width", "depth", "heads"});
  ModelSpec s;
  s.name = m.choice("name", s.name, {"cosmoflow", "unet3d", "cnn2d", "resnet50", "transformer"});
  s.context = static_cast<int>(m.integer("context", s.context, 1, 1 << 16));
  s.width = static_cast<int>(m.integer("width", s.width, 1, 1 << 16));
  s.depth = static_cast<int>(m.integer("depth", s.depth, 1, 1024));
  s.heads = static_cast<int>(m.integer("heads", s.heads, 1, 1024));
  if (s.width % s.heads != 0) m.problem("heads", detail::concat(s.heads, " heads do not divide width ", s.width));
  s.input_size = static_cast<int>(m.integer("inputSize", s.input_size, 4, 4096));
  s.in_channels = static_cast<int>(m.integer("inChannels", s.in_channels, 1, 4096));
  s.base_channels = static_cast<int>(m.integer("baseChannels", s.base_channels, 1, 4096));
  s.max_channels = static_cast<int>(m.integer("maxChannels", s.max_channels, 1, 65536));
  s.hidden = m.integers("hidden", s.hidden, 1, 1 << 20);
  s.outputs = static_cast<int>(m.integer("outputs", s.outputs, 1, 1 << 20));
  s.dropout = m.number("dropout", s.dropout, {0, 1, false, true});
  s.leaky_slope = m.number("leakySlope", s.leaky_slope, Interval::closed(0, 1));
  s.batch_norm = m.boolean("batchNorm", s.batch_norm);
  s.seed = static_cast<uint64_t>(m.integer("seed", 1, 0, INT64_MAX));
  s.weight_init = m.choice("weightInit", s.weight_init, {"uniform", "heNormal"});
  s.bias_init = m.choice("biasInit", s.bias_init, {"uniform", "zero"});
  return s;
}

DatasetSpec parse_dataset(const ConfigNode& d) {
  d.allow_only({"format", "synthetic", "samples", "validationSamples", "seed", "path", "validationPath",
                "validationSplit", "crop", "inputKey", "targetKey", "remoteThrottle", "volume", "tokenBytes",
                "vocabSize"});
  DatasetSpec s;
  s.format = d.choice("format", s.format, {"synthetic", "hdf5", "tokens", "imagefolder"});
  s.synthetic = d.choice("synthetic", "", {"cosmo", "shapes", "images"});
  const bool tokens = s.format == "tokens";  // windows: all that fit unless given
  s.samples = static_cast<uint64_t>(d.integer("samples", tokens ? 0 : 256, 1, INT64_MAX));
  s.validation_samples = static_cast<uint64_t>(d.integer("validationSamples", tokens ? 0 : 64, 1, INT64_MAX));
  s.token_bytes = static_cast<int>(d.integer("tokenBytes", 2, 2, 4));
  if (s.token_bytes == 3) d.problem("tokenBytes", "3 is not a token size: 2 (uint16) or 4 (uint32)");
  s.vocab_size = d.integer("vocabSize", 0, 1, s.token_bytes == 2 ? 65536 : (int64_t{1} << 24));
  s.seed = static_cast<uint64_t>(d.integer("seed", 1, 0, INT64_MAX));
  s.path = d.str("path", "");
  s.validation_path = d.str("validationPath", "");
  s.validation_split = d.number("validationSplit", 0, {0, 1, true, true});
  s.crop = d.boolean("crop", false);
  s.input_key = d.str("inputKey", "");
  s.target_key = d.str("targetKey", "");
  ConfigNode rt = d.child("remoteThrottle");
  rt.allow_only({"mbps", "latencyMs"});
  s.remote_mbps = rt.number("mbps", 0, Interval::at_least(0));
  s.remote_latency_ms = rt.number("latencyMs", 0, Interval::at_least(0));
  if (d.has("volume")) s.volume = parse_volume(d.child("volume"));
  return s;
}

TrainingSpec parse_training(const ConfigNode& t) {
  t.allow_only({"epochs", "batchSize", "optimizer", "schedule", "gradClip", "labelSmoothing", "precision", "threads",
                "logEverySeconds", "seed", "loaderThreads", "prefetchBatches"});
  TrainingSpec s;
  s.epochs = static_cast<int>(t.integer("epochs", s.epochs, 1, 1000000));
  s.batch_size = static_cast<int>(t.integer("batchSize", s.batch_size, 1, 1 << 24));
  s.grad_clip = t.number("gradClip", 0, Interval::at_least(0));
  s.label_smoothing = t.number("labelSmoothing", 0, {0, 1, false, true});
  s.precision = t.choice("precision", s.precision, {"fp32", "bf16"});
  s.threads = static_cast<int>(t.integer("threads", 0, 0, 4096));
  s.log_every_seconds = t.number("logEverySeconds", s.log_every_seconds, Interval::above(0));
  s.seed = static_cast<uint64_t>(t.integer("seed", 1, 0, INT64_MAX));
  s.loader_threads = static_cast<int>(t.integer("loaderThreads", s.loader_threads, 1, 256));
  s.prefetch_batches = static_cast<int>(t.integer("prefetchBatches", s.prefetch_batches, 1, 4096));

  ConfigNode o = t.child("optimizer");
  o.allow_only({"name", "learningRate", "momentum", "nesterov", "weightDecay", "beta1", "beta2", "eps", "trust"});
  auto& op = s.optimizer;
  op.name = o.choice("name", op.name, {"sgd", "adam", "adamw", "lars"});
  op.learning_rate = o.number("learningRate", op.learning_rate, Interval::above(0));
  op.momentum = o.number("momentum", op.momentum, {0, 1, false, true});
  op.nesterov = o.boolean("nesterov", false);
  op.weight_decay = o.number("weightDecay", 0, Interval::at_least(0));
  op.beta1 = o.number("beta1", op.beta1, {0, 1, false, true});
  op.beta2 = o.number("beta2", op.beta2, {0, 1, false, true});
  op.eps = o.number("eps", op.eps, Interval::above(0));
  op.trust = o.number("trust", op.trust, Interval::above(0));

  ConfigNode sc = t.child("schedule");
  sc.allow_only({"warmupEpochs", "decay", "milestones", "gamma", "power", "minLearningRate"});
  auto& sch = s.schedule;
  sch.warmup_epochs = sc.number("warmupEpochs", 0, Interval::at_least(0));
  sch.decay = sc.choice("decay", sch.decay, {"none", "step", "cosine", "poly"});
  sch.milestones = sc.integers("milestones", {}, 1, 1000000);
  sch.gamma = sc.number("gamma", sch.gamma, {0, 1, true, false});
  sch.power = sc.number("power", sch.power, Interval::above(0));
  sch.min_learning_rate = sc.number("minLearningRate", 0, Interval::at_least(0));
  if (sch.min_learning_rate > op.learning_rate)
    sc.problem("minLearningRate",
               detail::concat(sch.min_learning_rate, " is above the learning rate (", op.learning_rate, ")"));
  if (sch.warmup_epochs > s.epochs)
    sc.problem("warmupEpochs", detail::concat(sch.warmup_epochs, " is longer than the job's ", s.epochs, " epochs"));
  for (size_t i = 0; i < sch.milestones.size(); ++i) {
    if (i > 0 && sch.milestones[i] <= sch.milestones[i - 1])
      sc.problem(detail::concat("milestones[", i, "]"), "milestones must increase");
    if (sch.milestones[i] >= s.epochs)
      sc.problem(detail::concat("milestones[", i, "]"),
                 detail::concat(sch.milestones[i], " is not before the end of the job's ", s.epochs, " epochs"));
  }
  return s;
}

CommunicationSpec parse_communication(const ConfigNode& c) {
  c.allow_only({"strategy", "sparse", "dense", "density", "switchAtEpoch", "selector", "bucketSize", "overlap",
                "timeoutSeconds", "transport", "momentumCorrection", "gradientPrecision"});
  CommunicationSpec s;
  s.strategy = c.choice("strategy", s.strategy, {"auto", "dense", "torus", "topk", "hitopk", "hybrid"});
  s.sparse = c.choice("sparse", s.sparse, {"topk", "hitopk"});
  s.dense = c.choice("dense", s.dense, {"dense", "torus"});
  s.density = c.number("density", s.density, {0, 1, true, false});
  s.switch_at_epoch = static_cast<int>(c.integer("switchAtEpoch", s.switch_at_epoch, 1, 1000000));
  s.selector = c.choice("selector", s.selector, {"mstopk", "exact"});
  s.bucket_bytes = c.bytes("bucketSize", s.bucket_bytes);
  if (s.bucket_bytes < 4) c.problem("bucketSize", "must hold at least one gradient (4 bytes)");
  s.overlap = c.boolean("overlap", s.overlap);
  s.timeout_ms =
      static_cast<int64_t>(c.number("timeoutSeconds", s.timeout_ms / 1000.0, {0.001, 86400, false, false}) * 1000);
  s.transport = c.choice("transport", s.transport, {"auto", "nccl", "gloo"});
  s.momentum_correction = c.boolean("momentumCorrection", false);
  s.gradient_precision = c.choice("gradientPrecision", s.gradient_precision, {"fp32", "bf16"});
  return s;
}

PlacementSpec parse_placement(const ConfigNode& p) {
  p.allow_only({"nodeSelector", "tolerations", "topologyKeys"});
  PlacementSpec s;
  s.node_selector = p.string_map("nodeSelector");
  for (const ConfigNode& t : p.list("tolerations")) {
    t.allow_only({"key", "operator", "value", "effect"});
    Toleration tol;
    tol.key = t.str("key", "");
    const size_t before = t.problems().size();
    tol.op = t.choice("operator", "Equal", {"Equal", "Exists"});
    const bool op_ok = t.problems().size() == before;
    tol.value = t.str("value", "");
    tol.effect = t.choice("effect", "", {"NoSchedule", "PreferNoSchedule", "NoExecute"});
    if (tol.op == "Exists" && !tol.value.empty()) t.problem("value", "must be empty when the operator is Exists");
    if (op_ok && tol.op == "Equal" && tol.key.empty()) t.problem("key", "required when the operator is Equal");
    s.tolerations.push_back(tol);
  }
  s.topology_keys = p.strings("topologyKeys", s.topology_keys);
  if (p.has("topologyKeys") && s.topology_keys.empty()) p.problem("topologyKeys", "must name at least one label");
  return s;
}

// Rules between fields of different sections.
// communication.momentumCorrection: its default, and the optimizers and settings it cannot serve.
void momentum_correction(const ConfigNode& comm, TrainingJobSpec& s) {
  CommunicationSpec& c = s.communication;
  const OptimizerSpec& o = s.training.optimizer;
  if (!comm.has("momentumCorrection")) {
    c.momentum_correction =
        momentum_correction_default(c.strategy, o.name, o.momentum, o.nesterov, s.training.grad_clip);
    return;
  }
  if (!c.momentum_correction) return;
  if (const std::string why = momentum_correction_refusal(o.name, o.momentum, o.nesterov, s.training.grad_clip);
      !why.empty())
    comm.problem("momentumCorrection", why);
  // dense and torus send every entry: the momentum is the same on either side of the exchange
  if (!may_exchange_sparsely(c.strategy)) c.momentum_correction = false;
}

void check_job(const ConfigNode& spec, TrainingJobSpec& s) {
  const int workers = s.workers();
  const std::string worker_count =
      detail::concat("workers=", workers, " (replicas ", s.replicas, " x ranksPerReplica ", s.ranks_per_replica, ")");
  ConfigNode par = spec.child("parallelism");
  ConfigNode spatial = par.child("spatial");
  const int g = s.parallelism.spatial_size();
  if (workers % g != 0) {
    if (s.parallelism.h == 1 && s.parallelism.w == 1)
      spatial.problem("d", detail::concat(g, " does not divide ", worker_count));
    else spatial.problem("", detail::concat("d x h x w = ", g, " does not divide ", worker_count));
  } else if (s.parallelism.data != 0 && s.parallelism.data != workers / g) {
    par.problem("data", detail::concat(s.parallelism.data, " replicas x ", g, " ranks per spatial group is not ",
                                       worker_count));
  }
  const bool volumes = s.model.name == "cosmoflow" || s.model.name == "unet3d";
  if (s.training.label_smoothing > 0 && s.model.name == "cosmoflow")
    spec.child("training")
        .problem("labelSmoothing", "applies to classifiers' cross-entropy; cosmoflow is a regression");
  if (g > 1 && !volumes)
    spatial.problem(
        "", "spatial parallelism splits 3D volumes (cosmoflow and unet3d); " + s.model.name + " runs data-parallel");
  if (s.device == "cpu" && s.cache.device_bytes > 0)
    spec.child("cache").problem("device", "a cache in GPU memory, but spec.device is cpu");
  if (s.device == "cpu" && s.communication.transport == "nccl")
    spec.child("communication").problem("transport", "nccl exchanges gradients in GPU memory, but spec.device is cpu");

  for (auto [key, parts] :
       {std::pair<const char*, int>{"d", s.parallelism.d}, {"h", s.parallelism.h}, {"w", s.parallelism.w}})
    if (volumes && parts > s.model.input_size)
      spatial.problem(
          key, detail::concat(parts, " parts are more than the ", s.model.input_size, " voxels of model.inputSize"));
  if (workers % g == 0 && s.training.batch_size % (workers / g) != 0)
    spec.child("training")
        .problem("batchSize", detail::concat(s.training.batch_size, " does not divide over ", workers / g,
                                             " data-parallel replicas"));
  if (const int m = s.elastic.min_replicas; m > 0) {
    ConfigNode elastic = spec.child("elastic");
    if (m > s.replicas) {
      elastic.problem("minReplicas", detail::concat(m, " is more than spec.replicas (", s.replicas, ")"));
    } else {
      // Every gang between minReplicas and replicas pods must be whole spatial groups.
      for (int r = m; r <= s.replicas; ++r)
        if (r * s.ranks_per_replica % g != 0) {
          elastic.problem("minReplicas", detail::concat("a gang of ", r, " pods (", r * s.ranks_per_replica,
                                                        " ranks) is not whole spatial groups of ", g, " ranks"));
          break;
        }
    }
  }

  ConfigNode comm = spec.child("communication");
  momentum_correction(comm, s);
  if (!comm.has("gradientPrecision")) s.communication.gradient_precision = s.training.precision;
  if (s.communication.gradient_precision == "bf16" && s.device == "cuda")
    comm.problem("gradientPrecision", "bf16 gradients travel from host memory; a job on CUDA sends fp32");
  // auto: a sparse phase may last until switchAtEpoch; by default the last half of the epochs stay
  // dense, and with an optimizer that applies momentum to the exchanged gradient (sgd, lars) there is
  // no sparse phase unless switchAtEpoch allows one: the few entries a sparse step sends carry many
  // steps of gradient, which that momentum then multiplies (docs/benchmarks.md, "Momentum correction")
  if (s.communication.strategy == "auto" && !comm.has("switchAtEpoch"))
    s.communication.switch_at_epoch = momentum_after_exchange(s.training, s.communication) ? 0 : s.training.epochs / 2;
  else if (s.communication.strategy == "auto" && s.communication.switch_at_epoch >= s.training.epochs)
    comm.problem("switchAtEpoch",
                 detail::concat(s.communication.switch_at_epoch, " is not before the last epoch: the job has ",
                                s.training.epochs, " epochs (0..", s.training.epochs - 1, ")"));
  if (s.communication.strategy == "hybrid" && s.communication.switch_at_epoch >= s.training.epochs)
    comm.problem("switchAtEpoch",
                 detail::concat(s.communication.switch_at_epoch, " is not before the last epoch: the job has ",
                                s.training.epochs, " epochs (0..", s.training.epochs - 1, ")"));

  ConfigNode data = spec.child("dataset");
  if (!spec.has("dataset")) {
    spec.problem("dataset",
                 "required: where the samples come from (format: hdf5 with a path, or format: synthetic "
                 "for generated samples)");
  } else if (!data.has("format") && !data.has("synthetic")) {
    data.problem("format",
                 "required: hdf5 (the files under path), imagefolder (JPEG images under path/train and path/val), "
                 "tokens (token files under path) or synthetic (generated samples)");
  }
  const bool language = s.model.name == "transformer", tokens = s.dataset.format == "tokens";
  if (language && spec.has("dataset") && !tokens)
    data.problem("format", "'" + s.dataset.format + "': model transformer trains on token files (format: tokens)");
  else if (tokens && !language)
    data.problem("format", "tokens: token files train a language model (model.name: transformer), not " + s.model.name);
  const std::string fits = s.model.name == "cosmoflow" ? "cosmo" : s.model.name == "unet3d" ? "shapes" : "images";
  const bool image_folder = s.dataset.format == "imagefolder";
  if (image_folder && fits != "images" && !language)
    data.problem("format", "imagefolder: JPEG images train a 2D image classifier (resnet50, cnn2d or cnn25m), not " +
                               s.model.name);
  if (language) {
    if (data.has("synthetic"))
      data.problem("synthetic", "model transformer has no generated data: give token files (format: tokens)");
  } else if (s.dataset.synthetic.empty()) {
    s.dataset.synthetic = fits;
  } else if (s.dataset.synthetic != fits) {
    data.problem("synthetic",
                 "'" + s.dataset.synthetic + "' data does not fit model " + s.model.name + " (it takes " + fits + ")");
  }
  if (tokens) {
    if (s.dataset.path.empty())
      data.problem("path", "required for token files: the directory of train.bin and val.bin");
    if (s.dataset.vocab_size == 0)
      data.problem(
          "vocabSize",
          "required for token files: every token id is below it (256 for `tessera data generate --kind text`)");
    for (const char* f : {"validationPath", "validationSplit", "crop", "inputKey", "targetKey"})
      if (data.has(f))
        data.problem(f, "applies to an hdf5 dataset; token files hold their validation tokens in path/val.bin");
  } else if (image_folder) {
    if (s.dataset.path.empty())
      data.problem("path", "required for an imagefolder dataset: the directory holding train/ and val/");
    for (const char* f : {"validationPath", "validationSplit", "crop", "inputKey", "targetKey"})
      if (data.has(f))
        data.problem(f, "applies to an hdf5 dataset; an imagefolder dataset validates on the images under path/val");
  } else if (s.dataset.format == "hdf5") {
    if (s.dataset.path.empty()) data.problem("path", "required for an hdf5 dataset");
    if (!s.dataset.validation_path.empty() && s.dataset.validation_split > 0)
      data.problem("validationSplit", "give validationPath or validationSplit, not both");
  } else {
    if (s.dataset.validation_split > 0)
      data.problem("validationSplit", "holds out part of an hdf5 dataset; synthetic data has validationSamples");
    for (const char* f : {"crop", "inputKey", "targetKey"})
      if (data.has(f)) data.problem(f, "applies to an hdf5 dataset (files indexed by `tessera data index`)");
  }
  if (!tokens)
    for (const char* f : {"tokenBytes", "vocabSize"})
      if (data.has(f)) data.problem(f, "applies to token files (format: tokens)");

  if (s.resources.gpu != 0 && s.resources.gpu != s.ranks_per_replica)
    spec.child("resources")
        .problem("gpu", detail::concat(s.resources.gpu, " GPUs per pod for ", s.ranks_per_replica,
                                       " ranks per replica: each rank drives one GPU (or set 0 for CPU)"));
  if (s.checkpoint.every_steps > 0 && s.checkpoint.path.empty())
    spec.child("checkpoint").problem("path", "required when everySteps is set");
}

// Fields given where they have no effect.
std::vector<FieldProblem> ineffective_fields(const ConfigNode& spec, const TrainingJobSpec& s) {
  std::vector<FieldProblem> out;
  auto note = [&](const ConfigNode& n, const char* key, const std::string& why) {
    if (n.has(key)) out.push_back({n.field(key), why});
  };
  const ConfigNode comm = spec.child("communication");
  const std::string& strategy = s.communication.strategy;
  if (strategy == "auto")
    for (const char* k : {"sparse", "dense"})
      note(comm, k, "has no effect with strategy auto (the controller chooses the strategies from the measured links)");
  else if (strategy != "hybrid")
    for (const char* k : {"sparse", "dense", "switchAtEpoch"})
      note(comm, k,
           "has no effect with strategy " + strategy +
               " (only hybrid and auto switch from a sparse to a dense exchange)");
  if (!may_exchange_sparsely(strategy)) {
    note(comm, "density", "has no effect with strategy " + strategy + " (a dense exchange sends every gradient)");
    note(comm, "momentumCorrection",
         "has no effect with strategy " + strategy +
             " (a dense exchange sends every gradient, so "
             "the momentum is the same kept before or after it)");
  }
  const ConfigNode sched = spec.child("training").child("schedule");
  const std::string& decay = s.training.schedule.decay;
  if (decay != "step")
    for (const char* k : {"milestones", "gamma"})
      note(sched, k, "has no effect with decay " + decay + " (only step decay uses it)");
  if (decay != "poly") note(sched, "power", "has no effect with decay " + decay + " (only poly decay uses it)");
  const ConfigNode model = spec.child("model");
  if (s.model.name == "transformer") {
    for (const char* k : {"inputSize", "inChannels", "baseChannels", "maxChannels", "hidden", "outputs", "leakySlope",
                          "batchNorm", "weightInit", "biasInit"})
      note(model, k, "has no effect on model transformer (its sizes are context, width, depth and heads)");
  } else {
    for (const char* k : {"context", "width", "depth", "heads"})
      note(model, k, "applies to model transformer, not " + s.model.name);
  }
  const ConfigNode data = spec.child("dataset");
  if (s.dataset.format == "hdf5" || s.dataset.format == "imagefolder") {
    for (const char* k : {"samples", "validationSamples", "seed"})
      note(data, k,
           "has no effect on an " + s.dataset.format +
               " dataset (it applies to generated samples; the files give the samples)");
  } else {
    note(data, "remoteThrottle",
         "has no effect on " + std::string(s.dataset.format == "tokens" ? "token files" : "synthetic data") +
             " (it slows reads of the remote tier of an hdf5 dataset)");
  }
  return out;
}

}  // namespace

bool momentum_after_exchange(const TrainingSpec& t, const CommunicationSpec& c) {
  const OptimizerSpec& o = t.optimizer;
  return (o.name == "lars" || (o.name == "sgd" && !c.momentum_correction)) && o.momentum > 0;
}

bool may_exchange_sparsely(const std::string& strategy) { return strategy != "dense" && strategy != "torus"; }

std::string momentum_correction_refusal(const std::string& optimizer, double momentum, bool nesterov,
                                        double grad_clip) {
  if (optimizer != "sgd")
    return "applies to optimizer sgd, not " + optimizer +
           (optimizer == "lars" ? " (LARS scales each layer by the exchanged gradient's norm before its momentum)"
                                : " (it keeps no momentum of SGD's kind)");
  if (momentum == 0) return "training.optimizer.momentum is 0: there is no momentum to keep before the exchange";
  if (nesterov) return "does not serve Nesterov momentum (its step needs the exchanged gradient beside the velocity)";
  if (grad_clip > 0)
    return "cannot be combined with training.gradClip, which bounds the exchanged gradient (with it, a velocity)";
  return "";
}

bool momentum_correction_default(const std::string& strategy, const std::string& optimizer, double momentum,
                                 bool nesterov, double grad_clip) {
  return may_exchange_sparsely(strategy) &&
         momentum_correction_refusal(optimizer, momentum, nesterov, grad_clip).empty();
}

ParsedJob parse_training_job(const ConfigNode& root) {
  ParsedJob out;
  TrainingJob& job = out.job;
  TrainingJobSpec& s = job.spec;
  if (!root.is_map()) {
    root.problem("", root.has_value() ? "a TrainingJob manifest must be a mapping" : "the document is empty");
    out.problems = root.problems();
    return out;
  }
  root.allow_only({"apiVersion", "kind", "metadata", "spec", "status"});
  if (!root.has("apiVersion")) root.problem("apiVersion", std::string("required (") + kApiVersion + ")");
  else if (root.str("apiVersion", "") != kApiVersion)
    root.problem("apiVersion", "'" + root.str("apiVersion", "") + "' is not " + kApiVersion);
  if (!root.has("kind")) root.problem("kind", "required (TrainingJob)");
  else if (root.str("kind", "") != kKind) root.problem("kind", "'" + root.str("kind", "") + "' is not TrainingJob");

  ConfigNode meta = root.child("metadata");
  job.name = meta.str("name", "");
  job.namespace_ = meta.str("namespace", job.namespace_);
  static const std::regex kDns("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  if (job.name.empty()) meta.problem("name", "required");
  else if (job.name.size() > 52 || !std::regex_match(job.name, kDns))
    meta.problem("name", "'" + job.name +
                             "' must be at most 52 lowercase letters, digits and '-', starting and ending "
                             "with a letter or digit (pods are named after it)");
  if (!root.has("spec")) root.problem("spec", "required");

  ConfigNode spec = root.child("spec");
  spec.allow_only({"replicas", "ranksPerReplica", "resources", "image", "device", "model", "dataset", "training",
                   "parallelism", "communication", "cache", "placement", "checkpoint", "runPolicy", "elastic",
                   "local"});
  s.replicas = static_cast<int>(spec.integer("replicas", s.replicas, 1, 100000));
  s.ranks_per_replica = static_cast<int>(spec.integer("ranksPerReplica", s.ranks_per_replica, 1, 64));
  ConfigNode res = spec.child("resources");
  res.allow_only({"gpu", "cpu", "memory"});
  s.resources.gpu = static_cast<int>(res.integer("gpu", 0, 0, 64));
  s.resources.cpu = res.cpu("cpu", 0);
  s.resources.memory = res.bytes("memory", 0);
  s.image = spec.str("image", s.image);
  if (s.image.empty()) spec.problem("image", "must not be empty");
  s.device = spec.choice("device", s.device, {"auto", "cuda", "cpu"});

  s.model = parse_model(spec.child("model"));
  s.dataset = parse_dataset(spec.child("dataset"));
  s.training = parse_training(spec.child("training"));

  ConfigNode par = spec.child("parallelism");
  par.allow_only({"spatial", "data"});
  ConfigNode sp = par.child("spatial");
  sp.allow_only({"d", "h", "w"});
  s.parallelism.d = static_cast<int>(sp.integer("d", 1, 1, 4096));
  s.parallelism.h = static_cast<int>(sp.integer("h", 1, 1, 4096));
  s.parallelism.w = static_cast<int>(sp.integer("w", 1, 1, 4096));
  s.parallelism.data = static_cast<int>(par.integer("data", 0, 1, kMaxInt));

  s.communication = parse_communication(spec.child("communication"));

  ConfigNode cache = spec.child("cache");
  cache.allow_only({"memory", "device", "localSSD", "remote"});
  s.cache.memory_bytes = cache.bytes("memory", s.cache.memory_bytes);
  s.cache.device_bytes = cache.bytes("device", s.cache.device_bytes);
  ConfigNode ssd = cache.child("localSSD");
  ssd.allow_only({"path", "sizeLimit", "volume"});
  s.cache.ssd_path = ssd.str("path", "");
  s.cache.ssd_volume = ssd.choice("volume", s.cache.ssd_volume, {"hostPath", "emptyDir"});
  s.cache.ssd_bytes = ssd.bytes("sizeLimit", s.cache.ssd_bytes);
  ConfigNode remote = cache.child("remote");
  remote.allow_only({"nfs"});
  ConfigNode nfs = remote.child("nfs");
  nfs.allow_only({"server", "path"});
  s.cache.nfs_server = nfs.str("server", "");
  s.cache.nfs_path = nfs.str("path", "");
  if (remote.has("nfs")) {
    if (s.cache.nfs_server.empty()) nfs.problem("server", "required for an NFS volume");
    if (s.cache.nfs_path.empty()) nfs.problem("path", "required for an NFS volume");
  }

  s.placement = parse_placement(spec.child("placement"));

  ConfigNode ck = spec.child("checkpoint");
  ck.allow_only({"path", "everySteps", "keep", "volume"});
  s.checkpoint.path = ck.str("path", "");
  s.checkpoint.every_steps = ck.integer("everySteps", 0, 0, INT64_MAX);
  s.checkpoint.keep = static_cast<int>(ck.integer("keep", 2, 1, 1000));
  if (ck.has("volume")) s.checkpoint.volume = parse_volume(ck.child("volume"));
  if (s.checkpoint.volume.given() && s.checkpoint.path.empty()) ck.problem("path", "required when a volume is given");

  ConfigNode rp = spec.child("runPolicy");
  rp.allow_only({"backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend", "startTimeoutSeconds",
                 "terminationGracePeriodSeconds", "restartInPlace"});
  s.run_policy.backoff_limit = static_cast<int>(rp.integer("backoffLimit", s.run_policy.backoff_limit, 0, 1000));
  s.run_policy.active_deadline_seconds = rp.integer("activeDeadlineSeconds", 0, 1, INT64_MAX);
  s.run_policy.ttl_seconds_after_finished = rp.integer("ttlSecondsAfterFinished", -1, 0, INT64_MAX);
  s.run_policy.suspend = rp.boolean("suspend", false);
  s.run_policy.start_timeout_seconds =
      rp.integer("startTimeoutSeconds", s.run_policy.start_timeout_seconds, 1, INT64_MAX);
  s.run_policy.termination_grace_period_seconds =
      rp.integer("terminationGracePeriodSeconds", s.run_policy.termination_grace_period_seconds, 1, 86400);
  s.run_policy.restart_in_place = rp.boolean("restartInPlace", s.run_policy.restart_in_place);

  ConfigNode elastic = spec.child("elastic");
  elastic.allow_only({"minReplicas"});
  s.elastic.min_replicas = static_cast<int>(elastic.integer("minReplicas", 0, 1, 100000));

  ConfigNode local = spec.child("local");
  local.allow_only({"nodes", "gpusPerNode", "workDir", "network"});
  s.local.nodes = static_cast<int>(local.integer("nodes", 0, 1, 4096));
  s.local.gpus_per_node = static_cast<int>(local.integer("gpusPerNode", 0, 1, 1024));
  s.local.work_dir = local.str("workDir", "");
  ConfigNode net = local.child("network");
  net.allow_only({"rate", "delay"});
  s.local.network_rate = net.str("rate", "");
  s.local.network_delay = net.str("delay", "");
  static const std::regex kRate("[0-9]+(\\.[0-9]+)?[kmg]?(bit|bps)"), kDelay("[0-9]+(\\.[0-9]+)?(us|ms|s)");
  if (local.has("network") && !std::regex_match(s.local.network_rate, kRate))
    net.problem("rate", "'" + s.local.network_rate + "' is not a link rate such as 1gbit, 10gbit or 200mbit");
  if (!s.local.network_delay.empty() && !std::regex_match(s.local.network_delay, kDelay))
    net.problem("delay", "'" + s.local.network_delay + "' is not a delay such as 0.2ms");

  check_job(spec, s);
  out.warnings = ineffective_fields(spec, s);
  if (s.local.nodes == 0) s.local.nodes = s.replicas;
  if (s.local.gpus_per_node == 0) s.local.gpus_per_node = s.ranks_per_replica;
  if (s.local.work_dir.empty()) s.local.work_dir = ".tessera/" + (job.name.empty() ? std::string("job") : job.name);
  out.problems = root.problems();
  return out;
}

ParsedJob read_training_job(const std::string& file) {
  try {
    ParsedJob parsed = parse_training_job(ConfigNode::load_file(file));
    for (auto& p : parsed.problems)
      if (p.field.empty()) p.field = file;  // the document as a whole
    return parsed;
  } catch (const ConfigError& e) {
    ParsedJob out;
    out.problems = e.problems();
    return out;
  }
}

bool gang_size_fits(int world, int workers, int min_workers, int spatial) {
  if (world == workers) return true;
  return min_workers > 0 && world >= min_workers && world <= workers && spatial > 0 && world % spatial == 0;
}

std::string under_work_dir(const std::string& path, const std::string& work_dir) {
  if (path.empty() || path.front() == '/' || work_dir.empty()) return path;
  return work_dir + "/" + path;
}

TrainingJob load_training_job(const std::string& file) {
  ParsedJob p = read_training_job(file);
  if (!p.ok()) throw ConfigError(p.problems);
  return p.job;
}

}  // namespace tessera::api
