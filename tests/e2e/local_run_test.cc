// `tessera run` end to end: a TrainingJob manifest runs on this machine through the controller's
// local launcher (placement on virtual nodes, gRPC rendezvous, worker processes), with an HDF5
// dataset read through the memory and SSD cache tiers. A job succeeds; a worker killed with
// SIGKILL makes the gang restart from its last checkpoint, losing at most one checkpoint interval.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/process.h"

namespace tessera {
namespace {

using json = nlohmann::json;
using namespace tessera::testing;

const std::string kCli = TESSERA_CLI_BIN;

std::string make_temp_dir(const std::string& tag) {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/" + tag + "-XXXXXX";
  return mkdtemp(pattern.data());
}

// CosmoFlow on 16^3 fields: 4 workers on 2 virtual nodes, spatial 2 x data 2, hybrid hitopk -> torus.
std::string manifest(const std::string& dir, int epochs, int every_steps, int backoff_limit = 1) {
  return "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: e2e}\nspec:\n"
         "  replicas: 2\n  ranksPerReplica: 2\n"
         "  model: {name: cosmoflow, inputSize: 16, baseChannels: 8, hidden: [32]}\n"
         "  dataset: {format: hdf5, path: " + dir + "/data/train, validationPath: " + dir + "/data/val}\n"
         "  training: {epochs: " + std::to_string(epochs) + ", batchSize: 4, optimizer: {name: adam, learningRate: 0.001}}\n"
         "  parallelism: {spatial: {d: 2}}\n"
         "  communication: {strategy: hybrid, sparse: hitopk, dense: torus, density: 0.05, switchAtEpoch: 2, timeoutSeconds: 30}\n"
         "  cache: {memory: 64Mi, localSSD: {path: " + dir + "/state/ssd, sizeLimit: 256Mi}}\n"
         "  checkpoint: {path: " + dir + "/state/ckpt, everySteps: " + std::to_string(every_steps) + "}\n"
         "  runPolicy: {backoffLimit: " + std::to_string(backoff_limit) + "}\n"
         "  local: {nodes: 2, gpusPerNode: 2, workDir: " + dir + "/state}\n";
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
  const int rc = wait_exit(spawn({kCli, "run", dir + "/job.yaml", "--progress", "1"}, dir + "/run.log"), std::chrono::seconds(300));
  const std::string out = read_file(dir + "/run.log");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("e2e Succeeded"), std::string::npos) << out;
  EXPECT_NE(out.find("validation MSE"), std::string::npos) << out;
  const json s = status_of(dir);
  EXPECT_EQ(s["phase"], "Succeeded");
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_EQ(s["step"], 48);          // 3 epochs x 64 samples / batch 4
  EXPECT_EQ(s["switchStep"], 32);    // the controller's choice: epoch 2 x 16 steps
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
  EXPECT_NE(out.find("restarting the gang from its last checkpoint"), std::string::npos) << out;
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

}  // namespace
}  // namespace tessera
