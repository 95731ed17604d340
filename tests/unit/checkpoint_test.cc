#include "worker/train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "testing/fork_ranks.h"
#include "worker/data/filesystem.h"

namespace tessera {
namespace {

PosixFileSystem posix;

// A gang of another size resumes: the residuals of the ranks that wrote the step, each placed at its
// offset in its bucket (a hitopk rank holds a shard), summed.
TEST(CheckpointTest, SummedResidualsPlaceEachRanksShareInItsBucket) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-residuals");
  CheckpointData a, b, c;
  a.arrays["residual/0"] = {1, 2};  // shard [0, 2) of bucket 0
  a.counters["residual_offset/0"] = 0;
  a.arrays["residual/1"] = {1, 1, 1};
  b.arrays["residual/0"] = {10, 20};  // shard [2, 4)
  b.counters["residual_offset/0"] = 2;
  b.arrays["residual/1"] = {0.5f, 0, -1};
  c.arrays["residual/0"] = {100, 200};  // a second node's shard [0, 2)
  c.counters["residual_offset/0"] = 0;
  write_checkpoint(posix, dir, 7, 0, a);
  write_checkpoint(posix, dir, 7, 1, b);
  write_checkpoint(posix, dir, 7, 2, c);
  const auto sum = summed_bucket_arrays(posix, dir, 7, 3, {4, 3});
  ASSERT_EQ(sum.size(), 2u);
  EXPECT_EQ(sum.at(0), (std::vector<double>{101, 202, 10, 20}));
  EXPECT_EQ(sum.at(1), (std::vector<double>{1.5, 1, 0}));
  // Buckets that do not fit them: the file named.
  try {
    summed_bucket_arrays(posix, dir, 7, 3, {3, 3});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "ckpt-0000000007-rank1.bin': the residual of bucket 0 (2 entries at 2) does not fit its 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(summed_bucket_arrays(posix, dir, 7, 3, {4}), ConfigError);  // no bucket 1
  EXPECT_THROW(summed_bucket_arrays(posix, dir, 7, 4, {4, 3}), Error);     // rank 3 wrote nothing
  std::filesystem::remove_all(dir);
}

TEST(CheckpointTest, RoundTripLatestAndPrune) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt");
  CheckpointData d;
  d.counters["step"] = 12;
  d.arrays["param/w"] = {1.5f, -2.0f, 3.25f};
  d.arrays["empty"] = {};
  for (int64_t step : {4, 8, 12}) write_checkpoint(posix, dir, step, 1, d);
  write_checkpoint(posix, dir, 16, 0, d);
  EXPECT_EQ(latest_checkpoint(dir, 1).value(), 12);
  EXPECT_EQ(latest_checkpoint(dir, 0).value(), 16);
  EXPECT_FALSE(latest_checkpoint(dir, 2).has_value());
  CheckpointData r = read_checkpoint(posix, checkpoint_file(dir, 12, 1));
  EXPECT_EQ(r.counters, d.counters);
  EXPECT_EQ(r.arrays, d.arrays);
  prune_checkpoints(posix, dir, 1, 2);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_file(dir, 4, 1)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 8, 1)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 16, 0)));
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().extension(), ".bin") << "temporary file left: " << e.path();
  std::filesystem::remove_all(dir);
}

// A process stopped while writing leaves <file>.tmp.<pid>: the rank removes its own at the next start and
// keeps its complete checkpoints and the other ranks' files.
TEST(CheckpointTest, PartlyWrittenCheckpointsOfTheRankAreRemoved) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-tmp");
  CheckpointData d;
  d.arrays["param/w"] = {1.0f};
  write_checkpoint(posix, dir, 4, 0, d);
  std::ofstream(checkpoint_file(dir, 8, 0) + ".tmp.123") << "half";
  std::ofstream(checkpoint_file(dir, 8, 1) + ".tmp.123") << "half";
  EXPECT_EQ(remove_partial_checkpoints(posix, dir, 0), 1);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_file(dir, 8, 0) + ".tmp.123"));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_file(dir, 8, 1) + ".tmp.123"));
  EXPECT_EQ(latest_checkpoint(dir, 0).value(), 4);
  EXPECT_EQ(remove_partial_checkpoints(posix, dir, 0), 0);
  EXPECT_EQ(remove_partial_checkpoints(posix, dir + "/absent", 0), 0);
  std::filesystem::remove_all(dir);
}

