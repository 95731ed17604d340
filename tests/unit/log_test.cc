// The log's figures and levels: Fixed formats as "%.*f", and only when its line is written;
// a program's default level gives way to TESSERA_LOG_LEVEL.
#include "common/log.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tessera {
namespace {

// Counts how often it is formatted.
struct Counted {
  int* formatted;
};
std::ostream& operator<<(std::ostream& os, Counted c) {
  ++*c.formatted;
  return os << "x";
}

TEST(LogTest, FixedWritesItsDigitsAfterThePoint) {
  EXPECT_EQ(detail::concat(Fixed{2.345678, 1}), "2.3");
  EXPECT_EQ(detail::concat("a ", Fixed{0.5, 3}, " ms"), "a 0.500 ms");
  EXPECT_EQ(fixed_digits(1234.56789, 2), "1234.57");
  EXPECT_EQ(fixed_digits(-0.04, 1), detail::concat(Fixed{-0.04, 1}));
}

TEST(LogTest, ALineThatIsOffFormatsNothing) {
  int formatted = 0;
  set_log_level(LogLevel::kWarn);
  log_debug("off: ", Counted{&formatted});
  log_info("off: ", Counted{&formatted});
  EXPECT_EQ(formatted, 0);
  log_warn("on: ", Counted{&formatted});
  EXPECT_EQ(formatted, 1);
  set_log_level(LogLevel::kInfo);
}

TEST(LogTest, TheDefaultLevelGivesWayToTheEnvironment) {
  unsetenv("TESSERA_LOG_LEVEL");
  set_log_level(LogLevel::kInfo);
  set_default_log_level(LogLevel::kWarn);
  EXPECT_FALSE(log_enabled(LogLevel::kInfo));
  EXPECT_TRUE(log_enabled(LogLevel::kWarn));

  setenv("TESSERA_LOG_LEVEL", "debug", 1);
  set_log_level(LogLevel::kDebug);  // as the variable set it
  set_default_log_level(LogLevel::kWarn);
  EXPECT_TRUE(log_enabled(LogLevel::kDebug));
  unsetenv("TESSERA_LOG_LEVEL");
  set_log_level(LogLevel::kInfo);
}

}  // namespace
}  // namespace tessera
