// Data: HDF5 block reads equal slices of full reads for the spatial splits; epoch shards cover every
// sample once; the tiered cache's hit/miss/eviction behaviour and its failure handling (corrupt
// entries, a full disk, torn writes, restarts); the prefetching loader; errors naming files.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "testing/fork_ranks.h"
#include "worker/data/file_dataset.h"
#include "worker/data/loader.h"
#include "worker/data/sample_cache.h"

namespace tessera {
namespace {

using testing::make_temp_dir;

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.span().begin(), t.span().end()); }

TEST(Hdf5Test, BlockReadsEqualSlicesOfTheFullRead) {
  const std::string dir = make_temp_dir("tessera-h5");
  generate_dataset("cosmoflow", 2, 16, dir + "/cosmo", 3);
  generate_dataset("unet", 1, 12, dir + "/unet", 4);
  PosixFileSystem fs;
  FileDataset cosmo(dir + "/cosmo", fs, nullptr), unet(dir + "/unet", fs, nullptr);
  EXPECT_EQ(cosmo.input_shape(), (Shape{4, 16, 16, 16}));
  EXPECT_EQ(cosmo.target_shape(), (Shape{4}));
  EXPECT_EQ(unet.target_shape(), (Shape{12, 12, 12}));
  for (FileDataset* ds : {&cosmo, &unet}) {
    const Shape s = ds->input_shape();
    Sample full = ds->get(0);
    // The boxes of D split in 2 and 4, D x H in 2 x 2, and odd offsets.
    std::vector<VolumeBox> boxes;
    for (int parts : {2, 4})
      for (int i = 0; i < parts; ++i) boxes.push_back({{s[1] * i / parts, 0, 0}, {s[1] * (i + 1) / parts, s[2], s[3]}});
    boxes.push_back({{0, s[2] / 2, 0}, {s[1] / 2, s[2], s[3]}});
    boxes.push_back({{3, 1, 2}, {s[1] - 2, s[2] - 5, s[3] - 1}});
    for (const VolumeBox& box : boxes) {
      SCOPED_TRACE(box.str());
      Sample blk = ds->get_block(0, box);
      EXPECT_EQ(values(blk.input), values(crop_volume(full.input, box)));
      if (full.target.rank() == 3) {
        EXPECT_EQ(values(blk.target), values(crop_volume(full.target, box)));
      } else {
        EXPECT_EQ(values(blk.target), values(full.target));
      }
    }
  }
  // The stored bytes of a half-volume read are about half of a whole read: only its chunks are read.
  ArrayRead whole = read_array({cosmo.file(0), "full"});
  ArrayRead half = read_array({cosmo.file(0), "full"}, {{0, 0, 0}, {8, 16, 16}});
  EXPECT_LT(half.stored_bytes, whole.stored_bytes * 0.7);
  EXPECT_GT(half.stored_bytes, 0u);
  // Raw densities were stored; the dataset serves them log1p-transformed.
  EXPECT_NEAR(cosmo.get(1).input[5], std::log1p(read_array({cosmo.file(1), "full"}).values[5]), 1e-6);
  std::filesystem::remove_all(dir);
}

TEST(Hdf5Test, MissingAndCorruptFilesAreNamed) {
  const std::string dir = make_temp_dir("tessera-h5bad");
  generate_dataset("cosmoflow", 3, 8, dir, 1);
  verify_dataset(dir);
  PosixFileSystem fs;
  FileDataset ds(dir, fs, nullptr);
  const std::string victim = ds.file(1);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2000);
    for (int i = 0; i < 64; ++i) f.put('Z');
  }
  try {
    verify_dataset(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(victim), std::string::npos) << e.what();
  }
  std::filesystem::remove(ds.file(2));
  try {
    ds.get(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(ds.file(2)), std::string::npos) << e.what();
  }
  EXPECT_THROW(FileDataset(dir + "/nowhere", fs, nullptr), ConfigError);
  std::filesystem::remove_all(dir);
}

TEST(ShardingTest, EverySampleOncePerEpochAcrossReplicas) {
  const uint64_t n = 103;
  const int batch = 12;
  for (int replicas : {1, 2, 3, 4}) {
    for (int epoch : {0, 1}) {
      auto order = epoch_order(n, 7, epoch);
      std::multiset<uint64_t> seen;
      for (int64_t step = 0; step < static_cast<int64_t>(n / batch); ++step)
        for (int r = 0; r < replicas; ++r)
          for (uint64_t i : shard_batch(order, step, batch, r, replicas)) seen.insert(i);
      EXPECT_EQ(seen.size(), (n / batch) * batch);
      for (uint64_t i : seen) EXPECT_EQ(seen.count(i), 1u) << "sample " << i << " seen twice";
    }
  }
  EXPECT_NE(epoch_order(n, 7, 0), epoch_order(n, 7, 1));
  EXPECT_EQ(epoch_order(n, 7, 1), epoch_order(n, 7, 1));
}

