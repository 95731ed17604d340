#include "worker/comm/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "common/error.h"
#include "testing/fork_ranks.h"

namespace tessera {
namespace {

void exercise(Store& s) {
  EXPECT_FALSE(s.try_get("a/b"));
  s.set("a/b", std::string("v\0w", 3));
  ASSERT_TRUE(s.try_get("a/b"));
  EXPECT_EQ(*s.try_get("a/b"), std::string("v\0w", 3));
  s.set("a/b", "second");
  EXPECT_EQ(s.get("a/b", Millis(10)), "second");

  std::thread writer([&] {
    std::this_thread::sleep_for(Millis(50));
    s.set("late", "x");
  });
  auto t0 = std::chrono::steady_clock::now();
  s.wait({"a/b", "late"}, Millis(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
  writer.join();

  try {
    s.wait({"late", "never-1", "never-2"}, Millis(100));
    FAIL() << "wait on missing keys returned";
  } catch (const StoreTimeout& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("never-1'"), std::string::npos) << m;
    EXPECT_NE(m.find("never-2'"), std::string::npos) << m;
    EXPECT_EQ(m.find("late'"), std::string::npos) << m;
    EXPECT_NE(m.find("100 ms"), std::string::npos) << m;
  }
}

TEST(StoreTest, MemoryStore) {
  MemoryStore s;
  exercise(s);
}

TEST(StoreTest, FileStore) {
  auto dir = testing::make_temp_dir("tessera-store");
  FileStore s(dir);
  exercise(s);
  // A second store on the same directory (another process) sees the same keys.
  FileStore other(dir);
  EXPECT_EQ(*other.try_get("late"), "x");
  // No temporary files are left behind.
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  std::filesystem::remove_all(dir);
}

TEST(StoreTest, PrefixStoreNamespacesKeys) {
  MemoryStore base;
  PrefixStore a("job1", base), b("job2", base);
  a.set("k", "1");
  EXPECT_FALSE(b.try_get("k"));
  EXPECT_EQ(*base.try_get("job1/k"), "1");
  exercise(b);
}

TEST(StoreTest, FileStoreUncreatableDirectoryNamesPath) {
  try {
    FileStore s("/proc/definitely/not/here");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/proc/definitely/not/here"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera
