#include "bench/bench.h"
#include "common/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "controller/local/emulated_network.h"
#include "testing/fork_ranks.h"
#include "testing/process.h"
#include "worker/comm/gloo/gloo_communicator.h"
#include "worker/comm/store.h"
#include "worker/data/tokens.h"
#include "worker/nn/optim.h"
#include "worker/train/trainer.h"

namespace tessera::bench {

// The benchmark models' jobs. `tokens`: the directory of the Transformer's token files
// (bench_tokens); the other models train on generated samples.
JobConfig bench_job(const std::string& model, int world, int batch, int steps_per_epoch, int epochs, int threads,
                    const std::string& tokens = "") {
  JobConfig job;
  job.workers = world;
  if (model == "cosmoflow") {
    job.model.name = "cosmoflow";
    job.model.input_size = 32;
    job.dataset = SyntheticConfig{"cosmo", 32, 0, 7, 0};
    job.training.optimizer.name = "adam";
    job.training.schedule.base_lr = 2e-4;
  } else if (model == "cnn25m") {
    job.model.name = "cnn2d";
    job.model.input_size = 64;
    job.model.base_channels = 32;
    job.model.hidden = {1536};
    job.dataset = SyntheticConfig{"images", 64, 0, 7, 10};
    job.training.optimizer.name = "sgd";
    job.training.optimizer.momentum = 0.9;
    job.training.schedule.base_lr = 0.01;
  } else if (model == "resnet50") {
    // ImageNet's network and gradient (1000 classes, 25.6M parameters) at 64 x 64: a step this
    // machine's cores finish in well under a second, the exchange the seed paper's.
    job.model.name = "resnet50";
    job.model.input_size = 64;
    job.model.outputs = 1000;
    job.model.label_smoothing = 0.1;
    job.dataset = SyntheticConfig{"images", 64, 0, 7, 1000, 3};
    job.training.optimizer.name = "sgd";
    job.training.optimizer.momentum = 0.9;
    job.training.optimizer.weight_decay = 5e-5;
    job.training.schedule.base_lr = 0.01;
  } else if (model == "transformer") {
    // The speed benchmark's Transformer (25.5M parameters, context 256) on byte-level English text.
    job.model.name = "transformer";
    job.model.vocab_size = 256;
    job.model.context = 256;
    job.model.width = 512;
    job.model.depth = 8;
    job.model.heads = 8;
    job.data.format = "tokens";
    job.data.path = tokens;
    job.training.optimizer.name = "adamw";
    job.training.optimizer.weight_decay = 0.1;
    job.training.schedule.base_lr = 3e-4;
  } else {
    throw ConfigError("--model", "'" + model + "': expected cosmoflow, cnn25m, resnet50 or transformer");
  }
  job.dataset.samples = static_cast<uint64_t>(batch) * steps_per_epoch;
  job.validation_samples = static_cast<uint64_t>(batch);
  job.data.windows = job.dataset.samples;
  job.data.validation_windows = job.validation_samples;
  job.training.batch_size = batch;
  job.training.epochs = epochs;
  job.training.threads = threads;
  job.training.log_every_seconds = 1e9;
  job.data.loader_threads = 1;
  return job;
}

// The Transformer's token files (train.bin, val.bin: the fortunes package's English text as bytes)
// in a new directory under `dir`; "" for the other models.
std::string bench_tokens(const std::string& model, const std::string& dir) {
  if (model != "transformer") return "";
  const std::string out = dir + "/tokens";
  generate_text_tokens(out, {}, 0.1, false);
  return out;
}

struct TrainRun {
  std::string model = "cosmoflow", strategy = "dense", rate = "1gbit", delay;
  int nodes = 2, local = 1, batch = 16, steps = 12, threads = 1;
  int epochs = 0;                   // > 0: train that many epochs of `steps` steps and report validation after each
  uint64_t seed = 1;                // the weights' initialisation and the data order (the samples stay the same)
  std::string optimizer;            // empty: the model's own (bench_job); else OptimizerConfig's defaults
  std::string momentum_correction;  // on, off, or empty: a manifest's default (api::momentum_correction_default)
  double lr = 0;                    // > 0: the base learning rate instead of the model's
  bool overlap = true;
  double density = 0.001;
  std::string tokens;  // the Transformer's token files (bench_tokens)
  // Links that change mid-run: after step cut_at - 1, node 1's link is set to cut_rate; with
  // measure_from >= 0 the steps timed are [measure_from, measure_to) instead of the usual ones.
  int cut_at = -1;
  std::string cut_rate;
  int measure_from = -1, measure_to = -1;
  // Time to a loss validates on 16 batches (256 samples at batch 16: a steadier loss than one batch).
  uint64_t validation_samples() const { return epochs > 0 ? 16 * static_cast<uint64_t>(batch) : 0; }
};

// The model's own optimizer and learning rate (bench_job's), or those of --optimizer and --lr; and
// momentum correction as --momentum-correction says, else as a manifest of this strategy has it.
void tune_optimizer(JobConfig& job, const TrainRun& t) {
  if (!t.optimizer.empty())
    job.training.optimizer = OptimizerConfig{.name = t.optimizer};  // its defaults: momentum 0.9
  if (t.lr > 0) job.training.schedule.base_lr = t.lr;
  const OptimizerConfig& o = job.training.optimizer;
  job.communication.momentum_correction =
      t.momentum_correction.empty()
          ? api::momentum_correction_default(t.strategy, o.name, o.momentum, o.nesterov, job.training.grad_clip)
          : t.momentum_correction == "on";
}

// The slowest rank's means over the measured steps (each epoch's first two warm up): the step
// (everything it waited for: data, compute, exposed communication), communication exposed and
// total, compute (forward, backward, update); and the bytes a rank sent between nodes per step,
// the mean over the ranks (as the exchange benchmark's): in a world ring only one rank of a node
// sends across, so the slowest rank's own may be 0.
struct TrainResult {
  double step_ms = 0, exposed_ms = 0, total_ms = 0, compute_ms = 0, bytes_inter = 0;
  double select_ms = 0;  // of the communication: error feedback and top-k selection (sparse strategies)
  // Per step, the largest compute of any rank (every collective waits for it), averaged; compute_ms
  // is the reported rank's own.
  double slowest_compute_ms = 0;
  int64_t params = 0;
  nlohmann::json epochs = nlohmann::json::array();   // {epoch, seconds, val_loss, val_metric} (--epochs)
  std::string exchange, reason;                      // strategy auto: rank 0's choice and why
  nlohmann::json changes = nlohmann::json::array();  // rank 0's [step, strategy] at each change of strategy
};

TrainResult run_cluster_training(const TrainRun& t) {
  const int world = t.nodes * t.local;
  const std::string dir = testing::make_temp_dir("tessera-train-bench");
  auto outcomes = testing::fork_ranks(
      world,
      [&](int r, std::string& report) {
        set_default_log_level(LogLevel::kWarn);
        set_log_tag("rank " + std::to_string(r));
        const std::string host = enter_node(r / t.local);
        FileStore store(dir);
        CommGroups g = connect_groups(store, Topology::grid(t.nodes, t.local), r, gloo_factory(Millis(300000), host));
        // auto: the same epochs as hybrid, its sparse phase (if it chooses one) allowed the first two
        const bool hybrid = t.strategy == "hybrid" || t.strategy == "auto";
        // Throughput: two epochs of --steps per phase (hybrid: sparse, then dense), timed in the second
        // of each, when the synthetic samples are generated already (as a dataset read from a cache
        // would be). Time to a loss: --epochs of --steps, hybrid dense from its second half of epochs on.
        const bool throughput = t.epochs == 0;
        JobConfig job =
            bench_job(t.model, world, t.batch, t.steps, throughput ? (hybrid ? 4 : 2) : t.epochs, t.threads, t.tokens);
        if (t.epochs > 0) job.validation_samples = t.validation_samples();
        job.model.seed = t.seed;
        job.training.seed = t.seed;
        auto& c = job.communication;
        c.strategy = t.strategy;
        tune_optimizer(job, t);
        c.density = t.density;
        c.overlap = t.overlap;
        c.switch_at_epoch = throughput ? 2 : std::max(1, t.epochs / 2);
        Trainer trainer(job, &g);
        const auto t_start = Clock::now();
        nlohmann::json epochs = nlohmann::json::array();
        trainer.on_epoch = [&](const EpochRecord& e) {
          if (t.epochs > 0)  // time to a loss; a throughput run's validation is not reported
            epochs.push_back({{"epoch", e.epoch},
                              {"seconds", ms_since(t_start) / 1e3},
                              {"val_loss", e.val_loss},
                              {"val_metric", e.val_metric}});
        };
        std::vector<double> step, exposed, total, select, compute, inter;
        // [step, strategy] where the strategy changed, or where auto's choice was taken again
        nlohmann::json changes = nlohmann::json::array();
        int64_t choice = 0;
        trainer.on_step = [&](const StepRecord& s) {
          if (changes.empty() || changes.back()[1] != s.strategy || s.exchange_choice != choice)
            changes.push_back({s.step, s.strategy});
          choice = s.exchange_choice;
          // the link cut: from the machine's own network namespace (the bench's), where the bridge is
          if (r == 0 && s.step + 1 == t.cut_at &&
              std::system(detail::concat("nsenter --net=/proc/", getppid(), "/ns/net ", netns_program(), " rate 1 ",
                                         t.cut_rate, " >&2")
                              .c_str()) != 0)
            throw Error("cutting node 1's link failed");
          if (t.measure_from >= 0) {
            if (s.step < t.measure_from || s.step >= t.measure_to) return;
          } else if (s.step % trainer.steps_per_epoch() < 2 || (throughput && s.epoch % 2 == 0)) {
            // Warm-up: the first two steps of each epoch (allocation, connections, a new phase's
            // buffers); throughput: the first epoch of each phase as well.
            return;
          }
          step.push_back(1e3 * (s.data_s + s.forward_s + s.backward_s + s.comm_s + s.update_s));
          exposed.push_back(1e3 * s.comm_s);
          total.push_back(1e3 * s.comm_total_s);
          select.push_back(1e3 * s.select_s);
          compute.push_back(1e3 * (s.forward_s + s.backward_s + s.update_s));
          inter.push_back(static_cast<double>(s.bytes_inter));
        };
        const TrainSummary summary = trainer.run();
        report =
            nlohmann::json{{"step", step},      {"exposed", exposed},           {"total", total},
                           {"select", select},  {"compute", compute},           {"inter", inter},
                           {"epochs", epochs},  {"exchange", summary.exchange}, {"reason", summary.exchange_reason},
                           {"changes", changes}}
                .dump();
        return 0;
      },
      std::chrono::minutes(20));
  std::filesystem::remove_all(dir);
  auto mean = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / std::max<size_t>(1, v.size());
  };
  TrainResult worst;
  double inter = 0;
  std::string exchange, reason;
  nlohmann::json changes;
  std::vector<double> slowest;  // per measured step, the largest compute of any rank
  for (int r = 0; r < world; ++r) {
    if (outcomes[r].exit_code != 0)
      throw Error(detail::concat("training bench: rank ", r, " failed (exit ", outcomes[r].exit_code,
                                 "): ", outcomes[r].report));
    const nlohmann::json j = nlohmann::json::parse(outcomes[r].report);
    const auto compute = j["compute"].get<std::vector<double>>();
    TrainResult x;
    x.step_ms = mean(j["step"].get<std::vector<double>>());
    x.exposed_ms = mean(j["exposed"].get<std::vector<double>>());
    x.total_ms = mean(j["total"].get<std::vector<double>>());
    x.select_ms = mean(j["select"].get<std::vector<double>>());
    x.compute_ms = mean(compute);
    x.bytes_inter = mean(j["inter"].get<std::vector<double>>());
    x.epochs = j["epochs"];
    inter += x.bytes_inter / world;
    if (r == 0) exchange = j.value("exchange", ""), reason = j.value("reason", ""), changes = j["changes"];
    slowest.resize(std::max(slowest.size(), compute.size()));
    for (size_t i = 0; i < compute.size(); ++i) slowest[i] = std::max(slowest[i], compute[i]);
    // The job runs at its slowest rank's pace; its communication figures are that rank's.
    if (x.step_ms > worst.step_ms) worst = x;
  }
  worst.bytes_inter = inter;
  worst.exchange = exchange, worst.reason = reason, worst.changes = changes;
  worst.slowest_compute_ms = mean(slowest);
  worst.params = make_model(bench_job(t.model, world, t.batch, 1, 1, 1).model)->num_params();
  return worst;
}

