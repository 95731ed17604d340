// ConfigNode: typed, path-aware reads of a YAML document (yaml-cpp). Every error is a ConfigError
// whose field is the full path ("spec.training.batchSize") and whose reason says what was expected
// and what was found; unknown keys are errors too, so a misspelt field never becomes a silent default.
#pragma once

#include <yaml-cpp/yaml.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "worker/core/error.h"

namespace tessera {

class ConfigNode {
 public:
  ConfigNode(YAML::Node node, std::string path) : node_(std::move(node)), path_(std::move(path)) {}
  // Parses a file; YAML syntax errors name the file, line and column.
  static ConfigNode load_file(const std::string& file);
  static ConfigNode load_string(const std::string& text, const std::string& name = "<string>");

  const std::string& path() const { return path_; }
  bool has(const std::string& key) const { return node_.IsMap() && node_[key] && !node_[key].IsNull(); }
  // The child map at key (an empty map when absent); a present non-map is an error.
  ConfigNode child(const std::string& key) const;
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  std::string str(const std::string& key, const std::string& def) const;
  int64_t integer(const std::string& key, int64_t def, int64_t min, int64_t max) const;
  double number(const std::string& key, double def) const;
  bool boolean(const std::string& key, bool def) const;
  std::vector<int64_t> integers(const std::string& key, const std::vector<int64_t>& def) const;
  // Byte sizes: 123, "64Mi", "1Gi", "10G", "512K".
  int64_t bytes(const std::string& key, int64_t def) const;

  // Throws ConfigError for the first key not in `known`.
  void allow_only(std::initializer_list<const char*> known) const;

 private:
  YAML::Node scalar(const std::string& key, const char* what) const;
  YAML::Node node_;
  std::string path_;
};

}  // namespace tessera
