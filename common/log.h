// Minimal leveled logging to stderr, one line per call, prefixed with time and the process's tag
// (for workers "rank N"). Thread-safe: each line is written with a single write.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/error.h"

namespace tessera {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// The tag printed on every line of this process (e.g. "rank 3"); empty by default.
void set_log_tag(const std::string& tag);
// Lines below this level are dropped. Default kInfo; TESSERA_LOG_LEVEL=debug|info|warn|error overrides.
void set_log_level(LogLevel level);
// The level of a program that should be quieter (or louder) than kInfo, unless TESSERA_LOG_LEVEL
// names one: then that stays.
void set_default_log_level(LogLevel level);
// Whether a line of this level is written (the log_* helpers format nothing when it is not).
bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string& msg);

// A figure with `digits` digits after the point ("%.*f"), formatted only when streamed: a log_*
// line that is off formats none of its Fixed arguments.
struct Fixed {
  double value;
  int digits;
};
std::ostream& operator<<(std::ostream& os, Fixed f);
// The same as a string: figures in summaries.
std::string fixed_digits(double v, int digits);

// What a class accuracy compares with, as the epoch log and the `tessera run` summary print it:
// " (the most frequent class alone: 0.8123); IoU per class 0.912, 0.301, mean 0.607" (no IoU part
// when `iou` is empty).
std::string class_scores_text(double baseline_metric, const std::vector<double>& iou);

template <typename... Args>
void log_info(const Args&... args) {
  if (log_enabled(LogLevel::kInfo)) log_line(LogLevel::kInfo, detail::concat(args...));
}
template <typename... Args>
void log_warn(const Args&... args) {
  if (log_enabled(LogLevel::kWarn)) log_line(LogLevel::kWarn, detail::concat(args...));
}
template <typename... Args>
void log_debug(const Args&... args) {
  if (log_enabled(LogLevel::kDebug)) log_line(LogLevel::kDebug, detail::concat(args...));
}

}  // namespace tessera
