// `tessera run` end to end: a TrainingJob manifest runs on this machine through the controller's
// local launcher (placement on virtual nodes, gRPC rendezvous, worker processes), with an HDF5
// dataset read through the memory and SSD cache tiers. A job succeeds; a worker killed with
// SIGKILL makes the gang restart from its last checkpoint, losing at most one checkpoint interval.
#include <gtest/gtest.h>
#include <signal.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "testing/fork_ranks.h"
#include "testing/process.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using namespace tessera::testing;

const std::string kCli = TESSERA_CLI_BIN;

// CosmoFlow on 16^3 fields: 4 workers on 2 virtual nodes, spatial 2 x data 2, hybrid hitopk -> torus.
std::string manifest(const std::string& dir, int epochs, int every_steps, int backoff_limit = 1) {
  return "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: e2e}\nspec:\n"
         "  replicas: 2\n  ranksPerReplica: 2\n"
         "  model: {name: cosmoflow, inputSize: 16, baseChannels: 8, hidden: [32]}\n"
         "  dataset: {format: hdf5, path: " +
         dir + "/data/train, validationPath: " + dir +
         "/data/val}\n"
         "  training: {epochs: " +
         std::to_string(epochs) +
         ", batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}\n"
         "  parallelism: {spatial: {d: 2}}\n"
         "  communication: {strategy: hybrid, sparse: hitopk, dense: torus, density: 0.05, switchAtEpoch: 2, "
         "timeoutSeconds: 30}\n"
         "  cache: {memory: 64Mi, localSSD: {path: " +
         dir +
         "/state/ssd, sizeLimit: 256Mi}}\n"
         "  checkpoint: {path: " +
         dir + "/state/ckpt, everySteps: " + std::to_string(every_steps) +
         "}\n"
         "  runPolicy: {backoffLimit: " +
         std::to_string(backoff_limit) +
         "}\n"
         "  local: {nodes: 2, gpusPerNode: 2, workDir: " +
         dir + "/state}\n";
}

std::string prepare(const std::string& tag, int epochs, int every_steps, int backoff_limit = 1) {
  const std::string dir = make_temp_dir(tag);
  for (auto [set, n, seed] : {std::tuple{"train", "64", "1"}, std::tuple{"val", "16", "2"}})
    EXPECT_EQ(wait_exit(spawn({kCli, "data", "generate", "--kind", "cosmoflow", "--samples", n, "--size", "16", "--out",
                               dir + "/data/" + set, "--seed", seed},
                              dir + "/generate.log"),
                        std::chrono::seconds(60)),
              0)
        << read_file(dir + "/generate.log");
  std::ofstream(dir + "/job.yaml") << manifest(dir, epochs, every_steps, backoff_limit);
  return dir;
}

json status_of(const std::string& dir) {
  const std::string text = read_file(dir + "/state/status.json");
  return text.empty() ? json() : json::parse(text)["status"];
}

