#include "common/config_node.h"

#include <filesystem>
#include <ios>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace tessera {
namespace {

// YAML 1.2 core schema: how a plain (unquoted) scalar resolves.
const std::regex kInt("[-+]?[0-9]+");
const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
const std::regex kBool("true|True|TRUE|false|False|FALSE");
// Kubernetes quantities without a sign, and CPU (cores or millicores).
const std::regex kBytes("([0-9]+(\\.[0-9]+)?)([KMGTPE]i?)?");
const std::regex kCpu("([0-9]+(\\.[0-9]+)?)(m?)");

bool quoted(const YAML::Node& n) { return n.Tag() == "!"; }

std::string describe(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  const std::string& s = n.Scalar();
  if (quoted(n)) return "the string '" + s + "'";
  if (std::regex_match(s, kInt) || std::regex_match(s, kFloat)) return "the number " + s;
  if (std::regex_match(s, kBool)) return "the boolean " + s;
  return "'" + s + "'";
}

std::string fmt(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// A key given twice in one mapping is reported at its path (YAML parsers keep one of the two, so
// the other would be dropped without a word).
void find_duplicate_keys(const YAML::Node& n, const std::string& path, std::vector<FieldProblem>& out) {
  if (n.IsMap()) {
    std::map<std::string, int> line;
    for (const auto& kv : n) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const std::string at = path.empty() ? key : path + "." + key;
      const int here = kv.first.Mark().line + 1;
      auto [first, fresh] = line.emplace(key, here);
      if (!fresh) {
        out.push_back({at, detail::concat("is given twice (lines ", first->second, " and ", here, "); keep one")});
      } else {
        find_duplicate_keys(kv.second, at, out);
      }
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) find_duplicate_keys(n[i], detail::concat(path, "[", i, "]"), out);
  }
}

}  // namespace

std::string Interval::str() const {
  return (lo_open || std::isinf(lo) ? "(" : "[") + (std::isinf(lo) ? std::string("-inf") : fmt(lo)) + ", " +
         (std::isinf(hi) ? std::string("inf") : fmt(hi)) + (hi_open || std::isinf(hi) ? ")" : "]");
}

ConfigNode::ConfigNode(YAML::Node node)
    : node_(std::move(node)), problems_(std::make_shared<std::vector<FieldProblem>>()) {
  find_duplicate_keys(node_, "", *problems_);
}

