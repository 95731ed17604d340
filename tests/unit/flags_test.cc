// The one flag parser: every bad value is an error naming the flag (or the environment variable),
// the value and the range; nothing wraps, clamps or is silently ignored.
#include "common/flags.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace tessera {
namespace {

struct Parsed {
  int nodes = 0;
  int64_t seed = 1;
  double progress = 5;
  std::string name;
  bool fresh = false;
  std::string prometheus;
  std::vector<std::string> files;
};

Flags declare(Parsed* p) {
  Flags f("prog",
          "usage: prog FILE [--nodes N] [--seed S] [--progress SECONDS] [--name X] [--fresh] [--prometheus[=ADDR]]\n");
  f.integer("--nodes", &p->nodes, 1, 4096, "TEST_FLAGS_NODES")
      .integer("--seed", &p->seed, 0, std::numeric_limits<int64_t>::max())
      .real("--progress", &p->progress, Interval{0, 86400, true, false})
      .text("--name", &p->name)
      .toggle("--fresh", &p->fresh)
      .optional_text("--prometheus", &p->prometheus, "127.0.0.1:9090")
      .positional(&p->files, 1, 1, "manifest");
  return f;
}

// The error parse() throws for `args`, or "" when it takes them.
std::string error_of(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Parsed p;
  Flags f = declare(&p);
  try {
    f.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(FlagsTest, GoodValuesAreTaken) {
  std::vector<std::string> args = {"prog",
                                   "job.yaml",
                                   "--nodes",
                                   "4",
                                   "--seed=0",
                                   "--progress",
                                   "0.5",
                                   "--name",
                                   "-x",
                                   "--fresh",
                                   "--prometheus=127.0.0.1:1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Parsed p;
  Flags f = declare(&p);
  ASSERT_TRUE(f.parse(static_cast<int>(argv.size()), argv.data()));
  EXPECT_EQ(p.nodes, 4);
  EXPECT_EQ(p.seed, 0);
  EXPECT_DOUBLE_EQ(p.progress, 0.5);
  EXPECT_EQ(p.name, "-x");  // a value is the next argument, whatever it starts with
  EXPECT_TRUE(p.fresh);
  EXPECT_EQ(p.prometheus, "127.0.0.1:1");
  EXPECT_EQ(p.files, std::vector<std::string>{"job.yaml"});
  EXPECT_TRUE(f.given("--nodes"));
  EXPECT_FALSE(f.given("--bogus"));
}

TEST(FlagsTest, EveryBadValueNamesTheFlagTheValueAndTheRange) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"j", "--nodes", "4294967296"}, "--nodes: '4294967296' is not in [1, 4096]"},  // would wrap to 0 as an int
      {{"j", "--nodes", "99999999999999999999"}, "--nodes: '99999999999999999999' is not a whole number in [1, 4096]"},
      {{"j", "--nodes", "0"}, "--nodes: '0' is not in [1, 4096]"},
      {{"j", "--nodes", "-3"}, "--nodes: '-3' is not in [1, 4096]"},
      {{"j", "--nodes", "2.5"}, "--nodes: '2.5' is not a whole number in [1, 4096]"},
      {{"j", "--nodes", " 2"}, "--nodes: ' 2' is not a whole number"},
      {{"j", "--nodes", ""}, "--nodes: '' is not a whole number"},
      {{"j", "--seed", "-1"}, "--seed: '-1' is not at least 0"},
      {{"j", "--progress", "nan"}, "--progress: 'nan' is not a finite number in (0, 86400]"},
      {{"j", "--progress", "inf"}, "--progress: 'inf' is not a finite number"},
      {{"j", "--progress", "-5"}, "--progress: '-5' is not in (0, 86400]"},
      {{"j", "--progress", "0"}, "--progress: '0' is not in (0, 86400]"},
      {{"j", "--progress", "1e999"}, "--progress: '1e999' is not a finite number"},
      {{"j", "--nodes"}, "--nodes: needs a value"},
      {{"j", "--nodes="}, "--nodes: needs a value after '='"},
      {{"j", "--fresh=yes"}, "--fresh: takes no value"},
      {{"j", "--bogus", "1"}, "--bogus: unknown flag (prog --help lists them)"},
      {{"j", "k"}, "k: unexpected argument (prog takes one manifest)"},
      {{}, "prog: name the manifest: prog FILE"},
  };
  for (const auto& [args, message] : cases) {
    const std::string got = error_of(args);
    EXPECT_NE(got.find(message), std::string::npos)
        << "args ending " << (args.empty() ? "" : args.back()) << ": " << got;
  }
}

TEST(FlagsTest, AnEnvironmentVariableIsReadWithTheSameRulesAndNamedInErrors) {
  setenv("TEST_FLAGS_NODES", "8", 1);
  Parsed p;
  {
    std::vector<std::string> args = {"prog", "j"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    Flags f = declare(&p);
    ASSERT_TRUE(f.parse(2, argv.data()));
    EXPECT_EQ(p.nodes, 8);
  }
  EXPECT_EQ(error_of({"j", "--nodes", "2"}), "");  // the flag wins over the variable
  setenv("TEST_FLAGS_NODES", "70000", 1);
  EXPECT_NE(error_of({"j"}).find("TEST_FLAGS_NODES: '70000' is not in [1, 4096]"), std::string::npos);
  unsetenv("TEST_FLAGS_NODES");
  setenv("TEST_FLAGS_INT", "x", 1);
  try {
    env_int("TEST_FLAGS_INT", 0, 0, 10);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("TEST_FLAGS_INT: 'x' is not a whole number in [0, 10]"), std::string::npos);
  }
  unsetenv("TEST_FLAGS_INT");
  EXPECT_EQ(env_int("TEST_FLAGS_INT", 7, 0, 10), 7);
}

TEST(FlagsTest, HelpPrintsTheUsageAndAsksTheProgramToStop) {
  std::vector<std::string> args = {"prog", "--nodes", "0", "-h"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  Parsed p;
  Flags f = declare(&p);
  testing::internal::CaptureStdout();
  EXPECT_FALSE(f.parse(static_cast<int>(argv.size()), argv.data()));
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: prog FILE"), std::string::npos);
}

TEST(FlagsTest, NumbersAreReadWholeOrNotAtAll) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  EXPECT_FALSE(parse_int("9223372036854775808"));
  EXPECT_FALSE(parse_int("4x"));
  EXPECT_FALSE(parse_int("0x10"));
  EXPECT_EQ(parse_real("2.5e3"), 2500.0);
  EXPECT_FALSE(parse_real("nan"));
  EXPECT_FALSE(parse_real("-inf"));
  EXPECT_FALSE(parse_real("1.5s"));
}

}  // namespace
}  // namespace tessera
