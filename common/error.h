// Error types shared by the worker runtime.
//
// Error policy: configuration mistakes throw ConfigError naming the field and the reason; a failed or
// timed-out communication throws CommError naming the operation, the group, the rank and the peer;
// numerical faults in user data (NaN/Inf gradients) throw NumericError naming the bucket. Broken
// invariants inside Tessera throw std::logic_error through TESSERA_CHECK with the values involved.
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One thing wrong with a value given by the user: the field path and the reason.
struct FieldProblem {
  std::string field, reason;
};

// A value given by the user (job config, flags, topology) cannot be used. The message starts with
// the field path, then the reason: "communication.strategy: 'hitopk' needs the same number of ranks
// on every node (node 'b' has 1, node 'a' has 2)". A manifest with several mistakes raises one
// ConfigError that lists them all ("3 problems:" and one indented line each).
class ConfigError : public Error {
 public:
  ConfigError(const std::string& field, const std::string& reason)
      : Error(field + ": " + reason), problems_{{field, reason}} {}
  explicit ConfigError(std::vector<FieldProblem> problems);  // at least one
  const std::string& field() const { return problems_.front().field; }
  const std::vector<FieldProblem>& problems() const { return problems_; }

 private:
  std::vector<FieldProblem> problems_;
};

// A file could not be read or written: the path and why (no_space: the disk is full).
class IoError : public Error {
 public:
  IoError(const std::string& path, const std::string& what, bool no_space = false)
      : Error("'" + path + "': " + what), path_(path), no_space_(no_space) {}
  const std::string& path() const { return path_; }
  bool no_space() const { return no_space_; }

 private:
  std::string path_;
  bool no_space_;
};

// A collective or point-to-point operation failed or did not complete before its deadline.
class CommError : public Error {
 public:
  using Error::Error;
};

// A rendezvous store key did not appear before the deadline.
class StoreTimeout : public CommError {
 public:
  using CommError::CommError;
};

// Non-finite values where finite ones are required (a NaN or Inf gradient).
class NumericError : public Error {
 public:
  using Error::Error;
};

// A worker's exit statuses, which the controller acts on: a configuration error and a diverged run
// are not retried; a stopped worker (SIGTERM: the gang agreed on a step, checkpointed it and
// stopped) is placed again without counting a failure.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitConfigError = 2;
inline constexpr int kExitDiverged = 3;
inline constexpr int kExitStopped = 4;

// The body of a command's main(): runs `body` and returns its exit status; a ConfigError that
// escapes it is printed as "<program>: <message>" and exits with kExitConfigError, a NumericError
// (training diverged) with kExitDiverged, any other exception with kExitFailure.
int run_command(const char* program, const std::function<int()>& body);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// "1 worker", "2 workers": a count and its noun, plural unless the count is 1.
template <typename N>
std::string count(N n, const std::string& noun) {
  return concat(n, " ", noun, n == 1 ? "" : "s");
}
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& msg);
}  // namespace detail

}  // namespace tessera

// Invariant checks: throw std::logic_error with the expression, the operands and a message.
#define TESSERA_CHECK(cond, ...)                                                                 \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::tessera::detail::check_failed(__FILE__, __LINE__, #cond,                                 \
                                      ::tessera::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define TESSERA_CHECK_OP(a, op, b, ...)                                                                     \
  do {                                                                                                      \
    const auto& tessera_a_ = (a);                                                                           \
    const auto& tessera_b_ = (b);                                                                           \
    if (!(tessera_a_ op tessera_b_))                                                                        \
      ::tessera::detail::check_failed(                                                                      \
          __FILE__, __LINE__, #a " " #op " " #b,                                                            \
          ::tessera::detail::concat("(", tessera_a_, " vs ", tessera_b_, ") " __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

#define TESSERA_CHECK_EQ(a, b, ...) TESSERA_CHECK_OP(a, ==, b __VA_OPT__(, ) __VA_ARGS__)
#define TESSERA_CHECK_LE(a, b, ...) TESSERA_CHECK_OP(a, <=, b __VA_OPT__(, ) __VA_ARGS__)
#define TESSERA_CHECK_LT(a, b, ...) TESSERA_CHECK_OP(a, <, b __VA_OPT__(, ) __VA_ARGS__)