TEST(LocalRunTest, JobSucceedsOnVirtualNodes) {
  const std::string dir = prepare("tessera-e2e-ok", 3, 8);
  const int rc = wait_exit(spawn({kCli, "run", dir + "/job.yaml", "--progress", "1"}, dir + "/run.log"),
                           std::chrono::seconds(300));
  const std::string out = read_file(dir + "/run.log");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("e2e Succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("validation MSE"), std::string::npos) << out;
  const json s = status_of(dir);
  EXPECT_EQ(s["phase"], "Succeeded");
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_EQ(s["step"], 48);        // 3 epochs x 64 samples / batch 4
  EXPECT_EQ(s["switchStep"], 32);  // the controller's choice: epoch 2 x 16 steps
  EXPECT_EQ(s["trainingPhase"], "dense");
  ASSERT_EQ(s["placement"].size(), 2u);  // one replica per virtual node, its ranks consecutive
  EXPECT_EQ(s["placement"][0]["ranks"], json::array({0, 1}));
  EXPECT_EQ(s["placement"][1]["ranks"], json::array({2, 3}));
  EXPECT_NE(s["placement"][0]["node"], s["placement"][1]["node"]);
  EXPECT_GT(s["validation"]["baselineLoss"].get<double>(), 0);
  ASSERT_EQ(s["conditions"].size(), 3u);  // as on a cluster: Placed, Running (False once completed), Succeeded
  EXPECT_EQ(s["conditions"][0]["type"], "Placed");
  EXPECT_EQ(s["conditions"][0]["reason"], "GangFits");
  EXPECT_EQ(s["conditions"][1]["type"], "Running");
  EXPECT_EQ(s["conditions"][1]["reason"], "Completed");
  EXPECT_EQ(s["conditions"][2]["type"], "Succeeded");
  // Every rank read its blocks through the SSD tier.
  EXPECT_FALSE(std::filesystem::is_empty(dir + "/state/ssd"));
  std::filesystem::remove_all(dir);
}

// Waits until the job in `dir` reports step `step`, then kills worker (replica 1, slot 0) with SIGKILL.
void kill_a_worker_at(const std::string& dir, int64_t step) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180) * kSlowdown;
  json s;
  while (std::chrono::steady_clock::now() < deadline) {
    s = status_of(dir);
    if (!s.is_null() && s.value("step", int64_t{-1}) >= step) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(s.value("step", int64_t{-1}), step) << read_file(dir + "/run.log");
  pid_t victim = 0;
  for (const auto& w : s["workers"])
    if (w["replica"] == 1 && w["slot"] == 0) victim = w["pid"];
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
}

TEST(LocalRunTest, KilledWorkerRestartsTheGangFromTheLastCheckpoint) {
  const int every = 10;
  const std::string dir = prepare("tessera-e2e-kill", 12, every);
  pid_t run = spawn({kCli, "run", dir + "/job.yaml", "--progress", "1"}, dir + "/run.log");
  // Kill one worker of replica 1 once the job is past its second checkpoint.
  kill_a_worker_at(dir, 2 * every + 3);
  json s;

  const int rc = wait_exit(run, std::chrono::seconds(300));
  const std::string out = read_file(dir + "/run.log");
  ASSERT_EQ(rc, 0) << out;
  s = status_of(dir);
  EXPECT_EQ(s["phase"], "Succeeded");
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["step"], 192);  // every step of 12 epochs was trained
  ASSERT_EQ(s["restartHistory"].size(), 1u);
  const json& h = s["restartHistory"][0];
  EXPECT_NE(h["reason"].get<std::string>().find("killed by signal 9"), std::string::npos) << h.dump();
  const int64_t failed = h["failedAtStep"], resumed = h["resumedAtStep"];
  EXPECT_GE(failed, 2 * every + 3);
  EXPECT_EQ(resumed % every, 0) << "resumed from a checkpoint";
  EXPECT_LE(failed - resumed, every) << "lost at most one checkpoint interval";
  EXPECT_GE(resumed, every);
  // The pods (each a `tessera-worker --slots` supervisor) stayed and started their ranks again.
  EXPECT_EQ(h["inPlace"], true) << h.dump();
  EXPECT_EQ(s["restartsInPlace"], 1);
  EXPECT_NE(out.find("restarting the gang in place from its last checkpoint"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

// With backoffLimit 0 the first failure ends the job.
TEST(LocalRunTest, FailureBeyondTheBackoffLimitFailsTheJob) {
  const std::string dir = prepare("tessera-e2e-backoff", 12, 10, 0);
  pid_t run = spawn({kCli, "run", dir + "/job.yaml"}, dir + "/run.log");
  kill_a_worker_at(dir, 3);
  const int rc = wait_exit(run, std::chrono::seconds(120));
  EXPECT_EQ(rc, 1) << read_file(dir + "/run.log");
  const json s = status_of(dir);
  EXPECT_EQ(s["phase"], "Failed");
  EXPECT_EQ(s["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_NE(s["message"].get<std::string>().find("killed by signal 9"), std::string::npos) << s.dump(2);
  std::filesystem::remove_all(dir);
}

// A worker that cannot start training (here: the dataset is not there) fails the job at once with
// the worker's own error; restarting the gang would fail the same way.
TEST(LocalRunTest, ConfigurationErrorFailsTheJobWithoutRestarts) {
  const std::string dir = make_temp_dir("tessera-e2e-bad");
  std::ofstream(dir + "/job.yaml") << manifest(dir, 3, 10);  // no dataset generated
  const int rc = wait_exit(spawn({kCli, "run", dir + "/job.yaml"}, dir + "/run.log"), std::chrono::seconds(120));
  const std::string out = read_file(dir + "/run.log");
  EXPECT_EQ(rc, 1) << out;
  const json s = status_of(dir);
  EXPECT_EQ(s["phase"], "Failed");
  EXPECT_EQ(s["reason"], "InvalidConfiguration");
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_NE(s["message"].get<std::string>().find("spec.dataset.path"), std::string::npos) << s.dump(2);
  std::filesystem::remove_all(dir);
}

// ---- the command line as a newcomer meets it ----

struct Shell {
  int rc;
  std::string out, err;
};

// Runs `command` under sh with stdout and stderr kept apart.
Shell sh(const std::string& command, const std::string& dir) {
  const int st = std::system((command + " >" + dir + "/out.txt 2>" + dir + "/err.txt").c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_file(dir + "/out.txt"), read_file(dir + "/err.txt")};
}

TEST(CliTest, EveryCommandExplainsItselfOnStandardOutput) {
  const std::string dir = make_temp_dir("tessera-cli-help");
  const std::string bin = std::filesystem::path(kCli).parent_path().string();
  for (const std::string cmd :
       {"tessera --help", "tessera -h", "tessera validate --help", "tessera run -h", "tessera run job.yaml --help",
        "tessera data generate --help", "tessera data verify -h", "tessera-worker --help", "tessera-worker -h",
        "tessera-bench --help", "tessera-bench -h", "tessera-bench train --help", "tessera-controller --help"}) {
    const Shell r = sh(bin + "/" + cmd, dir);
    EXPECT_EQ(r.rc, 0) << cmd << ": " << r.err;
    EXPECT_NE(r.out.find("usage"), std::string::npos) << cmd << " printed: " << r.out;
    EXPECT_EQ(r.err, "") << cmd;
  }
  std::filesystem::remove_all(dir);
}

TEST(CliTest, BadArgumentsAreNamedWithStatus2) {
  const std::string dir = make_temp_dir("tessera-cli-args");
  std::ofstream(dir + "/a.yaml") << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a}\nspec: "
                                    "{dataset: {format: synthetic}}\n";
  auto expect_error = [&](const std::string& args, const std::string& message) {
    const Shell r = sh(kCli + " " + args, dir);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.err;
    const std::string said = r.out + r.err;  // validate lists problems on stdout, the others fail on stderr
    EXPECT_NE(said.find(message), std::string::npos) << args << " said: " << said;
  };
  const Shell valid = sh(kCli + " validate " + dir + "/a.yaml", dir);
  EXPECT_EQ(valid.rc, 0) << valid.out << valid.err;
  EXPECT_NE(valid.out.find("valid: TrainingJob a, 1 worker (1 replica x 1 rank)"), std::string::npos) << valid.out;
  // A model of a trillion parameters is checked without allocating it (tensors without storage).
  std::ofstream(dir + "/huge.yaml") << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: huge}\n"
                                       "spec: {model: {name: cosmoflow, inputSize: 512, hidden: [1048576, 1048576]}, "
                                       "dataset: {format: synthetic}}\n";
  const Shell huge =
      sh("ulimit -v 1000000; " + kCli + " validate " + dir + "/huge.yaml", dir);  // 1 GB of address space
  EXPECT_EQ(huge.rc, 0) << huge.out << huge.err;
  EXPECT_NE(huge.out.find("cosmoflow (1.1T parameters)"), std::string::npos) << huge.out;
  expect_error("validate " + dir, dir + ": is a directory, not a manifest file");
  expect_error("validate " + dir + "/missing.yaml", "no such file");
  expect_error("run " + dir + "/a.yaml " + dir + "/b.yaml",
               dir + "/b.yaml: unexpected argument (tessera run takes one manifest)");
  expect_error("run " + dir + "/a.yaml --nodes", "--nodes: needs a value");
  expect_error("run " + dir + "/a.yaml --bogus", "--bogus: unknown flag (tessera run --help lists them)");
  expect_error("data generate --kind unet --samples 1 --size 15 --out " + dir + "/u",
               "--size: 15: unet3d needs a multiple of 4");
  expect_error("data verify", "tessera data verify DIR");
  expect_error("frobnicate", "frobnicate: unknown command");
  // Validation runs the model's own rules: this split fails when the ranks meet, so it is refused here.
  std::ofstream(dir + "/unet.yaml")
      << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: u}\nspec:\n"
         "  ranksPerReplica: 4\n  model: {name: unet3d, inputSize: 8}\n"
         "  dataset: {format: synthetic, samples: 8, validationSamples: 4}\n"
         "  parallelism: {spatial: {d: 4}}\n";
  expect_error("validate " + dir + "/unet.yaml",
               "spec.parallelism.spatial.d: 4 parts, but unet3d with inputSize 8 splits volumes down to 2^3 "
               "(model.layers.bottom.conv1): at most 2 parts in each dimension");
  std::filesystem::remove_all(dir);
}

TEST(CliTest, GenerateRefusesANonEmptyDirectoryUnlessToldToReplaceTheDataset) {
  const std::string dir = make_temp_dir("tessera-cli-gen");
  const std::string gen = kCli + " data generate --kind cosmoflow --size 8 --out " + dir + "/d --samples ";
  ASSERT_EQ(sh(gen + "3", dir).rc, 0);
  Shell again = sh(gen + "2", dir);
  EXPECT_EQ(again.rc, 2);
  EXPECT_NE(again.err.find("is not empty (4 files); choose a new directory, or pass --replace"), std::string::npos)
      << again.err;
  ASSERT_EQ(sh(gen + "2 --replace", dir).rc, 0);
  int samples = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/d")) samples += e.path().extension() == ".h5";
  EXPECT_EQ(samples, 2);  // the third sample of the first dataset is gone with it
  EXPECT_EQ(sh(kCli + " data verify " + dir + "/d", dir).rc, 0);
  std::ofstream(dir + "/d/notes.txt") << "mine";
  Shell other = sh(gen + "2 --replace", dir);
  EXPECT_EQ(other.rc, 2);
  EXPECT_NE(other.err.find("holds notes.txt, which is not part of a dataset"), std::string::npos) << other.err;
  EXPECT_TRUE(std::filesystem::exists(dir + "/d/notes.txt"));
  std::filesystem::remove_all(dir);
}

// Relative checkpoint and cache paths go under --work-dir; a second run says at once that it
// resumed (here: that the job had finished); --fresh starts over and keeps the SSD cache.
TEST(CliTest, WorkDirHoldsTheRunsStateAndFreshStartsOver) {
  const std::string dir = make_temp_dir("tessera-cli-fresh");
  std::ofstream(dir + "/job.yaml")
      << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: fresh}\nspec:\n"
         "  model: {name: cosmoflow, inputSize: 8, baseChannels: 4, hidden: [8]}\n"
         "  dataset: {format: synthetic, synthetic: cosmo, samples: 16, validationSamples: 4}\n"
         "  training: {epochs: 1, batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}\n"
         "  cache: {memory: 16Mi, localSSD: {path: ssd, sizeLimit: 64Mi}}\n"
         "  checkpoint: {path: ckpt}\n";
  const std::string run = "cd " + dir + " && " + kCli + " run job.yaml --work-dir " + dir + "/wd --progress 1";
  const Shell first = sh(run, dir);
  ASSERT_EQ(first.rc, 0) << first.out << first.err;
  bool checkpoint = false;
  for (const auto& e : std::filesystem::directory_iterator(dir + "/wd/ckpt"))
    checkpoint |= e.path().extension() == ".bin";
  EXPECT_TRUE(checkpoint) << "no checkpoint under the work directory";
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt")) << "the checkpoint went to the current directory";
  const Shell second = sh(run, dir);
  ASSERT_EQ(second.rc, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("is at its last step (4): it had already finished (tessera run --fresh starts it over)"),
            std::string::npos)
      << second.out;
  const Shell fresh = sh(run + " --fresh", dir);
  ASSERT_EQ(fresh.rc, 0) << fresh.out << fresh.err;
  EXPECT_NE(fresh.out.find("--fresh: removed 1 checkpoint file from " + dir + "/wd/ckpt"), std::string::npos)
      << fresh.out;
  EXPECT_EQ(fresh.out.find("already finished"), std::string::npos) << fresh.out;
  EXPECT_EQ(json::parse(read_file(dir + "/wd/status.json"))["status"]["step"], 4);
  // A longer job on the same work directory goes on from that checkpoint, and says so as it starts.
  std::string longer = read_file(dir + "/job.yaml");
  longer.replace(longer.find("epochs: 1"), 9, "epochs: 2");
  std::ofstream(dir + "/job.yaml") << longer;
  const Shell resumed = sh(run, dir);
  ASSERT_EQ(resumed.rc, 0) << resumed.out << resumed.err;
  const size_t said = resumed.out.find("the job resumed from its checkpoint at step 4 in " + dir + "/wd/ckpt");
  EXPECT_NE(said, std::string::npos) << resumed.out;
  EXPECT_LT(said, resumed.out.find("fresh Succeeded")) << resumed.out;
  std::filesystem::remove_all(dir);
}

