// tessera: the command-line tool.
//
//   tessera validate JOB.yaml... [--json]
//       checks TrainingJob manifests: every problem with its field path and reason
//   tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--fresh] [--worker PATH]
//                        [--progress SECONDS] [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]
//       runs the job on this machine (controller/local): virtual nodes from spec.local or the flags,
//       gang placement, rendezvous, workers as processes, gang restart from the last checkpoint;
//       the controller's metrics and the workers' list on --metrics-addr (default a free loopback
//       port); --prometheus starts Debian's Prometheus scraping them (default 127.0.0.1:9090)
//   tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] [--replace]
//       writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv
//   tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels first|last]
//                          [--progress S]
//       scans a directory of HDF5 files or .npy pairs, checks them and writes its manifest.tsv
//   tessera data read JOB.yaml --sample I [--rank R] [--validation] --out PREFIX
//       writes the block of a sample that a rank of the job reads (PREFIX_x.npy, PREFIX_y.npy)
//   tessera data verify DIR
//       reads every file of a dataset and checks it against the manifest
//
// Every command takes --help (-h): its usage on standard output, status 0.
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
#include "worker/data/dataset_index.h"
#include "worker/spatial/partition.h"
#include "worker/train/job_config.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

constexpr const char* kValidateUsage =
    "usage: tessera validate JOB.yaml... [--json]\n"
    "Checks TrainingJob manifests against the API's rules and the model's: every problem with its field\n"
    "path and reason. Status 0 when every manifest is valid, 2 otherwise.\n";
constexpr const char* kRunUsage =
    "usage: tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--fresh] [--worker PATH]\n"
    "                   [--progress SECONDS] [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]\n"
    "Runs the job on this machine: virtual nodes (spec.local or --nodes / --gpus-per-node), gang\n"
    "placement, rendezvous, one worker process per rank, gang restart from the last checkpoint.\n"
    "  --work-dir DIR     logs, status, and relative checkpoint and cache paths (default .tessera/NAME)\n"
    "  --fresh            start over: remove the job's checkpoints first (the SSD cache is kept)\n"
    "  --metrics-addr     the controller's /metrics and /targets (default a free loopback port)\n"
    "  --prometheus       start Debian's Prometheus scraping them (default 127.0.0.1:9090)\n";
constexpr const char* kGenerateUsage =
    "usage: tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] [--replace]\n"
    "Writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv into DIR, which\n"
    "must be new or empty; --replace replaces a dataset already there. CosmoFlow sizes are powers of\n"
    "two, U-Net sizes multiples of 4.\n";
constexpr const char* kIndexUsage =
    "usage: tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels first|last]\n"
    "                              [--progress S]\n"
    "Scans DIR (recursively, sorted) for sample files: HDF5 files (.h5, .hdf5), one sample each, or .npy\n"
    "pairs NAME_x.npy (volume) and NAME_y.npy (labels). Detects their layout from the first, checks that\n"
    "every file agrees (shapes, types, target lengths, no NaN in float volumes, whole labels) and writes\n"
    "DIR/manifest.tsv with every file's size and checksum. The files are not changed. docs/data.md\n"
    "describes the layouts.\n"
    "  --layout L       cosmo (C, D, H, W), cosmo-channels-last (D, H, W, C), unet, unet-npy (default: detected)\n"
    "  --input-key K    the HDF5 dataset of the volume (default full, else volume)\n"
    "  --target-key K   the HDF5 dataset of the targets or labels (default unitPar, else segmentation)\n"
    "  --transform T    log1p, none or standardize (each volume by its channels' mean and std); default\n"
    "                   log1p for cosmo layouts, none for unet\n"
    "  --channels C     which end of a 4-d cosmo volume holds the channels, when detection cannot tell\n"
    "  --progress S     report progress every S seconds (default 5)\n";
