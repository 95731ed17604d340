// tessera plan: each exchange strategy's predicted step for a manifest, before it runs, from the
// cost model (common/cost_model.h), the model's layers and a step's compute.
#include "cli/plan.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cost_model.h"
#include "common/error.h"
#include "common/exchange_choice.h"
#include "common/flags.h"
#include "worker/comm/exchange.h"
#include "worker/models/model.h"
#include "worker/nn/optim.h"
#include "worker/train/job_config.h"

namespace tessera {
namespace {

constexpr const char* kPlanUsage =
    "usage: tessera plan JOB.yaml --links RATE [--nodes N] [--gpus-per-node G] [--compute-ms MS] [--json]\n"
    "Predicts a training step of the job under each gradient exchange (dense, torus, topk, hitopk at the\n"
    "job's density, and hybrid with the job's switch epoch) with the cost model, before anything runs.\n"
    "  --links RATE       the links between nodes: 100mbit, 1gbit, 25gbit... (default spec.local.network.rate)\n"
    "  --nodes N          nodes (default spec.local.nodes, else one per replica)\n"
    "  --gpus-per-node G  ranks on each node (default spec.local.gpusPerNode, else ranksPerReplica)\n"
    "  --compute-ms MS    a step's forward, backward and update on one rank; default: timed here on the\n"
    "                     CPU for a job on the CPU (a GPU job needs it given)\n"
    "Inside a node ranks exchange through shared memory (CPU) or NVLink (GPU). The link and CPU costs are\n"
    "defaults for such machines (docs/benchmarks/journal/*.cost_model.json: the emulated cluster's calibrations).\n";

// A step's forward, backward and update of `model` (the job's) on `batch` samples here, in seconds
// (the better of two after a warm-up).
double time_compute(const JobConfig& job, Model& model, int batch) {
  if (job.training.threads > 0) omp_set_num_threads(job.training.threads);
  const ModelConfig& mc = job.model;
  Shape in = {batch}, tgt = {batch};
  for (int64_t d : model.sample_shape()) in.push_back(d);
  for (int64_t d : model.target_shape()) tgt.push_back(d);
  Tensor x(in), y(tgt);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  const int classes = mc.name == "transformer" ? mc.vocab_size : std::max(mc.outputs, 2);
  for (auto& v : x.span()) v = mc.name == "transformer" ? static_cast<float>(rng() % classes) : u(rng);
  for (auto& v : y.span()) v = model.task() == Task::kRegression ? u(rng) : static_cast<float>(rng() % classes);
  auto opt = make_optimizer(job.training.optimizer);
  auto params = model.params();
  double best = INFINITY;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (Param* p : params) p->grad.zero();
    Tensor out = model.forward(x, true);
    model.backward(model.loss(out, y).grad);
    opt->step(params, 1e-4);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) best = std::min(best, s);
  }
  return best;
}

// Links and CPU costs of a machine of this kind, before the gang measures its own: the wire at 90%
// of the rate with 50 us a message; inside a node NVLink for GPUs, shared memory for CPU ranks; GPU
// kernels or CPU loops for selection and passes. The CPU figures are the emulated cluster's
// calibration (docs/benchmarks/journal/notebook.md, "The cost model"); the GPU figures the cost model's seed setting.
cost::Machine default_machine(double bits_per_second, bool gpu) {
  cost::Machine m;
  m.alpha_inter = 50e-6;
  m.wire_inter = 8 / (0.9 * bits_per_second);
  if (gpu) {
    m.alpha_intra = 5e-6, m.cpu_intra = 1 / 130e9;
    m.selection = {{0.001, 0.02e-9}, {0.01, 0.02e-9}};
    m.pass = 0.005e-9, m.add = 0.02e-9, m.hidden = 1.0;
  } else {
    m.alpha_intra = 150e-6, m.cpu_intra = 0.58e-9, m.cpu_inter = 1.0e-9;
    m.selection = {{0.001, 0.24e-9}, {0.01, 0.49e-9}};
    m.pass = 0.17e-9, m.add = 9.5e-9, m.hidden = 0.68;
  }
  return m;
}

}  // namespace

