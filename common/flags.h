// Flags: the one command-line parser of every Tessera program, and the one reader of its
// environment variables. A program declares each flag with where its value goes, its range and a
// line of help; parse() fills them. Strict: an unknown flag, a missing value, a number that is not
// whole where a count is wanted, one that overflows, lies outside its range or is not finite is a
// ConfigError naming the flag, the value and the range ("--nodes: '4294967296' is not in [1, 4096]").
// A flag may fall back to an environment variable, read with the same rules (the error then names
// the variable). Flags are "--name value" or "--name=value"; a switch takes no value.
// Not thread-safe: parse once, on the main thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/config_node.h"

namespace tessera {

// Whole numbers and reals read from text, all of it: nothing when the text is not one (empty, trailing
// characters, overflow, a real that is not finite). The one number reader of flags and environment.
std::optional<int64_t> parse_int(const std::string& text);
std::optional<double> parse_real(const std::string& text);

// The value of environment variable `name`, or nothing when it is unset or empty.
std::optional<std::string> env_value(const char* name);
// An integer environment variable in [lo, hi]; `def` when unset. ConfigError naming it otherwise.
int64_t env_int(const char* name, int64_t def, int64_t lo, int64_t hi);

class Flags {
 public:
  // program: as messages name it ("tessera run"); usage: printed by --help (-h).
  Flags(std::string program, std::string usage);

  // Each declaration returns *this; `out` keeps its value when the flag is not given (its default).
  Flags& text(const std::string& name, std::string* out, const char* env = nullptr);
  Flags& integer(const std::string& name, int64_t* out, int64_t lo, int64_t hi, const char* env = nullptr);
  Flags& integer(const std::string& name, int* out, int lo, int hi, const char* env = nullptr);
  Flags& real(const std::string& name, double* out, Interval range);
  Flags& toggle(const std::string& name, bool* out);
  // A flag whose value is optional: "--name" alone sets `bare`, "--name=VALUE" sets VALUE.
  Flags& optional_text(const std::string& name, std::string* out, const std::string& bare);
  // Arguments that are not flags, [min, max] of them; `what` names them in errors ("the manifest").
  Flags& positional(std::vector<std::string>* out, size_t min, size_t max, std::string what);

  // Parses argv[first..argc). Returns false when --help (or -h) was given: the usage was printed on
  // standard output and the program should exit 0. Throws ConfigError for anything it cannot take.
  bool parse(int argc, char** argv, int first = 1);
  // Whether the flag was given on the command line (or its environment variable was set).
  bool given(const std::string& name) const;

 private:
  struct Spec {
    std::string name;
    const char* env = nullptr;
    bool takes_value = true, optional_value = false;
    std::function<void(const std::string& value, const std::string& source)> set;
  };
  Flags& add(Spec spec);
  const Spec* find(const std::string& name) const;

  std::string program_, usage_;
  std::vector<Spec> specs_;
  std::vector<std::string> given_;
  std::vector<std::string>* positional_ = nullptr;
  size_t positional_min_ = 0, positional_max_ = 0;
  std::string positional_what_;
};

}  // namespace tessera
