// tessera: the command-line tool.
//
//   tessera validate JOB.yaml... [--json] [--strict]
//       checks TrainingJob manifests: every problem with its field path and reason; fields with no
//       effect as warnings (--strict: as problems)
//   tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--fresh] [--worker PATH]
//                        [--progress SECONDS] [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]
//       runs the job on this machine (controller/local): virtual nodes from spec.local or the flags,
//       gang placement, rendezvous, workers as processes, gang restart from the last checkpoint;
//       the controller's metrics and the workers' list on --metrics-addr (default a free loopback
//       port); --prometheus starts Debian's Prometheus scraping them (default 127.0.0.1:9090)
//   tessera plan JOB.yaml --links RATE [--nodes N] [--gpus-per-node G] [--compute-ms MS] [--json]
//       predicts a step of the job under each gradient exchange (cli/plan.cc)
//   tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] [--replace]
//       writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv
//   tessera data generate --kind images --samples N --size W --out DIR [--classes K] [--seed S] ...
//       writes an ImageFolder of JPEGs and its manifest.tsv
//   tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels first|last]
//                          [--progress S]
//       scans a directory of HDF5 files or .npy pairs, checks them and writes its manifest.tsv
//   tessera data read JOB.yaml --sample I [--rank R] [--validation] [--epoch E] --out PREFIX
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
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "api/training_job.h"
#include "cli/plan.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/log.h"
#include "controller/local/local_launcher.h"
#include "worker/data/dataset_index.h"
#include "worker/data/image_folder.h"
#include "worker/data/tokens.h"
#include "worker/spatial/partition.h"
#include "worker/train/job_config.h"
#include "worker/train/trainer.h"