// A run whose loss diverges fails at once with its own reason; it is not restarted to diverge again.
TEST(CliTest, ADivergedRunFailsAtOnceWithoutRestarts) {
  const std::string dir = make_temp_dir("tessera-cli-nan");
  std::ofstream(dir + "/job.yaml")
      << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: nan}\nspec:\n"
         "  model: {name: cosmoflow, inputSize: 8, baseChannels: 4, hidden: [8]}\n"
         "  dataset: {format: synthetic, samples: 64, validationSamples: 4}\n"
         "  training: {epochs: 4, batchSize: 2, optimizer: {name: sgd, learningRate: 1000000}}\n"
         "  runPolicy: {backoffLimit: 3}\n";
  const Shell r = sh(kCli + " run " + dir + "/job.yaml --work-dir " + dir + "/wd", dir);
  EXPECT_NE(r.rc, 0) << r.out << r.err;
  const json s = json::parse(read_file(dir + "/wd/status.json"))["status"];
  EXPECT_EQ(s["phase"], "Failed") << s;
  EXPECT_EQ(s["reason"], "TrainingDiverged") << s;
  EXPECT_EQ(s["restarts"], 0) << s;
  EXPECT_NE(s["message"].get<std::string>().find("training diverged: loss is"), std::string::npos) << s;
  std::filesystem::remove_all(dir);
}