constexpr const char* kReadUsage =
    "usage: tessera data read JOB.yaml --sample I [--rank R] [--validation] --out PREFIX\n"
    "Reads sample I of the job's dataset (spec.dataset.path, or validationPath with --validation;\n"
    "samples are numbered in file order, a cropped file's sub-volumes in D, H, W order) as rank R of\n"
    "the job reads it: its block under spec.parallelism.spatial, transformed. Writes the block to\n"
    "PREFIX_x.npy and its targets (or labels) to PREFIX_y.npy, float32.\n";
constexpr const char* kVerifyUsage =
    "usage: tessera data verify DIR\n"
    "Reads every file of a dataset and checks it against its manifest.\n";

int usage(int code) {
  std::fprintf(code ? stderr : stdout,
               "usage:\n"
               "  tessera validate JOB.yaml... [--json]\n"
               "  tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--fresh] [--worker PATH]\n"
               "                       [--progress SECONDS] [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]\n"
               "  tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] [--replace]\n"
               "  tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels first|last]\n"
               "                     [--progress S]\n"
               "  tessera data read JOB.yaml --sample I [--rank R] [--validation] --out PREFIX\n"
               "  tessera data verify DIR\n"
               "tessera COMMAND --help explains one command.\n");
  return code;
}

// --help or -h among a command's arguments (from `first` on).
bool asks_help(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
  return false;
}

int help(const char* text) {
  std::fputs(text, stdout);
  return 0;
}

// An argument that is neither a known flag nor where a file goes.
[[noreturn]] void bad_argument(const std::string& a, const char* command) {
  if (a.rfind("-", 0) == 0) throw ConfigError(a, detail::concat("unknown flag (tessera ", command, " --help lists them)"));
  throw ConfigError(a, detail::concat("unexpected argument (tessera ", command, " --help shows what it takes)"));
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
  bool int16 = true, replace = false;
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
    else if (a == "--replace") replace = true;
    else bad_argument(a, "data generate");
  }
  if (kind.empty()) throw ConfigError("--kind", "required (cosmoflow or unet)");
  if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
  if (size < 4) throw ConfigError("--size", "required, at least 4");
  if (out.empty()) throw ConfigError("--out", "required");
  generate_dataset(kind, static_cast<uint64_t>(samples), static_cast<int>(size), out, static_cast<uint64_t>(seed), int16,
                   replace);
  std::printf("wrote %ld %s samples of size %ld to %s\n", samples, kind.c_str(), size, out.c_str());
  return 0;
}

// A manifest read with every problem: the API's rules, then (when those pass) the model's.
// A manifest read and checked as every worker would; *parameters: its model's.
api::ParsedJob check(const std::string& file, int64_t* parameters) {
  api::ParsedJob parsed = api::read_training_job(file);
  if (!parsed.ok()) return parsed;
  try {
    *parameters = make_job_config(parsed.job).parameters;
  } catch (const ConfigError& e) {
    parsed.problems = e.problems();
  }
  return parsed;
}