namespace tessera {
namespace {

constexpr const char* kValidateUsage =
    "usage: tessera validate JOB.yaml... [--json] [--strict]\n"
    "Checks TrainingJob manifests against the API's rules and the model's: every problem with its field\n"
    "path and reason, and as warnings the fields that have no effect where they stand (--strict: those\n"
    "are problems too). Status 0 when every manifest is valid, 2 otherwise.\n";
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
    "usage: tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] "
    "[--replace]\n"
    "       tessera data generate --kind text --out DIR [--source FILE[,FILE...]] [--validation-fraction F] "
    "[--replace]\n"
    "       tessera data generate --kind images --samples N --size W --out DIR [--classes K] [--seed S]\n"
    "                             [--validation-fraction F] [--replace]\n"
    "Writes a dataset of HDF5 sample files (chunked, compressed) and its manifest.tsv into DIR, which\n"
    "must be new or empty; --replace replaces a dataset already there. CosmoFlow sizes are powers of\n"
    "two, U-Net sizes multiples of 4.\n"
    "--kind text writes a language model's token files as nanoGPT does: train.bin and val.bin (uint16\n"
    "ids, byte-level: vocabulary 256) and meta.json, from English text: the Debian package fortunes'\n"
    "files, or --source. The last --validation-fraction of the text (default 0.1) is val.bin.\n"
    "--kind images writes an ImageFolder (DIR/train/<shape>/*.jpg and DIR/val/<shape>/*.jpg) of W x W\n"
    "JPEGs of K kinds of shape (2-10, default 10) in random colours, places and sizes on noisy\n"
    "backgrounds, N for training and N times --validation-fraction for validation, and indexes it.\n";
constexpr const char* kIndexUsage =
    "usage: tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels "
    "first|last]\n"
    "                              [--progress S] [--vocab-size V] [--token-bytes 2|4]\n"
    "Scans DIR (recursively, sorted) for sample files: HDF5 files (.h5, .hdf5), one sample each, or .npy\n"
    "pairs NAME_x.npy (volume) and NAME_y.npy (labels). Detects their layout from the first, checks that\n"
    "every file agrees (shapes, types, target lengths, no NaN in float volumes, whole labels) and writes\n"
    "DIR/manifest.tsv with every file's size and checksum. The files are not changed. docs/data.md\n"
    "describes the layouts.\n"
    "A DIR with a train/ directory (or --layout imagefolder) is an ImageFolder dataset: JPEG images in\n"
    "DIR/train/<class>/ and DIR/val/<class>/. Every image is decoded on every core to find damaged\n"
    "files (all listed); empty classes and class sets that differ between train/ and val/ are errors.\n"
    "A DIR with train.bin is a language model's token files (nanoGPT's layout: train.bin and val.bin, flat\n"
    "little-endian ids): both are checked as training reads them and DIR/meta.json records the vocabulary\n"
    "size, the token width and the files' tokens.\n"
    "  --layout L       cosmo (C, D, H, W), cosmo-channels-last (D, H, W, C), unet, unet-npy (default: detected)\n"
    "  --input-key K    the HDF5 dataset of the volume (default full, else volume)\n"
    "  --target-key K   the HDF5 dataset of the targets or labels (default unitPar, else segmentation)\n"
    "  --transform T    log1p, none or standardize (each volume by its channels' mean and std); default\n"
    "                   log1p for cosmo layouts, none for unet\n"
    "  --channels C     which end of a 4-d cosmo volume holds the channels, when detection cannot tell\n"
    "  --progress S     report progress every S seconds (default 5)\n"
    "  --vocab-size V   token files: every id is below V (default: meta.json's vocabSize)\n"
    "  --token-bytes B  token files: 2 (uint16, default) or 4 (uint32) bytes an id (default: meta.json's dtype)\n";
constexpr const char* kReadUsage =
    "usage: tessera data read JOB.yaml --sample I [--rank R] [--validation] [--epoch E] --out PREFIX\n"
    "Reads sample I of the job's dataset (spec.dataset.path, or validationPath with --validation;\n"
    "samples are numbered in file order, a cropped file's sub-volumes in D, H, W order) as rank R of\n"
    "the job reads it: its block under spec.parallelism.spatial, transformed. Writes the block to\n"
    "PREFIX_x.npy and its targets (or labels) to PREFIX_y.npy, float32.\n"
    "An imagefolder dataset's sample I is image I of train/ (val/ with --validation), in the manifest's\n"
    "order, as the model gets it: (3, S, S), normalised; a training image as augmented in --epoch E.\n";
constexpr const char* kNodeUsage =
    "usage: tessera node remove|add NODE --work-dir DIR\n"
    "Changes the virtual cluster of the tessera run whose work directory is DIR while its job runs:\n"
    "remove takes virtual node NODE (local-K) away as a lost machine (its pods killed at once; the gang\n"
    "is placed again without it, on fewer replicas if the job is elastic); add brings it back.\n";
constexpr const char* kVerifyUsage =
    "usage: tessera data verify DIR\n"
    "Reads every file of a dataset and checks it against its manifest.\n";

int usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage:\n"
      "  tessera validate JOB.yaml... [--json] [--strict]\n"
      "  tessera run JOB.yaml [--nodes N] [--gpus-per-node G] [--work-dir DIR] [--fresh] [--worker PATH]\n"
      "                       [--progress SECONDS] [--metrics-addr HOST:PORT] [--prometheus[=HOST:PORT]]\n"
      "  tessera plan JOB.yaml --links RATE [--nodes N] [--gpus-per-node G] [--compute-ms MS] [--json]\n"
      "  tessera data generate --kind cosmoflow|unet --samples N --size W --out DIR [--seed S] [--float32] "
      "[--replace]\n"
      "  tessera data generate --kind text --out DIR [--source FILE[,FILE...]] [--validation-fraction F] [--replace]\n"
      "  tessera data generate --kind images --samples N --size W --out DIR [--classes K] [--seed S] [--replace]\n"
      "  tessera data index DIR [--layout L] [--input-key K] [--target-key K] [--transform T] [--channels first|last]\n"
      "                     [--progress S]\n"
      "  tessera data read JOB.yaml --sample I [--rank R] [--validation] --out PREFIX\n"
      "  tessera data verify DIR\n"
      "  tessera node remove|add NODE --work-dir DIR\n"
      "tessera COMMAND --help explains one command.\n");
  return code;
}