// PyTorch DistributedDataParallel (Gloo, default buckets, its overlap) on the same model, data and
// emulated cluster: bench/torch/torch_ddp.py, one process per rank in its node's namespace.
TrainResult run_ddp(const TrainRun& t) {
  const int world = t.nodes * t.local;
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") != 0)
    throw Error("the PyTorch DDP peer needs python3-torch (make bench-deps)");
  const std::string dir = testing::make_temp_dir("tessera-ddp-bench");
  // The same training samples Tessera trains on, as raw float32: inputs then targets.
  JobConfig job = bench_job(t.model, world, t.batch, t.steps, 1, t.threads, t.tokens);
  {
    auto data = open_token_or_synthetic_dataset(job, false);  // what the trainer trains on
    std::ofstream x(dir + "/inputs.f32", std::ios::binary), y(dir + "/targets.f32", std::ios::binary);
    for (uint64_t i = 0; i < data->size(); ++i) {
      Sample s = data->get(i);
      x.write(reinterpret_cast<const char*>(s.input.data()), s.input.numel() * sizeof(float));
      y.write(reinterpret_cast<const char*>(s.target.data()), s.target.numel() * sizeof(float));
    }
  }
  const int port = 29500 + static_cast<int>(getpid() % 1000);
  auto outcomes = testing::fork_ranks(
      world,
      [&](int r, std::string& report) {
        enter_node(r / t.local);
        const std::string cmd = detail::concat(
            "GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 ", TESSERA_SOURCE_DIR, "/bench/torch/torch_ddp.py --model ",
            t.model, " --rank ", r, " --world ", world, " --master 10.77.0.1:", port, " --data ", dir, " --batch ",
            t.batch / world, " --steps ", t.steps, " --threads ", t.threads, " 2>", dir, "/ddp-", r, ".log");
        FILE* p = popen(cmd.c_str(), "r");
        if (!p) return 1;
        char buf[4096];
        while (size_t n = fread(buf, 1, sizeof(buf), p)) report.append(buf, n);
        return pclose(p) == 0 ? 0 : 1;
      },
      std::chrono::minutes(20));
  std::string failed;
  for (int r = 0; r < world && failed.empty(); ++r)
    if (outcomes[r].exit_code != 0)
      failed = detail::concat("DDP rank ", r, " failed: ", testing::read_file(detail::concat(dir, "/ddp-", r, ".log")));
  std::filesystem::remove_all(dir);
  if (!failed.empty()) throw Error(failed);
  TrainResult worst;
  for (int r = 0; r < world; ++r) {
    const auto j = nlohmann::json::parse(outcomes[r].report);
    TrainResult x;
    x.step_ms = j["step_ms"];
    x.compute_ms = j["compute_ms"];
    x.params = j["params"];
    if (x.step_ms > worst.step_ms) worst = x;
  }
  return worst;
}

