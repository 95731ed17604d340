#include "common/error.h"

#include <cstdio>

namespace tessera {
namespace {

// One problem: "field: reason"; several: "3 problems:" and one indented line each.
std::string list_problems(const std::vector<FieldProblem>& problems) {
  std::string out;
  if (problems.size() == 1) return out.append(problems[0].field).append(": ").append(problems[0].reason);
  out.append(std::to_string(problems.size())).append(" problems:");
  for (const auto& p : problems) out.append("\n  ").append(p.field).append(": ").append(p.reason);
  return out;
}

}  // namespace

ConfigError::ConfigError(std::vector<FieldProblem> problems)
    : Error(list_problems(problems)), problems_(std::move(problems)) {
  if (problems_.empty()) problems_.push_back({"", "invalid configuration"});
}

int run_command(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return kExitConfigError;
  } catch (const NumericError& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return kExitDiverged;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return kExitFailure;
  }
}

}  // namespace tessera

namespace tessera::detail {

void check_failed(const char* file, int line, const char* expr, const std::string& msg) {
  throw std::logic_error(concat("check failed at ", file, ":", line, ": ", expr, msg.empty() ? "" : " ", msg));
}

}  // namespace tessera::detail