// A validation split holds out round(fraction * n) samples, disjoint from the training ones and
// together all of them, the same for the same seed; a split that leaves nothing to train on is refused.
TEST(ShardingTest, ValidationSplitHoldsOutAFractionOfTheSamples) {
  std::shared_ptr<const Dataset> all = make_synthetic({"cosmo", 8, 50, 1});
  auto [train, val] = split_validation(all, 0.1, 3);
  ASSERT_EQ(val->size(), 5u);
  ASSERT_EQ(train->size(), 45u);
  std::set<float> seen;  // each cosmo sample's first target tells the samples apart
  for (uint64_t i = 0; i < train->size(); ++i) seen.insert(train->get(i).target[0]);
  for (uint64_t i = 0; i < val->size(); ++i) seen.insert(val->get(i).target[0]);
  EXPECT_EQ(seen.size(), 50u);
  auto again = split_validation(all, 0.1, 3);
  for (uint64_t i = 0; i < val->size(); ++i) EXPECT_EQ(again.second->get(i).target[0], val->get(i).target[0]);
  EXPECT_THROW(split_validation(all, 0.99, 3), ConfigError);
}

std::function<std::string()> source(const std::string& value, int* calls) {
  return [value, calls] {
    ++*calls;
    return value;
  };
}

TEST(TieredCacheTest, HitsMissesAndLruEviction) {
  PosixFileSystem fs;
  TieredCache cache({250, "", 0}, fs);  // memory only: room for two 100-byte entries
  int calls = 0;
  const std::string a(100, 'a'), b(100, 'b'), c(100, 'c');
  EXPECT_EQ(*cache.get("a", source(a, &calls)), a);
  EXPECT_EQ(*cache.get("b", source(b, &calls)), b);
  EXPECT_EQ(*cache.get("a", source(a, &calls)), a);  // hit; a is now most recent
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.memory_keys(), (std::vector<std::string>{"a", "b"}));
  cache.get("c", source(c, &calls));  // evicts b, the least recently used
  EXPECT_EQ(cache.memory_keys(), (std::vector<std::string>{"c", "a"}));
  cache.get("b", source(b, &calls));
  EXPECT_EQ(calls, 4);
  auto k = cache.counters();
  EXPECT_EQ(k.hits[TieredCache::kMemory], 1u);
  EXPECT_EQ(k.hits[TieredCache::kRemote], 4u);
  EXPECT_EQ(k.misses[0], 4u);
  EXPECT_EQ(k.memory_evictions, 2u);
}

TEST(TieredCacheTest, SsdTierSurvivesRestartsAndEvictsByBudget) {
  const std::string dir = make_temp_dir("tessera-ssd");
  PosixFileSystem fs;
  int calls = 0;
  {
    TieredCache cache({0, dir, 1000}, fs);  // no memory tier; SSD holds about four 200-byte entries
    for (const char* key : {"k1", "k2", "k3"}) cache.get(key, source(std::string(200, key[1]), &calls));
    EXPECT_EQ(cache.ssd_entries(), 3u);
    cache.get("k1", source("x", &calls));  // from SSD
    EXPECT_EQ(calls, 3);
  }
  TieredCache again({0, dir, 1000}, fs);  // a restarted worker
  EXPECT_EQ(again.ssd_entries(), 3u);
  EXPECT_EQ(*again.get("k2", source("wrong", &calls)), std::string(200, '2'));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(again.counters().hits[TieredCache::kSsd], 1u);
  for (const char* key : {"k4", "k5", "k6"}) again.get(key, source(std::string(200, key[1]), &calls));
  EXPECT_LE(again.ssd_bytes_used(), 1000);
  EXPECT_GT(again.counters().ssd_evictions, 0u);
  std::filesystem::remove_all(dir);
}

TEST(TieredCacheTest, CorruptEntryIsDetectedAndReadAgainFromRemote) {
  const std::string dir = make_temp_dir("tessera-ssd");
  PosixFileSystem fs;
  int calls = 0;
  TieredCache cache({0, dir, 1 << 20}, fs);
  cache.get("block", source(std::string(300, 'v'), &calls));
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('!');
  }
  EXPECT_EQ(*cache.get("block", source(std::string(300, 'v'), &calls)), std::string(300, 'v'));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(cache.counters().ssd_corrupt, 1u);
  // Re-filled: the next read is an SSD hit again.
  cache.get("block", source("unused", &calls));
  EXPECT_EQ(calls, 2);
  std::filesystem::remove_all(dir);
}