TEST(CheckpointTest, CorruptAndTruncatedFilesAreErrorsNamingTheFile) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt");
  CheckpointData d;
  d.arrays["x"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(posix, dir, 1, 0, d);
  const std::string file = checkpoint_file(dir, 1, 0);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x7f');
  }
  try {
    read_checkpoint(posix, file);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos);
  }
  std::filesystem::resize_file(file, 100);
  EXPECT_THROW(read_checkpoint(posix, file), Error);
  EXPECT_THROW(read_checkpoint(posix, dir + "/missing.bin"), Error);
  std::filesystem::remove_all(dir);
}

// A write that fails part-way (here the file-size limit, as a full disk would) throws naming the file,
// leaves no temporary file and keeps the previous checkpoint readable.
TEST(CheckpointTest, AFailedWriteKeepsThePreviousCheckpoint) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-full");
  CheckpointData small;
  small.counters["step"] = 4;
  small.arrays["w"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(posix, dir, 4, 0, small);
  const pid_t child = fork();
  if (child == 0) {  // the limit applies to this process only
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    CheckpointData big;
    big.counters["step"] = 8;
    big.arrays["w"] = std::vector<float>(1 << 20, 2.0f);  // 4 MiB
    try {
      write_checkpoint(posix, dir, 8, 0, big);
      _exit(10);
    } catch (const Error& e) {
      const std::string m = e.what();
      _exit(m.find("'" + checkpoint_file(dir, 8, 0) + ".tmp.") != std::string::npos &&
                    m.find("cannot write") != std::string::npos
                ? 0
                : 11);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(checkpoint_steps(dir, 0), std::vector<int64_t>{4});
  EXPECT_EQ(remove_partial_checkpoints(posix, dir, 0), 0) << "a temporary file was left";
  EXPECT_EQ(read_checkpoint(posix, checkpoint_file(dir, 4, 0)).arrays.at("w").size(), 1000u);
  std::filesystem::remove_all(dir);
}

// Through a FaultyFileSystem: a write torn half-way (the process died) leaves a partial file that the
// next start removes, and the previous checkpoint stays the newest.
TEST(CheckpointTest, ATornWriteLeavesThePreviousCheckpointNewest) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-torn");
  FaultyFileSystem faulty(posix);
  CheckpointData d;
  d.counters["step"] = 4;
  d.arrays["w"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(faulty, dir, 4, 0, d);
  faulty.tear_writes = 1;
  d.counters["step"] = 8;
  EXPECT_THROW(write_checkpoint(faulty, dir, 8, 0, d), IoError);
  EXPECT_EQ(checkpoint_steps(dir, 0), std::vector<int64_t>{4});
  EXPECT_EQ(read_checkpoint(faulty, checkpoint_file(dir, 4, 0)).counters.at("step"), 4);
  EXPECT_EQ(remove_partial_checkpoints(faulty, dir, 0), 1);
  EXPECT_EQ(remove_partial_checkpoints(faulty, dir, 0), 0);
  std::filesystem::remove_all(dir);
}

// Through a FaultyFileSystem: a full disk refuses the write with an error that says so and names
// the checkpoint; the previous one is kept, and the next write succeeds once there is room.
TEST(CheckpointTest, AFullDiskRefusesTheWriteAndKeepsThePreviousCheckpoint) {
  const std::string dir = testing::make_temp_dir("tessera-ckpt-disk");
  FaultyFileSystem faulty(posix);
  CheckpointData d;
  d.arrays["w"] = std::vector<float>(1000, 1.0f);
  write_checkpoint(faulty, dir, 4, 0, d);
  faulty.capacity = faulty.used.load() + 1000;  // room for a quarter of the next one
  try {
    write_checkpoint(faulty, dir, 8, 0, d);
    FAIL() << "a write past the disk's capacity succeeded";
  } catch (const IoError& e) {
    EXPECT_TRUE(e.no_space());
    EXPECT_NE(std::string(e.what()).find(checkpoint_file(dir, 8, 0)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no space"), std::string::npos) << e.what();
  }
  EXPECT_EQ(checkpoint_steps(dir, 0), std::vector<int64_t>{4});
  faulty.capacity = -1;
  write_checkpoint(faulty, dir, 8, 0, d);
  EXPECT_EQ(checkpoint_steps(dir, 0), (std::vector<int64_t>{4, 8}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera
