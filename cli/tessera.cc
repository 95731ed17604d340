// tessera: the command-line tool.
//
//   tessera validate JOB.yaml... [--json]
//       checks TrainingJob manifests: every problem with its field path and reason
//   tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--worker PATH] [--progress SECONDS]
//                        [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]
//       runs the job on this machine (controller/local): virtual nodes from spec.local or the flags,
//       gang placement, rendezvous, workers as processes, gang restart from the last checkpoint;
//       the controller's metrics and the workers' list on --metrics-addr (default a free loopback
//       port); --prometheus starts Debian's Prometheus scraping them (default 127.0.0.1:9090)
//   tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32]
//       writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv
//   tessera data verify DIR
//       reads every file of a dataset and checks it against the manifest
//
// Exit status: 0 done, 2 bad arguments, 1 any other failure (the message names the file).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/training_job.h"
#include "controller/local/local_launcher.h"
#include "worker/core/error.h"
#include "worker/core/log.h"
#include "worker/data/h5_dataset.h"
#include "worker/train/job_config.h"

namespace tessera {
namespace {

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage:\n"
               "  tessera validate JOB.yaml... [--json]\n"
               "  tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--worker PATH] [--progress SECONDS]\n"
               "                       [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]\n"
               "  tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32]\n"
               "  tessera data verify DIR\n");
  return code;
}

long number(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end) throw ConfigError(flag, "'" + v + "' is not an integer");
  return x;
}

int data_generate(int argc, char** argv) {
  std::string kind, out;
  long samples = -1, size = -1, seed = 1;
  bool int16 = true;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    if (a == "--kind") kind = value();
    else if (a == "--samples") samples = number(a, value());
    else if (a == "--size") size = number(a, value());
    else if (a == "--out") out = value();
    else if (a == "--seed") seed = number(a, value());
    else if (a == "--float32") int16 = false;
    else throw ConfigError(a, "unknown flag");
  }
  if (kind.empty()) throw ConfigError("--kind", "required (cosmoflow or unet)");
  if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
  if (size < 4) throw ConfigError("--size", "required, at least 4");
  if (out.empty()) throw ConfigError("--out", "required");
  generate_dataset(kind, static_cast<uint64_t>(samples), static_cast<int>(size), out, static_cast<uint64_t>(seed), int16);
  std::printf("wrote %ld %s samples of size %ld to %s\n", samples, kind.c_str(), size, out.c_str());
  return 0;
}

// A manifest read with every problem: the API's rules, then (when those pass) the model's.
api::ParsedJob check(const std::string& file) {
  api::ParsedJob parsed = api::read_training_job(file);
  if (!parsed.ok()) return parsed;
  try {
    make_job_config(parsed.job);
  } catch (const ConfigError& e) {
    parsed.problems = e.problems();
  }
  return parsed;
}

int validate(int argc, char** argv) {
  std::vector<std::string> files;
  bool as_json = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") as_json = true;
    else if (a.rfind("--", 0) == 0) throw ConfigError(a, "unknown flag");
    else files.push_back(a);
  }
  if (files.empty()) throw ConfigError("validate", "name at least one manifest");
  bool all_ok = true;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& file : files) {
    const api::ParsedJob p = check(file);
    all_ok = all_ok && p.ok();
    if (as_json) {
      nlohmann::json problems = nlohmann::json::array();
      for (const auto& q : p.problems) problems.push_back({{"field", q.field}, {"reason", q.reason}});
      out.push_back({{"file", file}, {"valid", p.ok()}, {"problems", problems}});
      continue;
    }
    if (p.ok()) {
      const auto& s = p.job.spec;
      std::printf("%s: valid: TrainingJob %s, %d workers (%d replicas x %d ranks), spatial %d x data %d, %s, %s\n",
                  file.c_str(), p.job.name.c_str(), s.workers(), s.replicas, s.ranks_per_replica,
                  s.parallelism.spatial_size(), s.data_replicas(), s.model.name.c_str(), s.communication.strategy.c_str());
    } else {
      std::printf("%s: %zu problem%s\n", file.c_str(), p.problems.size(), p.problems.size() == 1 ? "" : "s");
      for (const auto& q : p.problems) std::printf("  %s: %s\n", q.field.c_str(), q.reason.c_str());
    }
  }
  if (as_json) std::printf("%s\n", (files.size() == 1 ? out[0] : out).dump(2).c_str());
  return all_ok ? 0 : 2;
}

void on_signal(int) { local::LocalLauncher::interrupt(); }

int run_job(int argc, char** argv) {
  if (argc < 3) return usage(2);
  const std::string file = argv[2];
  local::LocalOptions options;
  options.manifest = file;
  options.worker_bin = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "tessera-worker").string();
  int nodes = 0, gpus = 0;  // 0: as the manifest says
  std::string work_dir;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    auto positive = [&]() {
      const long v = number(a, value());
      if (v < 1) throw ConfigError(a, "must be at least 1");
      return static_cast<int>(v);
    };
    if (a == "--nodes") nodes = positive();
    else if (a == "--gpus-per-node") gpus = positive();
    else if (a == "--work-dir") work_dir = value();
    else if (a == "--worker") options.worker_bin = value();
    else if (a == "--progress") options.progress_seconds = positive();
    else if (a == "--metrics-addr") options.metrics_addr = value();
    else if (a == "--prometheus") options.prometheus_addr = "127.0.0.1:9090";
    else if (a.rfind("--prometheus=", 0) == 0) options.prometheus_addr = a.substr(13);
    else throw ConfigError(a, "unknown flag");
  }
  if (!options.prometheus_addr.empty() && std::system("command -v prometheus >/dev/null 2>&1") != 0)
    throw ConfigError("--prometheus", "no prometheus command on PATH (Debian: apt-get install prometheus)");
  api::ParsedJob p = check(file);
  if (!p.ok()) throw ConfigError(p.problems);
  if (nodes) p.job.spec.local.nodes = nodes;
  if (gpus) p.job.spec.local.gpus_per_node = gpus;
  if (!work_dir.empty()) p.job.spec.local.work_dir = work_dir;
  if (access(options.worker_bin.c_str(), X_OK) != 0)
    throw ConfigError("--worker", "'" + options.worker_bin + "' is not an executable tessera-worker");
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  local::LocalLauncher launcher(p.job, options);
  return launcher.run().exit_code();
}

int run(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "validate") return validate(argc, argv);
  if (argc >= 2 && std::string(argv[1]) == "run") return run_job(argc, argv);
  if (argc < 3 || std::string(argv[1]) != "data") return usage(2);
  const std::string cmd = argv[2];
  if (cmd == "generate") return data_generate(argc, argv);
  if (cmd == "verify") {
    if (argc != 4) return usage(2);
    verify_dataset(argv[3]);
    std::printf("%s: every sample matches the manifest\n", argv[3]);
    return 0;
  }
  return usage(2);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera", [&] { return tessera::run(argc, argv); });
}
