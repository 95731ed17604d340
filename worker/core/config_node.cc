#include "worker/core/config_node.h"

#include <cmath>
#include <set>

namespace tessera {
namespace {

// The number at the start of s (std::stod), and how many characters it took (0: none).
double leading_number(const std::string& s, size_t* used) {
  *used = 0;
  try {
    return std::stod(s, used);
  } catch (const std::exception&) {
    *used = 0;
    return 0;
  }
}

}  // namespace

ConfigNode ConfigNode::load_file(const std::string& file) {
  try {
    return ConfigNode(YAML::LoadFile(file), "");
  } catch (const YAML::BadFile&) {
    throw ConfigError(file, "cannot read the file");
  } catch (const YAML::Exception& e) {
    throw ConfigError(file, detail::concat("YAML error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  }
}

ConfigNode ConfigNode::load_string(const std::string& text, const std::string& name) {
  try {
    return ConfigNode(YAML::Load(text), "");
  } catch (const YAML::Exception& e) {
    throw ConfigError(name, detail::concat("YAML error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  }
}

ConfigNode ConfigNode::child(const std::string& key) const {
  if (!has(key)) return ConfigNode(YAML::Node(YAML::NodeType::Map), field(key));
  YAML::Node n = node_[key];
  if (!n.IsMap()) throw ConfigError(field(key), "expected a mapping");
  return ConfigNode(n, field(key));
}

YAML::Node ConfigNode::scalar(const std::string& key, const char* what) const {
  YAML::Node n = node_[key];
  if (!n.IsScalar()) throw ConfigError(field(key), std::string("expected ") + what);
  return n;
}

std::string ConfigNode::str(const std::string& key, const std::string& def) const {
  if (!has(key)) return def;
  return scalar(key, "a string").Scalar();
}

int64_t ConfigNode::integer(const std::string& key, int64_t def, int64_t min, int64_t max) const {
  if (!has(key)) return def;
  const std::string s = scalar(key, "an integer").Scalar();
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || s.empty()) throw ConfigError(field(key), "expected an integer, got '" + s + "'");
  if (v < min || v > max) throw ConfigError(field(key), detail::concat(v, " is outside [", min, ", ", max, "]"));
  return v;
}

double ConfigNode::number(const std::string& key, double def) const {
  if (!has(key)) return def;
  const std::string s = scalar(key, "a number").Scalar();
  size_t used = 0;
  const double v = leading_number(s, &used);
  if (used != s.size() || s.empty() || !std::isfinite(v)) throw ConfigError(field(key), "expected a number, got '" + s + "'");
  return v;
}

bool ConfigNode::boolean(const std::string& key, bool def) const {
  if (!has(key)) return def;
  const std::string s = scalar(key, "true or false").Scalar();
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  throw ConfigError(field(key), "expected true or false, got '" + s + "'");
}

std::vector<int64_t> ConfigNode::integers(const std::string& key, const std::vector<int64_t>& def) const {
  if (!has(key)) return def;
  YAML::Node n = node_[key];
  if (!n.IsSequence()) throw ConfigError(field(key), "expected a list of integers");
  std::vector<int64_t> out;
  for (size_t i = 0; i < n.size(); ++i) {
    YAML::Node wrap(YAML::NodeType::Map);
    wrap["v"] = n[i];
    out.push_back(ConfigNode(wrap, detail::concat(field(key), "[", i, "]")).integer("v", 0, INT64_MIN, INT64_MAX));
  }
  return out;
}

int64_t ConfigNode::bytes(const std::string& key, int64_t def) const {
  if (!has(key)) return def;
  const std::string s = scalar(key, "a size").Scalar();
  size_t used = 0;
  const double v = leading_number(s, &used);
  const std::string unit = s.substr(used);
  static const std::pair<const char*, double> units[] = {
      {"", 1}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
  for (const auto& [name, mult] : units)
    if (used > 0 && unit == name && v >= 0) return static_cast<int64_t>(v * mult);
  throw ConfigError(field(key), "expected a size such as 512Mi or 10G, got '" + s + "'");
}

void ConfigNode::allow_only(std::initializer_list<const char*> known) const {
  if (!node_.IsMap()) return;
  std::set<std::string> ok(known.begin(), known.end());
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (!ok.count(k)) {
      std::string list;
      for (const char* s : known) list += (list.empty() ? "" : ", ") + std::string(s);
      throw ConfigError(field(k), "unknown field (known: " + list + ")");
    }
  }
}

}  // namespace tessera
