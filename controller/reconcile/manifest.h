// A TrainingJob between the JSON the API server stores and the API's parsed form, without passing
// through text: yaml_to_json reads a manifest file as the API server would store it (quoted YAML
// scalars are strings), and parse_job parses a stored job as api::parse_training_job parses its
// YAML, with the same problems named at the same fields (a JSON string is a quoted scalar, so
// `"1"` where a number belongs is "the string '1'"). Thread-safe (pure functions).
#pragma once

#include <nlohmann/json.hpp>

#include "api/training_job.h"

namespace YAML {
class Node;
}

namespace tessera::reconcile {

using json = nlohmann::json;

// A YAML document as JSON, as the API server would store it (quoted YAML scalars are strings).
json yaml_to_json(const YAML::Node& node);
// The stored job {apiVersion, kind, metadata, spec}, parsed.
api::ParsedJob parse_job(const json& job);

}  // namespace tessera::reconcile
