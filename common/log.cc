#include "common/log.h"

#include "common/flags.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>

namespace tessera {
namespace {

LogLevel level_from_env() {
  const auto v = env_value("TESSERA_LOG_LEVEL");
  if (!v || *v == "info") return LogLevel::kInfo;
  if (*v == "debug") return LogLevel::kDebug;
  if (*v == "warn") return LogLevel::kWarn;
  if (*v == "error") return LogLevel::kError;
  std::fprintf(stderr, "TESSERA_LOG_LEVEL: '%s' is not debug, info, warn or error; logging at info\n", v->c_str());
  return LogLevel::kInfo;
}

std::atomic<int> g_level{static_cast<int>(level_from_env())};
std::mutex g_tag_mu;
std::string g_tag;

}  // namespace

void set_log_tag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(g_tag_mu);
  g_tag = tag;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

void set_default_log_level(LogLevel level) {
  if (!env_value("TESSERA_LOG_LEVEL")) set_log_level(level);
}

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

std::ostream& operator<<(std::ostream& os, Fixed f) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", f.digits, f.value);
  return os << buf;
}

std::string fixed_digits(double v, int digits) { return detail::concat(Fixed{v, digits}); }

void log_line(LogLevel level, const std::string& msg) {
  if (!log_enabled(level)) return;
  static const char* names[] = {"D", "I", "W", "E"};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char head[64];
  std::snprintf(head, sizeof(head), "%s %02d:%02d:%02d.%03d ", names[static_cast<int>(level)], tm.tm_hour, tm.tm_min,
                tm.tm_sec, ms);
  std::string line = head;
  {
    std::lock_guard<std::mutex> lock(g_tag_mu);
    if (!g_tag.empty()) line += "[" + g_tag + "] ";
  }
  line += msg;
  line += '\n';
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

std::string class_scores_text(double baseline_metric, const std::vector<double>& iou) {
  std::string text = " (the most frequent class alone: " + fixed_digits(baseline_metric, 4) + ")";
  if (iou.empty()) return text;
  double mean = 0;
  text += "; IoU per class";
  for (size_t k = 0; k < iou.size(); ++k) {
    text += (k ? ", " : " ") + fixed_digits(iou[k], 3);
    mean += iou[k] / static_cast<double>(iou.size());
  }
  return text + ", mean " + fixed_digits(mean, 3);
}

}  // namespace tessera