// Training throughput on the emulated cluster: Tessera with --strategy (dense, torus, topk, hitopk,
// hybrid: two epochs of each phase, or auto: the same epochs, the first timed after its choice) and --overlap, or the
// PyTorch DDP peer (--peer ddp).
int cluster_train(int argc, char** argv) {
  TrainRun t;
  int64_t seed = 1;
  std::string overlap = "on", peer = "tessera";
  bool json = false;
  Flags flags(
      "tessera-bench cluster-train",
      "usage: tessera-bench cluster-train --model cosmoflow|cnn25m|resnet50|transformer --strategy S|hybrid|auto "
      "[--peer ddp] [--overlap on|off]\n"
      "           --nodes M --local N --rate R [--delay D] [--batch B --steps K --threads T --density R --epochs E\n"
      "           --seed S] [--optimizer sgd|adam|lars --lr X] [--momentum-correction on|off]\n"
      "           [--cut-at STEP --cut-rate R] [--measure-from A --measure-to B] [--json]\n"
      "  --momentum-correction on|off   SGD's velocity kept before the exchange; default: as a manifest has it\n"
      "                                 (on for sgd with momentum under a strategy that may exchange sparsely)\n"
      "  --cut-at STEP --cut-rate R   after step STEP - 1, node 1's link runs at R (links that change mid-run)\n"
      "  --measure-from A --measure-to B   time steps A..B-1 instead of each phase's second epoch\n");
  flags.text("--model", &t.model)
      .text("--strategy", &t.strategy)
      .integer("--nodes", &t.nodes, 1, 64)
      .integer("--local", &t.local, 1, 64)
      .integer("--batch", &t.batch, 1, 1 << 20)
      .integer("--steps", &t.steps, 3, 1000000)
      .integer("--threads", &t.threads, 1, 1024)
      .real("--density", &t.density, {0, 1, true, false})
      .integer("--epochs", &t.epochs, 0, 100000)
      .integer("--seed", &seed, 1, std::numeric_limits<int64_t>::max())
      .text("--rate", &t.rate)
      .text("--delay", &t.delay)
      .text("--optimizer", &t.optimizer)
      .real("--lr", &t.lr, Interval::above(0))
      .text("--momentum-correction", &t.momentum_correction)
      .text("--overlap", &overlap)
      .integer("--cut-at", &t.cut_at, 1, 1000000)
      .text("--cut-rate", &t.cut_rate)
      .integer("--measure-from", &t.measure_from, 0, 1000000)
      .integer("--measure-to", &t.measure_to, 1, 1000000)
      .text("--peer", &peer)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  t.seed = static_cast<uint64_t>(seed);
  const bool seeded = flags.given("--seed"),
             tuned = flags.given("--optimizer") || flags.given("--lr") || flags.given("--momentum-correction");
  if (flags.given("--momentum-correction") && t.momentum_correction != "on" && t.momentum_correction != "off")
    throw ConfigError("--momentum-correction", "'" + t.momentum_correction + "': expected on or off");
  if (overlap != "on" && overlap != "off") throw ConfigError("--overlap", "'" + overlap + "': expected on or off");
  t.overlap = overlap == "on";
  if (peer != "tessera" && peer != "ddp") throw ConfigError("--peer", "'" + peer + "': expected tessera or ddp");
  if (peer == "ddp" && t.epochs > 0) throw ConfigError("--epochs", "the DDP peer measures throughput only");
  if (flags.given("--cut-at") != flags.given("--cut-rate"))
    throw ConfigError(flags.given("--cut-at") ? "--cut-rate" : "--cut-at", "--cut-at and --cut-rate go together");
  if (flags.given("--cut-rate")) cost::link_bits_per_second(t.cut_rate, "--cut-rate");
  if (flags.given("--measure-from") != flags.given("--measure-to") ||
      (flags.given("--measure-to") && t.measure_to <= t.measure_from))
    throw ConfigError("--measure-to", "--measure-from A --measure-to B go together, with A < B");
  if (peer == "ddp" && (t.cut_at >= 0 || t.measure_from >= 0))
    throw ConfigError(t.cut_at >= 0 ? "--cut-at" : "--measure-from", "the DDP peer measures throughput only");
  if (peer == "ddp" && seeded) throw ConfigError("--seed", "the DDP peer measures throughput only");
  if (peer == "ddp" && tuned)
    throw ConfigError(flags.given("--lr")          ? "--lr"
                      : flags.given("--optimizer") ? "--optimizer"
                                                   : "--momentum-correction",
                      "the DDP peer trains with its own optimizer");
  JobConfig tuned_job = bench_job(t.model, 1, 1, 1, 1, 1);  // the optimizer the ranks will build
  tuned_job.communication.strategy = t.strategy;
  tune_optimizer(tuned_job, t);
  try {
    make_optimizer(tuned_job.training.optimizer);
  } catch (const ConfigError& e) {
    throw ConfigError("--optimizer", e.problems().front().reason);
  }
  if (t.momentum_correction == "on") {
    const OptimizerConfig& o = tuned_job.training.optimizer;
    if (const std::string why =
            api::momentum_correction_refusal(o.name, o.momentum, o.nesterov, tuned_job.training.grad_clip);
        !why.empty())
      throw ConfigError("--momentum-correction", "needs SGD with momentum: " + why);
    if (!api::may_exchange_sparsely(t.strategy))
      throw ConfigError("--momentum-correction",
                        "has no effect with strategy " + t.strategy + " (it sends every gradient)");
  }
  if (t.batch % (t.nodes * t.local))
    throw ConfigError("--batch", detail::concat(t.batch, " does not divide over ", t.nodes * t.local, " ranks"));
  const std::string data_dir = testing::make_temp_dir("tessera-train-bench-data");
  TrainResult r;
  try {
    t.tokens = bench_tokens(t.model, data_dir);
    local::EmulatedNetwork network(netns_program(), t.nodes, t.rate, t.delay, "--rate", json);
    r = peer == "ddp" ? run_ddp(t) : run_cluster_training(t);
  } catch (...) {
    std::filesystem::remove_all(data_dir);
    throw;
  }
  std::filesystem::remove_all(data_dir);
  const double sps = t.batch / (r.step_ms / 1e3);
  const std::string strategy = peer == "ddp" ? "ddp" : t.strategy;
  if (json) {
    std::printf(
        "%s\n",
        nlohmann::json{
            {"bench", "cluster-train"},
            {"peer", peer},
            {"model", t.model},
            {"params", r.params},
            {"strategy", strategy},
            {"overlap", peer == "ddp" ? true : t.overlap},
            {"nodes", t.nodes},
            {"local", t.local},
            {"rate", t.rate},
            {"delay", t.delay},
            {"batch", t.batch},
            {"threads", t.threads},
            {"density", t.density},
            {"steps", t.steps},
            {"seed", t.seed},
            {"optimizer", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(tuned_job.training.optimizer.name)},
            {"lr", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(tuned_job.training.schedule.base_lr)},
            {"momentum_correction",
             peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(tuned_job.communication.momentum_correction)},
            {"step_ms", r.step_ms},
            {"samples_per_second", sps},
            {"compute_ms", r.compute_ms},
            {"slowest_compute_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.slowest_compute_ms)},
            {"comm_exposed_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.exposed_ms)},
            {"comm_total_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.total_ms)},
            {"select_ms", peer == "ddp" ? nlohmann::json(nullptr) : nlohmann::json(r.select_ms)},
            {"bytes_inter", r.bytes_inter},
            {"validation_samples", t.validation_samples()},
            {"epochs", r.epochs},
            {"chosen", r.exchange},
            {"reason", r.reason},
            {"changes", r.changes},
            {"cut_at", t.cut_at},
            {"cut_rate", t.cut_rate},
            {"measure_from", t.measure_from},
            {"measure_to", t.measure_to}}
            .dump()
            .c_str());
    return 0;
  }
  const std::string who =
      peer == "ddp"
          ? "PyTorch DDP"
          : "tessera " + strategy + (tuned_job.communication.momentum_correction ? " (momentum-corrected)" : "");
  std::printf(
      "%s (%lld parameters) on %d emulated nodes x %d ranks, links of %s, global batch %d: %.1f ms per step, "
      "%.1f samples/s; compute %.1f ms",
      who.c_str(), static_cast<long long>(r.params), t.nodes, t.local, t.rate.c_str(), t.batch, r.step_ms, sps,
      r.compute_ms);
  if (peer == "tessera")
    std::printf(" (the slowest rank's %.1f ms), communication %.1f ms exposed of %.1f ms%s", r.slowest_compute_ms,
                r.exposed_ms, r.total_ms, t.overlap ? " (overlapped)" : "");
  std::printf("\n");
  if (!r.exchange.empty()) std::printf("  auto chose %s: %s\n", r.exchange.c_str(), r.reason.c_str());
  for (const auto& e : r.epochs)
    std::printf("  epoch %d at %.1f s: validation loss %.5f, metric %.4f\n", e["epoch"].get<int>(),
                e["seconds"].get<double>(), e["val_loss"].get<double>(), e["val_metric"].get<double>());
  return 0;
}

// The benchmark models' layers as the cost model sees them (Model::cost_layers of bench_job's model),
// for bench/cluster/cost_model.py: one JSON line of (parameters, forward FLOPs per sample) pairs in
// forward order. --size: another input size than the benchmark's (the seed paper's 224 for ResNet-50).
int cost_layers(int argc, char** argv) {
  std::string model;
  int64_t size = 0;
  Flags flags("tessera-bench cost-layers",
              "usage: tessera-bench cost-layers --model cosmoflow|cnn25m|resnet50|transformer [--size W]\n"
              "  prints one JSON line: the model's parameters and its layers' (params, forward FLOPs)\n");
  flags.text("--model", &model).integer("--size", &size, 1, 1 << 16);
  if (!flags.parse(argc, argv, 2)) return 0;
  if (model.empty()) throw ConfigError("--model", "is required");
  JobConfig job = bench_job(model, 1, 1, 1, 1, 1);
  if (flags.given("--size")) {
    if (model == "transformer")
      throw ConfigError("--size", "the transformer's input is its context of tokens, not an image size");
    job.model.input_size = static_cast<int>(size);
  }
  const auto m = make_model(job.model);
  nlohmann::json layers = nlohmann::json::array();
  for (const cost::LayerCost& l : m->cost_layers()) layers.push_back({l.params, l.forward_flops});
  std::printf(
      "%s\n",
      nlohmann::json{{"model", model}, {"size", job.model.input_size}, {"params", m->num_params()}, {"layers", layers}}
          .dump()
          .c_str());
  return 0;
}

}  // namespace tessera::bench