int plan(int argc, char** argv) {
  std::vector<std::string> files;
  std::string links;
  int64_t nodes = 0, per_node = 0;
  double compute_ms = 0;
  bool json = false;
  Flags flags("tessera plan", kPlanUsage);
  flags.positional(&files, 1, 1, "JOB.yaml")
      .text("--links", &links)
      .integer("--nodes", &nodes, 1, 1 << 20)
      .integer("--gpus-per-node", &per_node, 1, 1024)
      .real("--compute-ms", &compute_ms, Interval::above(0))
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  const JobConfig job = load_job_config(files[0]);
  const api::TrainingJob spec = api::load_training_job(files[0]);
  if (links.empty()) links = spec.spec.local.network_rate;
  if (links.empty())
    throw ConfigError("--links", "required: the job has no spec.local.network.rate (e.g. --links 1gbit)");
  const double bits = cost::link_bits_per_second(links, "--links");
  if (job.model.spatial.size() > 1)
    throw ConfigError("spec.parallelism.spatial",
                      "tessera plan predicts data-parallel jobs; a spatial grid's exchanges are not modelled");
  const int m = static_cast<int>(nodes ? nodes : spec.spec.local.nodes);
  const int n = static_cast<int>(per_node ? per_node : spec.spec.local.gpus_per_node);
  if (static_cast<int64_t>(m) * n != job.workers)
    throw ConfigError(nodes      ? "--nodes"
                      : per_node ? "--gpus-per-node"
                                 : "spec.local",
                      detail::concat(m, " nodes x ", n, " ranks per node is not the job's ", job.workers, " workers"));
  const bool gpu = job.device == "cuda" || (job.device == "auto" && job.gpus_per_pod > 0);
  const int batch = job.training.batch_size / job.workers;
  auto model = make_model(job.model);
  std::string compute_from = "given";
  if (!flags.given("--compute-ms")) {
    if (gpu)
      throw ConfigError(
          "--compute-ms",
          "the job trains on GPUs: give a step's compute time on one (this command times it on the CPU only)");
    compute_ms = 1e3 * time_compute(job, *model, std::max(1, batch));
    compute_from = detail::concat("timed here on the CPU, ", omp_get_max_threads(), " threads");
  }
  const cost::Machine mc = default_machine(bits, gpu);
  const auto layers = model->cost_layers();
  const double params = static_cast<double>(model->num_params());
  const auto& c = job.communication;
  const double bucket = static_cast<double>(c.bucket_bytes);
  const int value_bytes = static_cast<int>(dtype_size(wire_type(c.gradient_precision)));
  // momentum correction's passes where the job keeps velocities: its sparse strategies and both
  // phases of its hybrid schedule (a job that exchanges densely throughout keeps none)
  auto step = [&](const std::string& s, bool corrected = false) {
    return cost::step_cost(layers, cost::parse_strategy(s), c.density, m, n, mc, compute_ms / 1e3, 0, c.overlap, bucket,
                           corrected && c.momentum_correction, value_bytes);
  };
  nlohmann::json rows = nlohmann::json::array();
  auto row = [&](const std::string& name, double density, const cost::StepCost& p) {
    rows.push_back({{"strategy", name},
                    {"density", density},
                    {"step_ms", 1e3 * p.seconds},
                    {"exposed_ms", 1e3 * p.exposed},
                    {"samples_per_second", job.training.batch_size / p.seconds}});
  };
  for (const char* s : {"dense", "torus"}) row(s, 1, step(s));
  for (const char* s : {"topk", "hitopk"}) row(s, c.density, step(s, true));
  // hybrid: the sparse strategy for the first switchAtEpoch epochs, the dense one after
  const double sparse_share = std::min(1.0, static_cast<double>(c.switch_at_epoch) / job.training.epochs);
  const cost::StepCost sp = step(c.sparse, true), de = step(c.dense, true);
  cost::StepCost hy;
  hy.seconds = sparse_share * sp.seconds + (1 - sparse_share) * de.seconds;
  hy.exposed = sparse_share * sp.exposed + (1 - sparse_share) * de.exposed;
  row(detail::concat("hybrid (", c.sparse, " for ", c.switch_at_epoch, " of ", job.training.epochs, " epochs, then ",
                     c.dense, ")"),
      c.density, hy);
  // What strategy auto would choose on such links (the controller chooses from the gang's own
  // measurements): a sparse phase for the epochs before switchAtEpoch (auto's default: half the
  // epochs, none where momentum is applied after the exchange).
  cost::ChoiceInput choice_in;
  choice_in.buckets = cost::buckets(layers, bucket);
  choice_in.nodes = m, choice_in.local = n;
  choice_in.machine = mc;
  choice_in.compute_s = compute_ms / 1e3;
  choice_in.overlap = c.overlap;
  choice_in.value_bytes = value_bytes;
  const int sparse_epochs = c.strategy == "auto" || c.strategy == "hybrid"        ? c.switch_at_epoch
                            : api::momentum_after_exchange(spec.spec.training, c) ? 0
                                                                                  : job.training.epochs / 2;
  choice_in.sparse_share = std::clamp(static_cast<double>(sparse_epochs) / job.training.epochs, 0.0, 1.0);
  choice_in.sparse_allowed = sparse_epochs > 0;
  choice_in.densities = {c.density};
  choice_in.measured = false;
  const cost::ExchangeChoice choice = cost::choose_exchange(choice_in);
  if (json) {
    std::printf("%s\n", nlohmann::json{{"job", spec.name},
                                       {"links", links},
                                       {"nodes", m},
                                       {"ranks_per_node", n},
                                       {"parameters", params},
                                       {"compute_ms", compute_ms},
                                       {"compute_from", compute_from},
                                       {"overlap", c.overlap},
                                       {"gradient_precision", c.gradient_precision},
                                       {"device", gpu ? "gpu" : "cpu"},
                                       {"strategies", rows},
                                       {"auto",
                                        {{"exchange", choice.chosen.name()},
                                         {"mean_step_ms", 1e3 * choice.chosen.mean_step},
                                         {"reason", choice.reason}}}}
                            .dump()
                            .c_str());
    return 0;
  }
  std::printf(
      "%s: %s (%.1fM parameters), %s x %s, links of %s, global batch %d; a step's compute %.1f ms (%s);\n"
      "overlap %s; gradients sent in %s; costs of %s ranks (tessera plan --help)\n\n",
      spec.name.c_str(), job.model.name.c_str(), params / 1e6, detail::count(m, "node").c_str(),
      detail::count(n, "rank").c_str(), links.c_str(), job.training.batch_size, compute_ms, compute_from.c_str(),
      c.overlap ? "on" : "off", c.gradient_precision.c_str(), gpu ? "GPU" : "CPU");
  std::printf("  %-48s %8s %10s %12s %10s\n", "strategy", "density", "step ms", "exposed ms", "samples/s");
  size_t best = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    if (r["step_ms"].get<double>() < rows[best]["step_ms"].get<double>()) best = i;
    std::printf("  %-48s %8g %10.1f %12.1f %10.1f\n", r["strategy"].get<std::string>().c_str(),
                r["density"].get<double>(), r["step_ms"].get<double>(), r["exposed_ms"].get<double>(),
                r["samples_per_second"].get<double>());
  }
  std::printf("\nfastest: %s, %.2fx dense's step\n", rows[best]["strategy"].get<std::string>().c_str(),
              rows[0]["step_ms"].get<double>() / rows[best]["step_ms"].get<double>());
  std::printf("strategy auto would choose %s (%.1f ms a step over the job): %s\n", choice.chosen.name().c_str(),
              1e3 * choice.chosen.mean_step, choice.reason.c_str());
  return 0;
}

}  // namespace tessera