TEST(TieredCacheTest, FullDiskAndFailingReadsFallBackToRemote) {
  const std::string dir = make_temp_dir("tessera-ssd");
  PosixFileSystem posix;
  FaultyFileSystem faulty(posix);
  faulty.capacity = 500;
  int calls = 0;
  TieredCache cache({0, dir, 1 << 20}, faulty);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(*cache.get("k" + std::to_string(i), source(std::string(200, 'a' + i), &calls)),
              std::string(200, 'a' + i));
  EXPECT_GT(cache.counters().ssd_write_failures, 0u);  // the disk filled up
  EXPECT_EQ(cache.ssd_entries(), 2u);
  faulty.fail_reads = 1;
  EXPECT_EQ(*cache.get("k0", source(std::string(200, 'a'), &calls)), std::string(200, 'a'));
  EXPECT_EQ(cache.counters().ssd_read_failures, 1u);
  EXPECT_EQ(calls, 5);
  std::filesystem::remove_all(dir);
}

TEST(TieredCacheTest, TornWritesNeverBecomeVisible) {
  const std::string dir = make_temp_dir("tessera-ssd");
  PosixFileSystem posix;
  FaultyFileSystem faulty(posix);
  faulty.tear_writes = 1;
  int calls = 0;
  {
    TieredCache cache({0, dir, 1 << 20}, faulty);
    EXPECT_EQ(*cache.get("k", source(std::string(400, 'z'), &calls)), std::string(400, 'z'));
    EXPECT_EQ(cache.ssd_entries(), 0u);  // the torn write left no entry
  }
  TieredCache restarted({0, dir, 1 << 20}, faulty);
  EXPECT_EQ(restarted.ssd_entries(), 0u);  // the half-written temporary file is not an entry
  EXPECT_EQ(*restarted.get("k", source(std::string(400, 'z'), &calls)), std::string(400, 'z'));
  EXPECT_EQ(calls, 2);
  std::filesystem::remove_all(dir);
}

TEST(LoaderTest, BatchesInOrderAheadOfTheConsumer) {
  auto data = make_synthetic({"cosmo", 8, 20, 1});
  PrefetchLoader loader(*data, 2, 3);
  std::vector<std::vector<uint64_t>> schedule = {{3, 1}, {0, 7}, {19, 2}, {4, 4}};
  loader.start(schedule);
  for (const auto& want : schedule) {
    double waited = -1;
    Batch b = loader.next(&waited);
    EXPECT_GE(waited, 0);
    Batch ref = stack(*data, want);
    EXPECT_EQ(values(b.inputs), values(ref.inputs));
    EXPECT_EQ(values(b.targets), values(ref.targets));
  }
  // A new schedule replaces the old one; blocks of samples are cropped.
  PrefetchLoader blocks(*data, 1, 2, VolumeBox{{0, 0, 0}, {4, 8, 8}});
  blocks.start({{5}});
  EXPECT_EQ(blocks.next().inputs.shape(), (Shape{1, 4, 4, 8, 8}));
}

TEST(LoaderTest, LoadErrorsReachTheConsumer) {
  const std::string dir = make_temp_dir("tessera-loader");
  generate_dataset("cosmoflow", 2, 8, dir, 1);
  PosixFileSystem fs;
  FileDataset ds(dir, fs, nullptr);
  std::filesystem::remove(ds.file(1));
  PrefetchLoader loader(ds, 1, 2);
  loader.start({{0}, {1}});
  EXPECT_NO_THROW(loader.next());
  try {
    loader.next();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(ds.file(1)), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// The device cache's policy, on the host (on the GPU it holds the same entries in device memory).
TEST(SampleCacheTest, HoldsSamplesLeastRecentlyUsedFirstOutWithinItsBudget) {
  auto sample = [](float v) { return Sample{Tensor::filled({4, 2}, v), Tensor::filled({1}, v)}; };  // 36 bytes
  SampleCache cache(100, Device::kCpu);
  EXPECT_FALSE(cache.get(1).has_value());
  cache.put(1, sample(1));
  cache.put(2, sample(2));
  ASSERT_TRUE(cache.get(1).has_value());  // 1 is now the most recent
  cache.put(3, sample(3));                // 108 bytes > 100: 2, the least recent, goes
  EXPECT_EQ(cache.indices(), (std::vector<uint64_t>{3, 1}));
  EXPECT_EQ(cache.bytes_used(), 72);
  EXPECT_FALSE(cache.get(2).has_value());
  const auto c = cache.counters();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.evictions, 1u);
  // What it holds is its own copy: the loader's buffers can be reused.
  Sample s = sample(7);
  cache.put(7, s);
  s.input.fill(0.0f);
  EXPECT_EQ(cache.get(7)->input[0], 7.0f);
  // A sample larger than the whole budget is not held (and evicts nothing).
  cache.put(9, Sample{Tensor::filled({64}, 9.0f), Tensor::filled({1}, 9.0f)});
  EXPECT_FALSE(cache.get(9).has_value());
  EXPECT_EQ(cache.indices().size(), 2u);
}

}  // namespace
}  // namespace tessera