ConfigNode ConfigNode::load_file(const std::string& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) throw ConfigError(file, "is a directory, not a manifest file");
  if (!std::filesystem::exists(file, ec)) throw ConfigError(file, "no such file");
  // A manifest is a Kubernetes object: the API server stores at most about 1.5 MiB of one.
  constexpr uintmax_t kMaxManifestBytes = uintmax_t{1} << 20;
  const uintmax_t bytes = std::filesystem::file_size(file, ec);
  if (!ec && bytes > kMaxManifestBytes)
    throw ConfigError(file,
                      detail::concat(bytes, " bytes: larger than a manifest can be (at most ", kMaxManifestBytes, ")"));
  try {
    return ConfigNode(YAML::LoadFile(file));
  } catch (const YAML::BadFile&) {
    throw ConfigError(file, "cannot read the file");
  } catch (const YAML::Exception& e) {
    throw ConfigError(
        file, detail::concat("YAML error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  } catch (const std::ios_base::failure& e) {
    throw ConfigError(file, std::string("cannot read the file: ") + e.what());
  }
}

ConfigNode ConfigNode::load_string(const std::string& text, const std::string& name) {
  try {
    return ConfigNode(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(
        name, detail::concat("YAML error at line ", e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  }
}

void ConfigNode::problem(const std::string& key, const std::string& reason) const {
  problems_->push_back({key.empty() ? path_ : field(key), reason});
}

void ConfigNode::raise_problems() const {
  if (!problems_->empty()) throw ConfigError(*problems_);
}

ConfigNode ConfigNode::child(const std::string& key) const {
  if (has(key)) {
    YAML::Node n = node_[key];
    if (n.IsMap()) return ConfigNode(n, field(key), problems_);
    problem(key, "expected a mapping, got " + describe(n));
  }
  return ConfigNode(YAML::Node(YAML::NodeType::Map), field(key), problems_);
}

std::vector<ConfigNode> ConfigNode::list(const std::string& key) const {
  std::vector<ConfigNode> out;
  if (!has(key)) return out;
  YAML::Node n = node_[key];
  if (!n.IsSequence()) {
    problem(key, "expected a list, got " + describe(n));
    return out;
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = detail::concat(field(key), "[", i, "]");
    if (n[i].IsMap()) out.push_back(ConfigNode(n[i], path, problems_));
    else problems_->push_back({path, "expected a mapping, got " + describe(n[i])});
  }
  return out;
}

const YAML::Node* ConfigNode::scalar(const std::string& key, const char* what, YAML::Node* out) const {
  *out = node_[key];
  if (out->IsScalar()) return out;
  problem(key, std::string("expected ") + what + ", got " + describe(*out));
  return nullptr;
}

std::string ConfigNode::str(const std::string& key, const std::string& def) const {
  if (!has(key)) return def;
  YAML::Node n;
  if (!scalar(key, "a string", &n)) return def;
  const std::string& s = n.Scalar();
  if (!quoted(n) && (std::regex_match(s, kInt) || std::regex_match(s, kFloat) || std::regex_match(s, kBool))) {
    problem(key, "expected a string, got " + describe(n) + " (quote it)");
    return def;
  }
  return s;
}

std::string ConfigNode::choice(const std::string& key, const std::string& def,
                               std::initializer_list<const char*> allowed) const {
  if (!has(key)) return def;
  const size_t before = problems_->size();
  std::string v = str(key, def);
  if (problems_->size() != before) return def;
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return v;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  problem(key, "'" + v + "' is not one of: " + list);
  return def;
}

int64_t ConfigNode::integer(const std::string& key, int64_t def, int64_t min, int64_t max) const {
  if (!has(key)) return def;
  YAML::Node n;
  if (!scalar(key, "an integer", &n)) return def;
  const std::string& s = n.Scalar();
  if (quoted(n) || !std::regex_match(s, kInt)) {
    problem(key, "expected an integer, got " + describe(n));
    return def;
  }
  long long v = 0;
  try {
    v = std::stoll(s);
  } catch (const std::exception&) {
    problem(key, s + " is out of range");
    return def;
  }
  if (v < min || v > max) {
    // A bound no one would write (the type's limit) is left out of the message.
    const bool no_max = max >= std::numeric_limits<int32_t>::max(), no_min = min <= std::numeric_limits<int32_t>::min();
    if (v < min && no_max) {
      problem(key, min == 0 ? detail::concat("must not be negative, got ", v)
                            : detail::concat("must be at least ", min, ", got ", v));
    } else if (v > max && no_min) {
      problem(key, detail::concat("must be at most ", max, ", got ", v));
    } else {
      problem(key, detail::concat(v, " is outside [", min, ", ", max, "]"));
    }
    return def;
  }
  return v;
}

double ConfigNode::number(const std::string& key, double def, Interval range) const {
  if (!has(key)) return def;
  YAML::Node n;
  if (!scalar(key, "a number", &n)) return def;
  const std::string& s = n.Scalar();
  if (quoted(n) || !(std::regex_match(s, kInt) || std::regex_match(s, kFloat))) {
    problem(key, "expected a number, got " + describe(n));
    return def;
  }
  const double v = n.as<double>();
  if (!std::isfinite(v)) {
    problem(key, "expected a finite number, got " + s);
    return def;
  }
  if (!range.contains(v)) {
    problem(key, s + " is outside " + range.str());
    return def;
  }
  return v;
}

bool ConfigNode::boolean(const std::string& key, bool def) const {
  if (!has(key)) return def;
  YAML::Node n;
  if (!scalar(key, "true or false", &n)) return def;
  const std::string& s = n.Scalar();
  if (quoted(n) || !std::regex_match(s, kBool)) {
    problem(key, "expected true or false, got " + describe(n));
    return def;
  }
  return s[0] == 't' || s[0] == 'T';
}

std::vector<int64_t> ConfigNode::integers(const std::string& key, const std::vector<int64_t>& def, int64_t min,
                                          int64_t max) const {
  if (!has(key)) return def;
  YAML::Node n = node_[key];
  if (!n.IsSequence()) {
    problem(key, "expected a list of integers, got " + describe(n));
    return def;
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < n.size(); ++i) {
    YAML::Node wrap(YAML::NodeType::Map);
    wrap["v"] = n[i];
    ConfigNode item(wrap, "", problems_);
    item.path_ = detail::concat(field(key), "[", i, "]");
    // Reads under the name "v" report the list element's own path.
    const size_t before = problems_->size();
    const int64_t v = item.integer("v", 0, min, max);
    for (size_t p = before; p < problems_->size(); ++p) (*problems_)[p].field = item.path_;
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> ConfigNode::strings(const std::string& key, const std::vector<std::string>& def) const {
  if (!has(key)) return def;
  YAML::Node n = node_[key];
  if (!n.IsSequence()) {
    problem(key, "expected a list of strings, got " + describe(n));
    return def;
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = detail::concat(field(key), "[", i, "]");
    if (!n[i].IsScalar()) problems_->push_back({path, "expected a string, got " + describe(n[i])});
    else out.push_back(n[i].Scalar());
  }
  return out;
}

std::map<std::string, std::string> ConfigNode::string_map(const std::string& key) const {
  std::map<std::string, std::string> out;
  if (!has(key)) return out;
  ConfigNode m = child(key);
  if (!m.node_.IsMap()) return out;
  for (auto it = m.node_.begin(); it != m.node_.end(); ++it) {
    if (!it->first.IsScalar()) {
      m.problem("", detail::concat("a key at line ", it->first.Mark().line + 1, " is not a name"));
      continue;
    }
    const std::string k = it->first.Scalar();
    const size_t before = problems_->size();
    std::string v = m.str(k, "");
    if (problems_->size() == before) out[k] = v;
  }
  return out;
}

bool ConfigNode::quantity(const std::string& key, const std::regex& form, const char* example, const char* units,
                          std::string* number, std::string* unit) const {
  YAML::Node n;
  if (!scalar(key, "a quantity", &n)) return false;
  const std::string& s = n.Scalar();
  std::smatch m;
  // As a Kubernetes int-or-string: an unquoted number must be an integer.
  if (!quoted(n) && std::regex_match(s, kFloat) && !std::regex_match(s, kInt)) {
    problem(key, std::string("expected an integer or a string such as ") + example + ", got " + describe(n) +
                     " (quote a fractional quantity)");
    return false;
  }
  if (!std::regex_match(s, m, form)) {
    static const std::regex kNumberAndUnit("[0-9]+(\\.[0-9]+)?([A-Za-z]+)");
    std::smatch u;
    if (s.size() > 1 && s[0] == '-' && std::regex_match(s.substr(1), form)) {
      problem(key, s + ": must not be negative");
    } else if (std::regex_match(s, u, kNumberAndUnit)) {
      problem(key,
              "'" + s + "': " + u[2].str() + " is not a unit of this quantity; use " + units + ", as in " + example);
    } else {
      problem(key, std::string("expected an integer or a string such as ") + example + ", got " + describe(n));
    }
    return false;
  }
  *number = m[1].str();
  *unit = m[3].str();
  return true;
}

std::optional<double> parse_quantity(const std::string& q) {
  // Read by hand (no std::regex): the controller parses every node's and pod's quantities often.
  static const std::map<std::string, double> units = {{"", 1},
                                                      {"m", 1e-3},
                                                      {"k", 1e3},
                                                      {"K", 1e3},
                                                      {"M", 1e6},
                                                      {"G", 1e9},
                                                      {"T", 1e12},
                                                      {"P", 1e15},
                                                      {"E", 1e18},
                                                      {"Ki", 1024.0},
                                                      {"Mi", 1048576.0},
                                                      {"Gi", 1073741824.0},
                                                      {"Ti", 1099511627776.0},
                                                      {"Pi", 1125899906842624.0},
                                                      {"Ei", 1152921504606846976.0}};
  size_t i = 0, digits = 0;
  while (i < q.size() && std::isdigit(static_cast<unsigned char>(q[i]))) ++i, ++digits;
  if (i < q.size() && q[i] == '.')
    for (++i; i < q.size() && std::isdigit(static_cast<unsigned char>(q[i])); ++i) ++digits;
  if (digits == 0) return std::nullopt;
  const auto unit = units.find(q.substr(i));
  if (unit == units.end()) return std::nullopt;
  return std::stod(q.substr(0, i)) * unit->second;
}

int64_t ConfigNode::bytes(const std::string& key, int64_t def) const {
  std::string number, unit;
  if (!has(key) || !quantity(key, kBytes, "512Mi or 10G",
                             "Ki, Mi, Gi, Ti (powers of 1024) or K, M, G, T (powers of 1000)", &number, &unit))
    return def;
  const double v = *parse_quantity(number + unit);
  if (v >= 9.2e18) {
    problem(key, number + unit + " is too large");
    return def;
  }
  return static_cast<int64_t>(v);
}

double ConfigNode::cpu(const std::string& key, double def) const {
  std::string number, unit;
  if (!has(key) || !quantity(key, kCpu, "\"1.5\" or 500m", "m (thousandths of a core)", &number, &unit)) return def;
  return *parse_quantity(number + unit);
}

void ConfigNode::allow_only(std::initializer_list<const char*> known) const {
  if (!node_.IsMap()) return;
  std::set<std::string> ok(known.begin(), known.end());
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (!it->first.IsScalar()) {
      problem("", detail::concat("a key at line ", it->first.Mark().line + 1, " is not a field name (a ",
                                 it->first.IsMap()        ? "mapping"
                                 : it->first.IsSequence() ? "list"
                                                          : "null",
                                 ")"));
      continue;
    }
    const std::string k = it->first.Scalar();
    if (ok.count(k)) continue;
    std::string list;
    for (const char* s : known) list += (list.empty() ? "" : ", ") + std::string(s);
    problem(k, "unknown field (known: " + list + ")");
  }
}

}  // namespace tessera