// An hdf5 dataset needs no validation directory: without one the job trains and says it has no
// validation; with validationSplit it holds out that fraction of its samples and validates on them.
TEST(CliTest, ValidationIsOptionalOrASplitOfTheTrainingFiles) {
  const std::string dir = make_temp_dir("tessera-cli-split");
  ASSERT_EQ(sh(kCli + " data generate --kind cosmoflow --size 8 --samples 40 --out " + dir + "/data", dir).rc, 0);
  auto job = [&](const std::string& name, const std::string& validation) {
    std::ofstream(dir + "/" + name + ".yaml")
        << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << name << "}\nspec:\n"
        << "  model: {name: cosmoflow, inputSize: 8, baseChannels: 4, hidden: [8]}\n"
        << "  dataset: {format: hdf5, path: " << dir << "/data" << validation << "}\n"
        << "  training: {epochs: 1, batchSize: 4}\n";
    return sh(kCli + " run " + dir + "/" + name + ".yaml --work-dir " + dir + "/" + name, dir);
  };
  const Shell none = job("none", "");
  EXPECT_EQ(none.rc, 0) << none.out << none.err;
  EXPECT_NE(none.out.find("no validation: the job has no validation set"), std::string::npos) << none.out;
  EXPECT_NE(none.out.find(": 10 steps,"), std::string::npos) << none.out;  // all 40 samples train
  const json sn = json::parse(read_file(dir + "/none/status.json"))["status"];
  EXPECT_EQ(sn["phase"], "Succeeded") << sn;
  EXPECT_NE(sn["validation"]["message"].get<std::string>().find("no validation set"), std::string::npos) << sn;
  EXPECT_FALSE(sn["validation"].contains("loss")) << sn;

  const Shell split = job("split", ", validationSplit: 0.2");
  EXPECT_EQ(split.rc, 0) << split.out << split.err;
  EXPECT_NE(split.out.find(": 8 steps,"), std::string::npos) << split.out;  // 32 samples train, 8 validate
  EXPECT_NE(split.out.find("validation MSE"), std::string::npos) << split.out;
  const json ss = json::parse(read_file(dir + "/split/status.json"))["status"];
  EXPECT_GT(ss["validation"]["baselineLoss"].get<double>(), 0) << ss;
  std::filesystem::remove_all(dir);
}