int data_generate(int argc, char** argv) {
  std::string kind, out, source;
  int64_t samples = -1, size = -1, seed = 1, classes = 10;
  double validation_fraction = 0.1;
  bool float32 = false, replace = false;
  Flags flags("tessera data generate", kGenerateUsage);
  flags.text("--kind", &kind)
      .integer("--samples", &samples, 1, 1'000'000'000)
      .integer("--size", &size, 4, 4096)
      .text("--out", &out)
      .integer("--seed", &seed, 0, std::numeric_limits<int64_t>::max())
      .toggle("--float32", &float32)
      .text("--source", &source)
      .integer("--classes", &classes, 2, 10)
      .real("--validation-fraction", &validation_fraction, Interval{0, 1, true, true})
      .toggle("--replace", &replace);
  if (!flags.parse(argc, argv, 3)) return 0;
  const bool int16 = !float32;
  if (kind.empty()) throw ConfigError("--kind", "required (cosmoflow, unet, images or text)");
  if (kind == "images") {
    if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
    if (size < 8) throw ConfigError("--size", "required, at least 8");
    if (out.empty()) throw ConfigError("--out", "required");
    const ImageFolderIndex x =
        generate_image_folder(out, static_cast<uint64_t>(samples), static_cast<int>(size), static_cast<int>(classes),
                              static_cast<uint64_t>(seed), validation_fraction, replace);
    std::printf("wrote an ImageFolder of %zu training and %zu validation JPEGs (%lldx%lld, %zu classes) to %s\n",
                x.train.size(), x.val.size(), static_cast<long long>(size), static_cast<long long>(size),
                x.classes.size(), out.c_str());
    return 0;
  }
  if (kind == "text") {
    if (out.empty()) throw ConfigError("--out", "required");
    std::vector<std::string> sources;
    std::stringstream list(source);
    for (std::string f; std::getline(list, f, ',');)
      if (!f.empty()) sources.push_back(f);
    const uint64_t tokens = generate_text_tokens(out, sources, validation_fraction, replace);
    std::printf("wrote %llu byte-level tokens (vocabulary 256, uint16) to %s/train.bin and %s/val.bin\n",
                static_cast<unsigned long long>(tokens), out.c_str(), out.c_str());
    return 0;
  }
  if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
  if (size < 4) throw ConfigError("--size", "required, at least 4");
  if (out.empty()) throw ConfigError("--out", "required");
  generate_dataset(kind, static_cast<uint64_t>(samples), static_cast<int>(size), out, static_cast<uint64_t>(seed),
                   int16, replace);
  std::printf("wrote %lld %s samples of size %lld to %s\n", static_cast<long long>(samples), kind.c_str(),
              static_cast<long long>(size), out.c_str());
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
  bool as_json = false, strict = false;
  Flags flags("tessera validate", kValidateUsage);
  flags.toggle("--json", &as_json).toggle("--strict", &strict).positional(&files, 1, 100'000, "manifests");
  if (!flags.parse(argc, argv, 2)) return 0;
  bool all_ok = true;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& file : files) {
    int64_t parameters = 0;
    api::ParsedJob p = check(file, &parameters);
    // --strict: a field with no effect is a problem, not a warning.
    if (strict && p.ok()) std::swap(p.problems, p.warnings);
    all_ok = all_ok && p.ok();
    if (as_json) {
      auto list = [](const std::vector<FieldProblem>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& q : v) a.push_back({{"field", q.field}, {"reason", q.reason}});
        return a;
      };
      out.push_back(
          {{"file", file}, {"valid", p.ok()}, {"problems", list(p.problems)}, {"warnings", list(p.warnings)}});
      if (p.ok()) {
        out.back()["parameters"] = parameters;
        out.back()["precision"] = p.job.spec.training.precision;
        out.back()["gradient_precision"] = p.job.spec.communication.gradient_precision;
      }
      continue;
    }
    if (p.ok()) {
      const auto& s = p.job.spec;
      std::printf(
          "%s: valid: TrainingJob %s, %s (%s x %s), spatial %d x data %d, %s (%s parameters), %s, %s "
          "(gradients %s)\n",
          file.c_str(), p.job.name.c_str(), detail::count(s.workers(), "worker").c_str(),
          detail::count(s.replicas, "replica").c_str(), detail::count(s.ranks_per_replica, "rank").c_str(),
          s.parallelism.spatial_size(), s.data_replicas(), s.model.name.c_str(), short_count(parameters).c_str(),
          s.communication.strategy.c_str(), s.training.precision.c_str(), s.communication.gradient_precision.c_str());
      for (const auto& w : p.warnings) std::printf("  warning: %s: %s\n", w.field.c_str(), w.reason.c_str());
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
  local::LocalOptions options;
  const auto bin_dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  options.worker_bin = (bin_dir / "tessera-worker").string();
  options.netns_bin = (bin_dir / "tessera-netns").string();
  int nodes = 0, gpus = 0;  // 0: as the manifest says
  std::string work_dir;
  std::vector<std::string> manifest;
  Flags flags("tessera run", kRunUsage);
  flags.integer("--nodes", &nodes, 1, 4096)
      .integer("--gpus-per-node", &gpus, 1, 1024)
      .text("--work-dir", &work_dir)
      .text("--worker", &options.worker_bin)
      .real("--progress", &options.progress_seconds, Interval{0, 86400, true, false})
      .text("--metrics-addr", &options.metrics_addr)
      .optional_text("--prometheus", &options.prometheus_addr, "127.0.0.1:9090")
      .toggle("--fresh", &options.fresh)
      .positional(&manifest, 1, 1, "manifest");
  if (!flags.parse(argc, argv, 2)) return 0;
  const std::string file = manifest[0];
  options.manifest = file;
  if (!options.prometheus_addr.empty() && std::system("command -v prometheus >/dev/null 2>&1") != 0)
    throw ConfigError("--prometheus", "no prometheus command on PATH (Debian: apt-get install prometheus)");
  int64_t parameters = 0;
  api::ParsedJob p = check(file, &parameters);
  if (!p.ok()) throw ConfigError(p.problems);
  if (nodes) p.job.spec.local.nodes = nodes;
  if (gpus) p.job.spec.local.gpus_per_node = gpus;
  if (nodes || gpus)
    options.cluster_from =
        detail::concat("--nodes ", p.job.spec.local.nodes, " --gpus-per-node ", p.job.spec.local.gpus_per_node);
  if (!work_dir.empty()) p.job.spec.local.work_dir = work_dir;
  if (access(options.worker_bin.c_str(), X_OK) != 0)
    throw ConfigError("--worker", "'" + options.worker_bin + "' is not an executable tessera-worker");
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  local::LocalLauncher launcher(p.job, options);
  return launcher.run().exit_code();
}

// nanoGPT's token files under dir, checked, and meta.json written.
int index_tokens(const std::string& dir, uint32_t vocab_size, int token_bytes) {
  const TokenFilesIndex x = index_token_files(dir, vocab_size, token_bytes);
  std::printf(
      "%s: indexed token files (train.bin %llu tokens, val.bin %llu) in %s/meta.json; train on them with\n"
      "  dataset: {format: tokens, path: %s, vocabSize: %u, tokenBytes: %d}\n",
      dir.c_str(), static_cast<unsigned long long>(x.train_tokens), static_cast<unsigned long long>(x.val_tokens),
      dir.c_str(), dir.c_str(), x.vocab_size, x.token_bytes);
  return 0;
}

int data_index(int argc, char** argv) {
  std::vector<std::string> dirs;
  IndexOptions o;
  int64_t vocab_size = 0, token_bytes = 0;
  Flags flags("tessera data index", kIndexUsage);
  flags.text("--layout", &o.layout)
      .text("--input-key", &o.input_key)
      .text("--target-key", &o.target_key)
      .text("--transform", &o.transform)
      .text("--channels", &o.channels)
      .real("--progress", &o.progress_seconds, Interval{0, 86400, false, false})
      .integer("--vocab-size", &vocab_size, 1, int64_t{1} << 24)
      .integer("--token-bytes", &token_bytes, 2, 4)
      .positional(&dirs, 1, 1, "dataset directory");
  if (!flags.parse(argc, argv, 3)) return 0;
  const std::string dir = dirs[0];
  if (token_bytes == 3) throw ConfigError("--token-bytes", "3: token ids are 2 (uint16) or 4 (uint32) bytes");
  if (o.layout.empty() && is_token_dir(dir))
    return index_tokens(dir, static_cast<uint32_t>(vocab_size), static_cast<int>(token_bytes));
  if ((vocab_size || token_bytes) && o.layout.empty())
    throw ConfigError(vocab_size ? "--vocab-size" : "--token-bytes",
                      "applies to token files (train.bin, val.bin), which '" + dir + "' does not hold");
  if (o.layout.empty() && is_image_folder_split(dir)) {
    std::filesystem::path split = std::filesystem::path(dir).lexically_normal();
    if (!split.has_filename()) split = split.parent_path();  // "DIR/train/"
    const std::string parent = split.parent_path().string();
    throw ConfigError(
        dir, detail::concat("is one split of an ImageFolder (class directories of JPEG files): index the dataset "
                            "that holds train/ and val/, `tessera data index ",
                            parent.empty() ? "." : parent, "`"));
  }
  if (o.layout == "imagefolder" || (o.layout.empty() && is_image_folder(dir))) {
    for (auto [flag, value] : {std::pair{"--input-key", &o.input_key},
                               {"--target-key", &o.target_key},
                               {"--transform", &o.transform},
                               {"--channels", &o.channels}})
      if (!value->empty())
        throw ConfigError(flag, "applies to HDF5 and .npy datasets, not to the ImageFolder under " + dir);
    const ImageFolderIndex x = index_image_folder(dir, o.progress_seconds);
    std::printf("%s: indexed an ImageFolder of %s (%zu train, %zu val) in %s/manifest.tsv\n", dir.c_str(),
                detail::concat(x.classes.size(), x.classes.size() == 1 ? " class" : " classes").c_str(), x.train.size(),
                x.val.size(), dir.c_str());
    return 0;
  }
  const DatasetIndex x = index_dataset(dir, o);
  std::printf("%s: indexed %s (%s) in %s/manifest.tsv\n", dir.c_str(),
              detail::count(x.entries.size(), "sample").c_str(), x.describe().c_str(), dir.c_str());
  return 0;
}

int data_read(int argc, char** argv) {
  std::vector<std::string> files;
  std::string out;
  int64_t sample = -1, rank = 0, epoch = 0;
  bool validation = false;
  Flags flags("tessera data read", kReadUsage);
  flags.integer("--sample", &sample, 0, std::numeric_limits<int64_t>::max())
      .integer("--rank", &rank, 0, 65535)
      .integer("--epoch", &epoch, 0, 1 << 30)
      .toggle("--validation", &validation)
      .text("--out", &out)
      .positional(&files, 1, 1, "manifest");
  if (!flags.parse(argc, argv, 3)) return 0;
  const std::string file = files[0];
  if (sample < 0) throw ConfigError("--sample", "required, a sample number from 0");
  if (out.empty()) throw ConfigError("--out", "required: the prefix of the .npy files to write");
  const JobConfig c = load_job_config(file);
  if (c.data.format == "imagefolder") {
    const ImageFolderIndex index = read_image_folder_index(c.data.path);
    PosixFileSystem fs;
    ImageFolderDataset data(c.data.path, index,
                            validation ? ImageFolderDataset::Split::kVal : ImageFolderDataset::Split::kTrain,
                            c.model.input_size, c.training.seed, fs, nullptr, false);
    if (static_cast<uint64_t>(sample) >= data.size())
      throw ConfigError("--sample", detail::concat(sample, " is past the ", detail::count(data.size(), "image"), " of ",
                                                   validation ? "val/" : "train/"));
    data.set_epoch(static_cast<int>(epoch));
    const Sample b = data.get(static_cast<uint64_t>(sample));
    write_npy(out + "_x.npy", b.input);
    write_npy(out + "_y.npy", b.target);
    const auto& e = data.entry(static_cast<uint64_t>(sample));
    std::printf("image %lld of %s: %s (%dx%d, class %s), as the model gets it: %s\n", static_cast<long long>(sample),
                detail::count(data.size(), "image").c_str(), data.file(static_cast<uint64_t>(sample)).c_str(), e.width,
                e.height, index.classes[e.label].c_str(), shape_str(b.input.shape()).c_str());
    return 0;
  }
  if (c.data.format != "hdf5")
    throw ConfigError("spec.dataset.format",
                      "'" + c.data.format + "': only files are read (format: hdf5 or imagefolder)");
  if (rank < 0 || rank >= c.workers)
    throw ConfigError("--rank", detail::concat(rank, " is not a rank of the job's ", c.workers, " workers"));
  const std::string dir = validation ? c.data.validation_path : c.data.path;
  if (dir.empty()) throw ConfigError("--validation", "the job has no spec.dataset.validationPath");
  ModelConfig whole = c.model;
  whole.spatial = {};
  const auto model = make_model(whole);
  PosixFileSystem fs;
  const auto data = open_file_dataset(c, *model, dir, validation ? "validationPath" : "path", fs, nullptr);
  if (static_cast<uint64_t>(sample) >= data->size())
    throw ConfigError("--sample",
                      detail::concat(sample, " is past the ", detail::count(data->size(), "sample"), " under ", dir));
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
  std::printf("sample %lld of %s: %s, sub-volume %s; rank %lld reads block %s: %s (transform %s), targets %s\n",
              static_cast<long long>(sample), detail::count(data->size(), "sample").c_str(),
              data->file(static_cast<uint64_t>(sample)).c_str(),
              data->sub_volume(static_cast<uint64_t>(sample)).str().c_str(), static_cast<long long>(rank),
              box.str().c_str(), shape_str(b.input.shape()).c_str(), data->index().transform.c_str(),
              shape_str(b.target.shape()).c_str());
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) return usage(2);
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return usage(0);
  if (cmd == "validate") return validate(argc, argv);
  if (cmd == "run") return run_job(argc, argv);
  if (cmd == "plan") return plan(argc, argv);
  if (cmd == "node") {
    std::vector<std::string> args;
    std::string work_dir;
    Flags flags("tessera node", kNodeUsage);
    flags.positional(&args, 2, 2, "remove|add NODE").text("--work-dir", &work_dir);
    if (!flags.parse(argc, argv, 2)) return 0;
    if (args[0] != "remove" && args[0] != "add") throw ConfigError(args[0], "expected tessera node remove or add");
    if (work_dir.empty()) throw ConfigError("--work-dir", "required: the work directory of the running tessera run");
    local::request_node_change(work_dir, args[0], args[1]);
    std::printf("asked the tessera run in %s to %s virtual node %s\n", work_dir.c_str(), args[0].c_str(),
                args[1].c_str());
    return 0;
  }
  if (cmd != "data")
    throw ConfigError(cmd, "unknown command (expected validate, run, plan, node or data; tessera --help)");
  const std::string sub = argc >= 3 ? argv[2] : "";
  if (sub == "generate") return data_generate(argc, argv);
  if (sub == "index") return data_index(argc, argv);
  if (sub == "read") return data_read(argc, argv);
  if (sub == "verify") {
    std::vector<std::string> dirs;
    Flags flags("tessera data verify", kVerifyUsage);
    flags.positional(&dirs, 1, 1, "dataset directory");
    if (!flags.parse(argc, argv, 3)) return 0;
    if (is_image_folder(dirs[0])) verify_image_folder(dirs[0]);
    else verify_dataset(dirs[0]);
    std::printf("%s: every sample matches the manifest\n", dirs[0].c_str());
    return 0;
  }
  if (sub == "--help" || sub == "-h") {
    std::fputs("usage: tessera data generate|index|read|verify ... (tessera data index --help)\n", stdout);
    return 0;
  }
  throw ConfigError(sub.empty() ? "data" : sub, "expected tessera data generate, index, read or verify");
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  return tessera::run_command("tessera", [&] { return tessera::run(argc, argv); });
}
