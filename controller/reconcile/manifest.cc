#include "controller/reconcile/manifest.h"

#include <yaml-cpp/yaml.h>

#include <regex>

#include "common/config_node.h"

namespace tessera::reconcile {
namespace {

YAML::Node to_yaml(const json& j) {
  YAML::Node n;
  switch (j.type()) {
    case json::value_t::object:
      n = YAML::Node(YAML::NodeType::Map);
      for (auto it = j.begin(); it != j.end(); ++it) n[it.key()] = to_yaml(it.value());
      return n;
    case json::value_t::array:
      n = YAML::Node(YAML::NodeType::Sequence);
      for (const json& e : j) n.push_back(to_yaml(e));
      return n;
    case json::value_t::string:
      n = YAML::Node(j.get<std::string>());
      n.SetTag("!");  // as a quoted scalar: a string, whatever it spells
      return n;
    case json::value_t::null: return YAML::Node(YAML::NodeType::Null);
    default:  // numbers and booleans, as JSON writes them
      return YAML::Node(j.dump());
  }
}

}  // namespace

json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = yaml_to_json(it->second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (const auto& e : n) a.push_back(yaml_to_json(e));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string v = n.Scalar();
      if (n.Tag() == "!") return v;
      static const std::regex integer("[-+]?[0-9]+"), real("[-+]?([0-9]*\\.[0-9]+|[0-9]+\\.?[0-9]*)([eE][-+]?[0-9]+)?");
      if (v == "true" || v == "True") return true;
      if (v == "false" || v == "False") return false;
      if (v == "null" || v == "~") return nullptr;
      try {
        if (std::regex_match(v, integer)) return std::stoll(v);
        if (std::regex_match(v, real)) return std::stod(v);
      } catch (const std::exception&) {
      }
      return v;
    }
    default: return nullptr;
  }
}

api::ParsedJob parse_job(const json& job) { return api::parse_training_job(ConfigNode(to_yaml(job))); }

}  // namespace tessera::reconcile