// A gang the virtual nodes cannot hold fails at once, naming the flags that sized them and what would fit.
TEST(CliTest, AGangThatDoesNotFitSaysWhatWould) {
  const std::string dir = make_temp_dir("tessera-cli-fit");
  std::ofstream(dir + "/job.yaml")
      << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: fit}\nspec:\n"
         "  replicas: 2\n  model: {name: cosmoflow, inputSize: 8, baseChannels: 4, hidden: [8]}\n"
         "  dataset: {format: synthetic, samples: 16, validationSamples: 4}\n";
  const Shell r = sh(kCli + " run " + dir + "/job.yaml --nodes 1 --work-dir " + dir + "/wd", dir);
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_NE((r.out + r.err)
                .find("the gang of 2 replicas x 1 rank does not fit 1 virtual node of 1 GPU slot "
                      "(--nodes 1 --gpus-per-node 1); it needs 2 nodes of 1 GPU slot (--nodes 2)"),
            std::string::npos)
      << r.out << r.err;
  std::filesystem::remove_all(dir);
}

// Segmentation reports what its accuracy compares with: the most frequent class alone, and the IoU
// of each class.
TEST(CliTest, SegmentationReportsTheMajorityClassAndPerClassIoU) {
  const std::string dir = make_temp_dir("tessera-cli-unet");
  std::ofstream(dir + "/job.yaml")
      << "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: seg}\nspec:\n"
         "  model: {name: unet3d, inputSize: 8, baseChannels: 4}\n"
         "  dataset: {format: synthetic, samples: 8, validationSamples: 4}\n"
         "  training: {epochs: 1, batchSize: 2, optimizer: {name: adam, learningRate: 0.001}}\n";
  const Shell r = sh(kCli + " run " + dir + "/job.yaml --work-dir " + dir + "/wd", dir);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(the most frequent class alone: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; IoU per class "), std::string::npos) << r.out;
  const json v = json::parse(read_file(dir + "/wd/status.json"))["status"]["validation"];
  EXPECT_GT(v["baselineMetric"].get<double>(), 0.0) << v;
  EXPECT_LE(v["baselineMetric"].get<double>(), 1.0) << v;
  EXPECT_FALSE(v.contains("top5")) << v;  // a segmentation's accuracy is per voxel: no top-5
  ASSERT_EQ(v["iou"].size(), 3u) << v;    // unet3d's default 3 classes
  for (const auto& x : v["iou"]) {
    EXPECT_GE(x.get<double>(), 0.0);
    EXPECT_LE(x.get<double>(), 1.0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