// "512", "17.9K", "9.0M", "1.2B", "1.1T" for a count of parameters.
std::string short_count(int64_t n) {
  if (n >= 1'000'000'000'000) return detail::concat(std::round(n / 1e11) / 10, "T");
  if (n >= 1'000'000'000) return detail::concat(std::round(n / 1e8) / 10, "B");
  if (n >= 1'000'000) return detail::concat(std::round(n / 1e5) / 10, "M");
  if (n >= 1'000) return detail::concat(std::round(n / 1e2) / 10, "K");
  return std::to_string(n);
}

int validate(int argc, char** argv) {
  std::vector<std::string> files;
  bool as_json = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") as_json = true;
    else if (a.rfind("-", 0) == 0 && a != "-") bad_argument(a, "validate");
    else files.push_back(a);
  }
  if (files.empty()) throw ConfigError("validate", "name at least one manifest");
  bool all_ok = true;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& file : files) {
    int64_t parameters = 0;
    const api::ParsedJob p = check(file, &parameters);
    all_ok = all_ok && p.ok();
    if (as_json) {
      nlohmann::json problems = nlohmann::json::array();
      for (const auto& q : p.problems) problems.push_back({{"field", q.field}, {"reason", q.reason}});
      out.push_back({{"file", file}, {"valid", p.ok()}, {"problems", problems}});
      if (p.ok()) out.back()["parameters"] = parameters;
      continue;
    }
    if (p.ok()) {
      const auto& s = p.job.spec;
      std::printf("%s: valid: TrainingJob %s, %s (%s x %s), spatial %d x data %d, %s (%s parameters), %s\n", file.c_str(),
                  p.job.name.c_str(), detail::count(s.workers(), "worker").c_str(), detail::count(s.replicas, "replica").c_str(),
                  detail::count(s.ranks_per_replica, "rank").c_str(), s.parallelism.spatial_size(), s.data_replicas(),
                  s.model.name.c_str(), short_count(parameters).c_str(), s.communication.strategy.c_str());
    } else {
      std::printf("%s: %s\n", file.c_str(), detail::count(p.problems.size(), "problem").c_str());
      for (const auto& q : p.problems) std::printf("  %s: %s\n", q.field.c_str(), q.reason.c_str());
    }
  }
  if (as_json) std::printf("%s\n", (files.size() == 1 ? out[0] : out).dump(2).c_str());
  return all_ok ? 0 : 2;
}

void on_signal(int) { local::LocalLauncher::interrupt(); }

int run_job(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]).rfind("-", 0) == 0) throw ConfigError("run", "name the manifest: tessera run JOB.yaml");
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
    else if (a == "--fresh") options.fresh = true;
    else if (a.rfind("-", 0) != 0) throw ConfigError(a, "unexpected argument (tessera run takes one manifest)");
    else bad_argument(a, "run");
  }
  if (!options.prometheus_addr.empty() && std::system("command -v prometheus >/dev/null 2>&1") != 0)
    throw ConfigError("--prometheus", "no prometheus command on PATH (Debian: apt-get install prometheus)");
  int64_t parameters = 0;
  api::ParsedJob p = check(file, &parameters);
  if (!p.ok()) throw ConfigError(p.problems);
  if (nodes) p.job.spec.local.nodes = nodes;
  if (gpus) p.job.spec.local.gpus_per_node = gpus;
  if (nodes || gpus)
    options.cluster_from = detail::concat("--nodes ", p.job.spec.local.nodes, " --gpus-per-node ", p.job.spec.local.gpus_per_node);
  if (!work_dir.empty()) p.job.spec.local.work_dir = work_dir;
  if (access(options.worker_bin.c_str(), X_OK) != 0)
    throw ConfigError("--worker", "'" + options.worker_bin + "' is not an executable tessera-worker");
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  local::LocalLauncher launcher(p.job, options);
  return launcher.run().exit_code();
}

int data_index(int argc, char** argv) {
  std::string dir;
  IndexOptions o;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    if (a == "--layout") o.layout = value();
    else if (a == "--input-key") o.input_key = value();
    else if (a == "--target-key") o.target_key = value();
    else if (a == "--transform") o.transform = value();
    else if (a == "--channels") o.channels = value();
    else if (a == "--progress") o.progress_seconds = std::max(0L, number(a, value()));
    else if (a.rfind("-", 0) != 0 && dir.empty()) dir = a;
    else bad_argument(a, "data index");
  }
  if (dir.empty()) throw ConfigError("data index", "name the dataset directory: tessera data index DIR");
  const DatasetIndex x = index_dataset(dir, o);
  std::printf("%s: indexed %s (%s) in %s/manifest.tsv\n", dir.c_str(), detail::count(x.entries.size(), "sample").c_str(),
              x.describe().c_str(), dir.c_str());
  return 0;
}

