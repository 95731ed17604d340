// ConfigNode: typed, path-aware reads of a YAML document (yaml-cpp). A read that finds a wrong value
// records a FieldProblem (the full path, "spec.training.batchSize", and what was expected and found)
// and returns the default, so one pass over a document reports every mistake in it; raise_problems()
// then throws one ConfigError that lists them. Unknown keys are problems too (a misspelt field never
// becomes a silent default), and types are strict as in a Kubernetes API: a quoted "2" is not an
// integer and a bare 2 is not a string.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "common/error.h"

namespace tessera {

// A range of numbers with open or closed ends, printed as "[0, 1)".
struct Interval {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = false, hi_open = false;
  static Interval at_least(double lo) { return {lo, INFINITY, false, false}; }
  static Interval above(double lo) { return {lo, INFINITY, true, false}; }
  static Interval closed(double lo, double hi) { return {lo, hi, false, false}; }
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  std::string str() const;
};

// A Kubernetes quantity ("64Mi", "10G", "1.5", "500m", "2k") as a number of base units (bytes,
// cores, devices); nothing when it is not one. The one table of quantity suffixes.
std::optional<double> parse_quantity(const std::string& quantity);

class ConfigNode {
 public:
  // A document root; every node derived from it adds its problems to the root's list.
  explicit ConfigNode(YAML::Node node);
  // Parses a file or a string. A file that cannot be read or YAML that does not parse throws
  // ConfigError naming the file (and the line and column).
  static ConfigNode load_file(const std::string& file);
  static ConfigNode load_string(const std::string& text, const std::string& name = "<string>");

  const std::string& path() const { return path_; }
  bool is_map() const { return node_.IsMap(); }
  bool has_value() const { return node_.IsDefined() && !node_.IsNull(); }
  bool has(const std::string& key) const { return node_.IsMap() && node_[key] && !node_[key].IsNull(); }
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // The child map at key (an empty map when absent; a problem when present and not a map).
  ConfigNode child(const std::string& key) const;
  // The maps of the list at key (path key[i]); a non-list or non-map element is a problem.
  std::vector<ConfigNode> list(const std::string& key) const;

  std::string str(const std::string& key, const std::string& def) const;
  // A string that must be one of `allowed`.
  std::string choice(const std::string& key, const std::string& def, std::initializer_list<const char*> allowed) const;
  int64_t integer(const std::string& key, int64_t def, int64_t min, int64_t max) const;
  double number(const std::string& key, double def, Interval range = {}) const;
  bool boolean(const std::string& key, bool def) const;
  std::vector<int64_t> integers(const std::string& key, const std::vector<int64_t>& def, int64_t min,
                                int64_t max) const;
  std::vector<std::string> strings(const std::string& key, const std::vector<std::string>& def) const;
  std::map<std::string, std::string> string_map(const std::string& key) const;
  // Byte sizes, as Kubernetes quantities without sign: 123, "64Mi", "1Gi", "10G", "1.5T".
  int64_t bytes(const std::string& key, int64_t def) const;
  // CPU cores: 2, "1.5", "500m".
  double cpu(const std::string& key, double def) const;

  // Records a problem for each key not in `known`.
  void allow_only(std::initializer_list<const char*> known) const;
  // Records a problem at field(key) (at this node's path when key is empty).
  void problem(const std::string& key, const std::string& reason) const;
  const std::vector<FieldProblem>& problems() const { return *problems_; }
  // Throws ConfigError listing every problem recorded so far, if there is any.
  void raise_problems() const;

 private:
  ConfigNode(YAML::Node node, std::string path, std::shared_ptr<std::vector<FieldProblem>> problems)
      : node_(std::move(node)), path_(std::move(path)), problems_(std::move(problems)) {}
  // A Kubernetes quantity at key matching `form` (groups 1: the number, 3: the unit); false, with a
  // problem, when it does not (a wrong unit is told with the `units` that are right).
  bool quantity(const std::string& key, const std::regex& form, const char* example, const char* units,
                std::string* number, std::string* unit) const;
  // The scalar at key, or nothing (with a problem) when it is not a scalar.
  const YAML::Node* scalar(const std::string& key, const char* what, YAML::Node* out) const;
  YAML::Node node_;
  std::string path_;
  std::shared_ptr<std::vector<FieldProblem>> problems_;
};

}  // namespace tessera
