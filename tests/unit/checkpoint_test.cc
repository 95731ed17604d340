#include "worker/train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "testing/fork_ranks.h"
#include "common/error.h"

namespace tessera {
namespace {

TEST(CheckpointTest, RoundTripLatestAndPrune) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt");
  CheckpointData d;
  d.counters["step"] = 12;
  d.arrays["param/w"] = {1.5f, -2.0f, 3.25f};
  d.arrays["empty"] = {};
  for (int64_t step : {4, 8, 12}) write_checkpoint(dir, step, 1, d);
  write_checkpoint(dir, 16, 0, d);
  EXPECT_EQ(latest_checkpoint(dir, 1).value(), 12);
  EXPECT_EQ(latest_checkpoint(dir, 0).value(), 16);
  EXPECT_FALSE(latest_checkpoint(dir, 2).has_value());
  CheckpointData r = read_checkpoint(checkpoint_file(dir, 12, 1));
  EXPECT_EQ(r.counters, d.counters);
  EXPECT_EQ(r.arrays, d.arrays);
  prune_checkpoints(dir, 1, 2);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_file(dir, 4, 1)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 8, 1)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 16, 0)));
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().extension(), ".bin") << "temporary file left: " << e.path();
  std::filesystem::remove_all(dir);
}

// A process stopped while writing leaves <file>.tmp: the rank removes its own at the next start and
// keeps its complete checkpoints and the other ranks' files.
TEST(CheckpointTest, PartlyWrittenCheckpointsOfTheRankAreRemoved) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-tmp");
  CheckpointData d;
  d.arrays["param/w"] = {1.0f};
  write_checkpoint(dir, 4, 0, d);
  std::ofstream(checkpoint_file(dir, 8, 0) + ".tmp") << "half";
  std::ofstream(checkpoint_file(dir, 8, 1) + ".tmp") << "half";
  EXPECT_EQ(remove_partial_checkpoints(dir, 0), 1);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_file(dir, 8, 0) + ".tmp"));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 8, 1) + ".tmp"));
  EXPECT_EQ(latest_checkpoint(dir, 0).value(), 4);
  EXPECT_EQ(remove_partial_checkpoints(dir, 0), 0);
  EXPECT_EQ(remove_partial_checkpoints(dir + "/absent", 0), 0);
  std::filesystem::remove_all(dir);
}

TEST(CheckpointTest, CorruptAndTruncatedFilesAreErrorsNamingTheFile) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt");
  CheckpointData d;
  d.arrays["x"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(dir, 1, 0, d);
  const std::string file = checkpoint_file(dir, 1, 0);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  try {
    read_checkpoint(file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos);
  }
  std::filesystem::resize_file(file, 100);
  EXPECT_THROW(read_checkpoint(file), Error);
  EXPECT_THROW(read_checkpoint(dir + "/missing.bin"), Error);
  std::filesystem::remove_all(dir);
}

// A write that fails part-way (here the file-size limit, as a full disk would) throws naming the file,
// leaves no temporary file and keeps the previous checkpoint readable.
TEST(CheckpointTest, AFailedWriteKeepsThePreviousCheckpoint) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-full");
  CheckpointData small;
  small.counters["step"] = 4;
  small.arrays["w"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(dir, 4, 0, small);
  const pid_t child = fork();
  if (child == 0) {  // the limit applies to this process only
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    CheckpointData big;
    big.counters["step"] = 8;
    big.arrays["w"] = std::vector<float>(1 << 20, 2.0f);  // 4 MiB
    try {
      write_checkpoint(dir, 8, 0, big);
      _exit(10);
    } catch (const Error& e) {
      const std::string m = e.what();
      _exit(m.find("cannot write '" + checkpoint_file(dir, 8, 0) + ".tmp'") != std::string::npos ? 0 : 11);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(checkpoint_steps(dir, 0), std::vector<int64_t>{4});
  EXPECT_FALSE(std::filesystem::exists(checkpoint_file(dir, 8, 0) + ".tmp"));
  EXPECT_EQ(read_checkpoint(checkpoint_file(dir, 4, 0)).arrays.at("w").size(), 1000u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
