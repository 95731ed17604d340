// The pod supervisor (worker/pod/supervisor.h) over real processes: shell ranks that succeed, fail,
// stop on SIGTERM or ignore it, and a real rendezvous service whose rounds restart the pod in place.
#include "worker/pod/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include "common/error.h"
#include "controller/rendezvous/rendezvous_service.h"
#include "testing/fork_ranks.h"
#include "testing/process.h"

namespace tessera {
namespace {

using testing::read_file;
using namespace std::chrono_literals;

// A pod whose rank in slot S runs the shell script scripts[S] ($SLOT and $DIR set).
PodOptions shell_pod(const std::string& dir, std::vector<std::string> scripts) {
  PodOptions o;
  o.slots = static_cast<int>(scripts.size());
  o.program = "/bin/sh";
  o.rank_args = [dir, scripts](int slot) {
    return std::vector<std::string>{"sh", "-c", "SLOT=" + std::to_string(slot) + "; DIR=" + dir + "; " + scripts[slot]};
  };
  o.termination_log = dir + "/termination-log";
  o.grace = 2s;
  o.restart_wait = 20s;
  return o;
}

// Waits until `path` exists (a rank has started), up to 10 s.
bool appears(const std::string& path) {
  for (int i = 0; i < 500 && !std::filesystem::exists(path); ++i) std::this_thread::sleep_for(20ms);
  return std::filesystem::exists(path);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(PodSupervisorTest, RanksThatSucceedEndThePodWithZero) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  EXPECT_EQ(supervise_pod(shell_pod(dir, {"touch $DIR/done-$SLOT", "touch $DIR/done-$SLOT", "touch $DIR/done-$SLOT"})),
            0);
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(std::filesystem::exists(dir + "/done-" + std::to_string(s)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/termination-log"));
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, AFailedRankEndsTheOthersWithItsStatusAndReason) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  const auto t0 = std::chrono::steady_clock::now();
  const int status = supervise_pod(
      shell_pod(dir, {"exec sleep 60", "sleep 0.2; echo 'the data is gone' >&3; exit 7", "exec sleep 60"}));
  EXPECT_EQ(status, 7);
  EXPECT_LT(seconds_since(t0), 10.0) << "the other ranks were not ended";
  EXPECT_EQ(read_file(dir + "/termination-log"), "slot 1: the data is gone\n");
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, ARankKilledBySignalIsDescribedWhenItWroteNothing) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  EXPECT_EQ(supervise_pod(shell_pod(dir, {"kill -9 $$"})), 128 + SIGKILL);
  EXPECT_EQ(read_file(dir + "/termination-log"), "slot 0: was killed by signal 9 (Killed)\n");
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, SigtermIsForwardedAndTheRanksStop) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  const std::string rank =
      "trap 'touch $DIR/stopped-$SLOT; exit 4' TERM; touch $DIR/up-$SLOT; while :; do sleep 0.05; done";
  auto pod = std::async(std::launch::async, [&] { return supervise_pod(shell_pod(dir, {rank, rank})); });
  ASSERT_TRUE(appears(dir + "/up-0") && appears(dir + "/up-1"));
  kill(getpid(), SIGTERM);  // the supervisor's handler takes it while it runs
  ASSERT_EQ(pod.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(pod.get(), kExitStopped);
  EXPECT_TRUE(std::filesystem::exists(dir + "/stopped-0"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/stopped-1"));
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, ARankThatIgnoresSigtermIsKilledAfterTheGrace) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  const std::string stops = "trap 'exit 4' TERM; touch $DIR/up-$SLOT; while :; do sleep 0.05; done";
  const std::string ignores = "trap '' TERM; touch $DIR/up-$SLOT; while :; do sleep 0.05; done";
  auto pod = std::async(std::launch::async, [&] { return supervise_pod(shell_pod(dir, {stops, ignores})); });
  ASSERT_TRUE(appears(dir + "/up-0") && appears(dir + "/up-1"));
  const auto t0 = std::chrono::steady_clock::now();
  kill(getpid(), SIGTERM);
  ASSERT_EQ(pod.wait_for(20s), std::future_status::ready);
  EXPECT_EQ(pod.get(), 128 + SIGKILL);
  EXPECT_GE(seconds_since(t0), 1.9) << "killed before the grace period of 2 s";
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, EachSlotGetsItsGpu) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  setenv("NVIDIA_VISIBLE_DEVICES", "GPU-aa,GPU-bb", 1);
  const std::string rank = "echo $TESSERA_GPU $TESSERA_GPU_INDEX > $DIR/gpu-$SLOT";
  EXPECT_EQ(supervise_pod(shell_pod(dir, {rank, rank, rank})), 0);
  unsetenv("NVIDIA_VISIBLE_DEVICES");
  EXPECT_EQ(read_file(dir + "/gpu-0"), "GPU-aa 0\n");
  EXPECT_EQ(read_file(dir + "/gpu-1"), "GPU-bb 1\n");
  EXPECT_EQ(read_file(dir + "/gpu-2"), "GPU-aa 0\n");  // three ranks share two GPUs
  std::filesystem::remove_all(dir);
}

TEST(PodSupervisorTest, VisibleGpusReadsTheDevicePluginsVariable) {
  setenv("NVIDIA_VISIBLE_DEVICES", "all", 1);
  EXPECT_TRUE(visible_gpus().empty());
  setenv("NVIDIA_VISIBLE_DEVICES", "0,,2", 1);
  EXPECT_EQ(visible_gpus(), (std::vector<std::string>{"0", "2"}));
  unsetenv("NVIDIA_VISIBLE_DEVICES");
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  EXPECT_EQ(visible_gpus(), (std::vector<std::string>{"3"}));
  unsetenv("CUDA_VISIBLE_DEVICES");
}

// Under the controller's rendezvous: a failed rank is reported for the round, and the pod starts its
// ranks again when the controller begins the next one (the same pod, in place).
TEST(PodSupervisorTest, AFailedRankIsReportedAndThePodRestartsInPlaceInTheNextRound) {
  const std::string dir = testing::make_temp_dir("tessera-pod");
  RendezvousService service;
  const std::vector<placement::RankAssignment> plan = {{0, 0, 0, "node-a", 0}, {1, 0, 1, "node-a", 1}};
  service.add_job("ns/job", "tok", plan);
  PodOptions o = shell_pod(dir, {"echo start >> $DIR/starts-0; [ -e $DIR/failed ] || exec sleep 60",
                                 "echo start >> $DIR/starts-1; [ -e $DIR/failed ] && exit 0; touch $DIR/failed; "
                                 "echo 'out of memory' >&3; exit 1"});
  o.rendezvous = service.target();
  o.job_key = "ns/job";
  o.token = "tok";
  auto pod = std::async(std::launch::async, [&] { return supervise_pod(o); });
  // The controller sees the failure of round 0, and begins round 1.
  std::vector<reconcile::RankExit> exits;
  for (int i = 0; i < 500 && exits.empty(); ++i, std::this_thread::sleep_for(20ms))
    exits = service.progress("ns/job").exits;
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].slot, 1);
  EXPECT_EQ(exits[0].exit_code, 1);
  EXPECT_EQ(exits[0].message, "out of memory");
  RendezvousService::JobPolicy next;
  next.round = 1;
  service.add_job("ns/job", "tok", plan, next);
  ASSERT_EQ(pod.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(pod.get(), 0);
  // Both ranks started twice: slot 0, which had not failed, was ended and started again too.
  EXPECT_EQ(read_file(dir + "/starts-0"), "start\nstart\n");
  EXPECT_EQ(read_file(dir + "/starts-1"), "start\nstart\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
