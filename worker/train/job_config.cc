#include "worker/train/job_config.h"

namespace tessera {
namespace {

ModelConfig parse_model(const ConfigNode& m) {
  m.allow_only({"name", "inputSize", "inChannels", "baseChannels", "maxChannels", "hidden", "outputs", "dropout",
                "leakySlope", "batchNorm", "seed"});
  ModelConfig c;
  c.name = m.str("name", c.name);
  c.input_size = static_cast<int>(m.integer("inputSize", c.input_size, 4, 1024));
  c.in_channels = static_cast<int>(m.integer("inChannels", 0, 0, 4096));
  c.base_channels = static_cast<int>(m.integer("baseChannels", 0, 0, 4096));
  c.max_channels = static_cast<int>(m.integer("maxChannels", c.max_channels, 1, 65536));
  std::vector<int64_t> hidden = m.integers("hidden", {c.hidden.begin(), c.hidden.end()});
  c.hidden.assign(hidden.begin(), hidden.end());
  c.outputs = static_cast<int>(m.integer("outputs", 0, 0, 1 << 20));
  c.dropout = static_cast<float>(m.number("dropout", 0));
  if (c.dropout < 0 || c.dropout >= 1) throw ConfigError(m.field("dropout"), detail::concat(c.dropout, " is outside [0, 1)"));
  c.leaky_slope = static_cast<float>(m.number("leakySlope", c.leaky_slope));
  c.batchnorm = m.boolean("batchNorm", false);
  c.seed = static_cast<uint64_t>(m.integer("seed", 1, 0, INT64_MAX));
  return c;
}

}  // namespace

JobConfig parse_job_config(const ConfigNode& root) {
  JobConfig j;
  ConfigNode spec = root;
  if (root.has("spec")) {
    root.allow_only({"apiVersion", "kind", "metadata", "spec", "status"});
    const std::string kind = root.str("kind", "TrainingJob");
    if (kind != "TrainingJob") throw ConfigError("kind", "expected TrainingJob, got '" + kind + "'");
    j.name = root.child("metadata").str("name", j.name);
    spec = root.child("spec");
  }
  // Fields the controller acts on are accepted here and ignored by the worker.
  spec.allow_only({"replicas", "ranksPerReplica", "resources", "image", "model", "dataset", "training", "parallelism",
                   "communication", "cache", "placement", "checkpoint", "runPolicy", "local"});

  j.model = parse_model(spec.child("model"));

  ConfigNode d = spec.child("dataset");
  d.allow_only({"format", "synthetic", "samples", "validationSamples", "seed", "path", "validationPath", "remoteThrottle"});
  const std::string format = d.str("format", "synthetic");
  if (format != "synthetic" && format != "hdf5")
    throw ConfigError(d.field("format"), "'" + format + "' (expected synthetic or hdf5)");
  j.data.format = format;
  j.data.path = d.str("path", "");
  j.data.validation_path = d.str("validationPath", "");
  if (format == "hdf5" && j.data.path.empty()) throw ConfigError(d.field("path"), "an hdf5 dataset needs a path");
  if (format == "hdf5" && j.data.validation_path.empty())
    throw ConfigError(d.field("validationPath"), "an hdf5 dataset needs a validation path");
  ConfigNode rt = d.child("remoteThrottle");
  rt.allow_only({"mbps", "latencyMs"});
  j.data.remote_mbps = rt.number("mbps", 0);
  j.data.remote_latency_ms = rt.number("latencyMs", 0);
  if (j.data.remote_mbps < 0 || j.data.remote_latency_ms < 0) throw ConfigError(rt.path(), "must not be negative");
  ConfigNode cache = spec.child("cache");
  cache.allow_only({"memory", "localSSD", "remote"});
  j.data.cache.memory_bytes = cache.bytes("memory", j.data.cache.memory_bytes);
  ConfigNode ssd = cache.child("localSSD");
  ssd.allow_only({"path", "sizeLimit"});
  j.data.cache.ssd_dir = ssd.str("path", "");
  j.data.cache.ssd_bytes = ssd.bytes("sizeLimit", j.data.cache.ssd_bytes);
  j.dataset.kind = d.str("synthetic", j.model.name == "cosmoflow" ? "cosmo" : j.model.name == "unet3d" ? "shapes" : "images");
  j.dataset.size = j.model.input_size;
  j.dataset.samples = static_cast<uint64_t>(d.integer("samples", 256, 1, INT64_MAX));
  j.validation_samples = static_cast<uint64_t>(d.integer("validationSamples", 64, 1, INT64_MAX));
  j.dataset.seed = static_cast<uint64_t>(d.integer("seed", 1, 0, INT64_MAX));
  if (j.model.outputs && j.dataset.kind != "cosmo") j.dataset.classes = j.model.outputs;

  ConfigNode t = spec.child("training");
  t.allow_only({"epochs", "batchSize", "optimizer", "schedule", "gradClip", "threads", "logEverySeconds", "seed",
                "loaderThreads", "prefetchBatches"});
  auto& tr = j.training;
  tr.epochs = static_cast<int>(t.integer("epochs", tr.epochs, 1, 1000000));
  tr.batch_size = static_cast<int>(t.integer("batchSize", tr.batch_size, 1, 1 << 24));
  tr.grad_clip = t.number("gradClip", 0);
  if (tr.grad_clip < 0) throw ConfigError(t.field("gradClip"), "must not be negative");
  tr.threads = static_cast<int>(t.integer("threads", 0, 0, 4096));
  tr.log_every_seconds = t.number("logEverySeconds", tr.log_every_seconds);
  tr.seed = static_cast<uint64_t>(t.integer("seed", 1, 0, INT64_MAX));
  j.data.loader_threads = static_cast<int>(t.integer("loaderThreads", j.data.loader_threads, 1, 256));
  j.data.prefetch_batches = static_cast<int>(t.integer("prefetchBatches", j.data.prefetch_batches, 1, 4096));
  ConfigNode o = t.child("optimizer");
  o.allow_only({"name", "learningRate", "momentum", "nesterov", "weightDecay", "beta1", "beta2", "eps", "trust"});
  tr.optimizer.name = o.str("name", tr.optimizer.name);
  tr.schedule.base_lr = o.number("learningRate", 0.01);
  tr.optimizer.momentum = o.number("momentum", tr.optimizer.momentum);
  tr.optimizer.nesterov = o.boolean("nesterov", false);
  tr.optimizer.weight_decay = o.number("weightDecay", 0);
  tr.optimizer.beta1 = o.number("beta1", tr.optimizer.beta1);
  tr.optimizer.beta2 = o.number("beta2", tr.optimizer.beta2);
  tr.optimizer.eps = o.number("eps", tr.optimizer.eps);
  tr.optimizer.trust = o.number("trust", tr.optimizer.trust);
  make_optimizer(tr.optimizer);  // validates
  ConfigNode s = t.child("schedule");
  s.allow_only({"warmupEpochs", "decay", "milestones", "gamma", "power", "minLearningRate"});
  tr.warmup_epochs = s.number("warmupEpochs", 0);
  if (tr.warmup_epochs < 0) throw ConfigError(s.field("warmupEpochs"), "must not be negative");
  tr.schedule.decay = s.str("decay", "none");
  tr.milestone_epochs = s.integers("milestones", {});
  tr.schedule.gamma = s.number("gamma", tr.schedule.gamma);
  tr.schedule.power = s.number("power", tr.schedule.power);
  tr.schedule.min_lr = s.number("minLearningRate", 0);
  validate(tr.schedule);

  ConfigNode p = spec.child("parallelism");
  p.allow_only({"spatial", "data"});
  ConfigNode sp = p.child("spatial");
  sp.allow_only({"d", "h", "w"});
  j.model.spatial.d = static_cast<int>(sp.integer("d", 1, 1, 4096));
  j.model.spatial.h = static_cast<int>(sp.integer("h", 1, 1, 4096));
  j.model.spatial.w = static_cast<int>(sp.integer("w", 1, 1, 4096));
  j.data_replicas = static_cast<int>(p.integer("data", 0, 0, 1 << 20));
  if (j.model.spatial.size() > 1 && !supports_spatial(j.model.name))
    throw ConfigError(sp.path(), "spatial parallelism is available for cosmoflow and unet3d; '" + j.model.name +
                                     "' runs data-parallel");

  ConfigNode c = spec.child("communication");
  c.allow_only({"strategy", "sparse", "dense", "density", "switchAtEpoch", "selector", "bucketSize", "timeoutSeconds"});
  auto& cc = j.communication;
  cc.strategy = c.str("strategy", cc.strategy);
  cc.sparse = c.str("sparse", cc.sparse);
  cc.dense = c.str("dense", cc.dense);
  cc.density = c.number("density", cc.density);
  cc.switch_at_epoch = static_cast<int>(c.integer("switchAtEpoch", cc.switch_at_epoch, 0, 1000000));
  cc.selector = c.str("selector", cc.selector);
  cc.bucket_bytes = c.bytes("bucketSize", cc.bucket_bytes);
  cc.timeout_ms = static_cast<int64_t>(c.number("timeoutSeconds", cc.timeout_ms / 1000.0) * 1000);
  const std::string known = "dense, torus, topk, hitopk or hybrid";
  if (cc.strategy != "dense" && cc.strategy != "torus" && cc.strategy != "topk" && cc.strategy != "hitopk" &&
      cc.strategy != "hybrid")
    throw ConfigError(c.field("strategy"), "unknown strategy '" + cc.strategy + "' (expected " + known + ")");
  if (cc.sparse != "topk" && cc.sparse != "hitopk")
    throw ConfigError(c.field("sparse"), "'" + cc.sparse + "' is not a sparse strategy (expected topk or hitopk)");
  if (cc.dense != "dense" && cc.dense != "torus")
    throw ConfigError(c.field("dense"), "'" + cc.dense + "' is not a dense strategy (expected dense or torus)");
  if (!(cc.density > 0 && cc.density <= 1)) throw ConfigError(c.field("density"), detail::concat(cc.density, " is outside (0, 1]"));
  if (cc.strategy == "hybrid" && cc.switch_at_epoch > tr.epochs)
    throw ConfigError(c.field("switchAtEpoch"), detail::concat(cc.switch_at_epoch, " is after the last epoch (", tr.epochs, ")"));
  if (cc.bucket_bytes < 4) throw ConfigError(c.field("bucketSize"), "must hold at least one gradient");
  if (cc.timeout_ms < 1) throw ConfigError(c.field("timeoutSeconds"), "must be positive");

  ConfigNode k = spec.child("checkpoint");
  k.allow_only({"path", "everySteps", "keep"});
  j.checkpoint.path = k.str("path", "");
  j.checkpoint.every_steps = k.integer("everySteps", 0, 0, INT64_MAX);
  j.checkpoint.keep = static_cast<int>(k.integer("keep", 2, 1, 1000));

  ModelConfig single = j.model;
  single.spatial = SpatialGrid{};
  make_model(single);  // validates the model configuration (the split is checked when the ranks meet)
  return j;
}

JobConfig load_job_config(const std::string& file) { return parse_job_config(ConfigNode::load_file(file)); }

}  // namespace tessera