int data_read(int argc, char** argv) {
  std::string file, out;
  long sample = -1, rank = 0;
  bool validation = false;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(a, "needs a value");
      return argv[++i];
    };
    if (a == "--sample") sample = number(a, value());
    else if (a == "--rank") rank = number(a, value());
    else if (a == "--validation") validation = true;
    else if (a == "--out") out = value();
    else if (a.rfind("-", 0) != 0 && file.empty()) file = a;
    else bad_argument(a, "data read");
  }
  if (file.empty()) throw ConfigError("data read", "name the job: tessera data read JOB.yaml --sample I --out PREFIX");
  if (sample < 0) throw ConfigError("--sample", "required, a sample number from 0");
  if (out.empty()) throw ConfigError("--out", "required: the prefix of the .npy files to write");
  const JobConfig c = load_job_config(file);
  if (c.data.format != "hdf5") throw ConfigError("spec.dataset.format", "'" + c.data.format + "': only files are read (format: hdf5)");
  if (rank < 0 || rank >= c.workers) throw ConfigError("--rank", detail::concat(rank, " is not a rank of the job's ", c.workers, " workers"));
  const std::string dir = validation ? c.data.validation_path : c.data.path;
  if (dir.empty()) throw ConfigError("--validation", "the job has no spec.dataset.validationPath");
  ModelConfig whole = c.model;
  whole.spatial = {};
  const auto model = make_model(whole);
  PosixFileSystem fs;
  const auto data = open_file_dataset(c, *model, dir, validation ? "validationPath" : "path", fs, nullptr);
  if (static_cast<uint64_t>(sample) >= data->size())
    throw ConfigError("--sample", detail::concat(sample, " is past the ", detail::count(data->size(), "sample"), " under ", dir));
  const Shape s = data->input_shape();
  VolumeBox box;
  const Partition part({s[1], s[2], s[3]}, c.model.spatial, static_cast<int>(rank % c.model.spatial.size()), "--rank");
  for (int d = 0; d < 3; ++d) {
    box.begin[d] = part.owned(d).begin;
    box.end[d] = part.owned(d).end;
  }
  const Sample b = data->get_block(static_cast<uint64_t>(sample), box);
  write_npy(out + "_x.npy", b.input);
  write_npy(out + "_y.npy", b.target);
  std::printf("sample %ld of %s: %s, sub-volume %s; rank %ld reads block %s: %s (transform %s), targets %s\n", sample,
              detail::count(data->size(), "sample").c_str(), data->file(static_cast<uint64_t>(sample)).c_str(),
              data->sub_volume(static_cast<uint64_t>(sample)).str().c_str(), rank, box.str().c_str(),
              shape_str(b.input.shape()).c_str(), data->index().transform.c_str(), shape_str(b.target.shape()).c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage(2);
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return usage(0);
  if (cmd == "validate") return asks_help(argc, argv, 2) ? help(kValidateUsage) : validate(argc, argv);
  if (cmd == "run") return asks_help(argc, argv, 2) ? help(kRunUsage) : run_job(argc, argv);
  if (cmd != "data") throw ConfigError(cmd, "unknown command (expected validate, run or data; tessera --help)");
  const std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "generate") return asks_help(argc, argv, 3) ? help(kGenerateUsage) : data_generate(argc, argv);
  if (sub == "index") return asks_help(argc, argv, 3) ? help(kIndexUsage) : data_index(argc, argv);
  if (sub == "read") return asks_help(argc, argv, 3) ? help(kReadUsage) : data_read(argc, argv);
  if (sub == "verify") {
    if (asks_help(argc, argv, 3)) return help(kVerifyUsage);
    if (argc < 4) throw ConfigError("data verify", "name the dataset directory: tessera data verify DIR");
    if (argc > 4) bad_argument(argv[4], "data verify");
    verify_dataset(argv[3]);
    std::printf("%s: every sample matches the manifest\n", argv[3]);
    return 0;
  }
  if (sub == "--help" || sub == "-h") return help("usage: tessera data generate|index|read|verify ... (tessera data index --help)\n");
  throw ConfigError(sub.empty() ? "data" : sub, "expected tessera data generate, index, read or verify");
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera", [&] { return tessera::run(argc, argv); });
}
