// Token files as nanoGPT writes them (flat little-endian uint16 or uint32 ids), their windows, and the
// byte-level token files `tessera data generate --kind text` makes from English text.
#include "worker/data/tokens.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "testing/fork_ranks.h"

namespace tessera {
namespace {

// Writes ids as little-endian integers of `bytes` bytes, as numpy's tofile does on x86 and ARM.
std::string write_ids(const std::string& path, const std::vector<uint32_t>& ids, int bytes) {
  std::string raw;
  for (uint32_t v : ids)
    for (int b = 0; b < bytes; ++b) raw.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  std::ofstream(path, std::ios::binary) << raw;
  return path;
}

template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

TEST(TokensTest, ReadsUint16AndUint32Ids) {
  const std::string dir = testing::make_temp_dir("tessera-tokens");
  const std::vector<uint32_t> ids = {0, 1, 255, 256, 50256, 7};
  EXPECT_EQ(read_tokens({write_ids(dir + "/a.bin", ids, 2), 2, 50257}), ids);
  const std::vector<uint32_t> wide = {0, 70000, 100276, 3};
  EXPECT_EQ(read_tokens({write_ids(dir + "/b.bin", wide, 4), 4, 100277}), wide);
  std::filesystem::remove_all(dir);
}

TEST(TokensTest, BadFilesAreNamedWithTheReason) {
  const std::string dir = testing::make_temp_dir("tessera-tokens");
  const std::string odd = dir + "/odd.bin";
  std::ofstream(odd, std::ios::binary) << "abc";
  EXPECT_NE(config_error([&] {
              read_tokens({odd, 2, 256});
            }).find(odd + ": 3 bytes is not a whole number of 2-byte tokens"),
            std::string::npos);
  const std::string big = write_ids(dir + "/big.bin", {1, 2, 300}, 2);
  EXPECT_NE(config_error([&] {
              read_tokens({big, 2, 256});
            }).find(big + ": token 2 is id 300, not below the vocabulary size 256"),
            std::string::npos);
  const std::string empty = dir + "/empty.bin";
  std::ofstream(empty, std::ios::binary).flush();
  EXPECT_NE(config_error([&] { read_tokens({empty, 2, 256}); }).find(empty + ": holds no tokens"), std::string::npos);
  EXPECT_NE(config_error([&] { read_tokens({big, 3, 256}); }).find("dataset.tokenBytes"), std::string::npos);
  EXPECT_NE(config_error([&] { read_tokens({big, 2, 0}); }).find("dataset.vocabSize: required"), std::string::npos);
  try {
    read_tokens({dir + "/missing.bin", 2, 256});
    ADD_FAILURE() << "no error for a missing file";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), dir + "/missing.bin");
  }
  const std::string shortf = write_ids(dir + "/short.bin", {1, 2, 3}, 2);
  EXPECT_NE(config_error([&] {
              TokenDataset({shortf, 2, 256}, 8, 1);
            }).find("holds 3 tokens; a window of context 8 needs at least 9"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// Window i is the context at a random offset, its target the same tokens one later; the offsets are
// the same for the same seed (every rank) and spread over the file.
TEST(TokensTest, WindowsAreRandomContiguousAndShiftedByOne) {
  const std::string dir = testing::make_temp_dir("tessera-tokens");
  std::vector<uint32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint32_t>(i % 251);
  const TokenFile f{write_ids(dir + "/t.bin", ids, 2), 2, 256};
  const TokenDataset a(f, 16, 7), b(f, 16, 7), c(f, 16, 8);
  EXPECT_EQ(a.size(), 999u / 16);
  EXPECT_EQ(a.input_shape(), (Shape{16}));
  std::set<uint64_t> offsets;
  int moved = 0;
  for (uint64_t w = 0; w < a.size(); ++w) {
    const uint64_t at = a.offset(w);
    ASSERT_LE(at + 16, ids.size() - 1);
    offsets.insert(at);
    EXPECT_EQ(at, b.offset(w));
    moved += at != c.offset(w);
    const Sample s = a.get(w);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(s.input[i], static_cast<float>(ids[at + i]));
      EXPECT_EQ(s.target[i], static_cast<float>(ids[at + i + 1]));
    }
  }
  EXPECT_GT(offsets.size(), a.size() * 9 / 10) << "windows pile up on the same offsets";
  EXPECT_GT(*offsets.rbegin() - *offsets.begin(), ids.size() / 2) << "windows do not spread over the file";
  EXPECT_GT(moved, static_cast<int>(a.size()) / 2) << "another seed draws the same windows";
  std::filesystem::remove_all(dir);
}

TEST(TokensTest, GeneratesByteLevelTokensOfEnglishText) {
  const std::string dir = testing::make_temp_dir("tessera-tokens");
  const std::string text = "It was the best of times, it was the worst of times.\nIt was the age of wisdom.\n";
  std::ofstream(dir + "/book.txt") << text;
  const uint64_t n = generate_text_tokens(dir + "/out", {dir + "/book.txt"}, 0.25, false);
  EXPECT_EQ(n, text.size());
  const auto train = read_tokens({dir + "/out/train.bin", 2, 256}), val = read_tokens({dir + "/out/val.bin", 2, 256});
  ASSERT_EQ(train.size() + val.size(), text.size());
  EXPECT_EQ(val.size(), text.size() / 4);
  for (size_t i = 0; i < text.size(); ++i)
    EXPECT_EQ(i < train.size() ? train[i] : val[i - train.size()], static_cast<unsigned char>(text[i])) << i;
  std::ifstream meta(dir + "/out/meta.json");
  const auto m = nlohmann::json::parse(meta);
  EXPECT_EQ(m["vocabSize"], 256);
  EXPECT_EQ(m["dtype"], "uint16");
  // Not over an existing dataset unless asked.
  EXPECT_NE(config_error([&] {
              generate_text_tokens(dir + "/out", {dir + "/book.txt"}, 0.25, false);
            }).find("exists (--replace"),
            std::string::npos);
  EXPECT_EQ(generate_text_tokens(dir + "/out", {dir + "/book.txt"}, 0.5, true), text.size());
  EXPECT_NE(config_error([&] {
              generate_text_tokens(dir + "/o2", {dir + "/book.txt"}, 1.5, false);
            }).find("--validation-fraction"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

// The default text: the fortunes package's files (make deps installs it), a few MB of English.
TEST(TokensTest, TheDefaultTextIsTheFortunesPackage) {
  const std::vector<std::string> files = default_text_sources();
  ASSERT_GT(files.size(), 10u);
  uintmax_t bytes = 0;
  for (const auto& f : files) bytes += std::filesystem::file_size(f);
  EXPECT_GT(bytes, 1'000'000u);
}

}  // namespace
}  // namespace tessera
