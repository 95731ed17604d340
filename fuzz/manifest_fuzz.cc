// A TrainingJob manifest as YAML text: it parses and validates, or every problem is a field path
// (empty for the document itself) with a reason. A valid job becomes the worker's configuration (make_job_config,
// which builds the model once) when its model is small enough to build here; anything else that
// escapes (another exception, a crash, a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/training_job.h"
#include "worker/core/config_node.h"
#include "worker/core/error.h"
#include "worker/train/job_config.h"

namespace {

// make_job_config allocates the model's parameters: only for models that fit a fuzzing process.
bool small_model(const tessera::api::ModelSpec& m) {
  if (m.input_size > 64 || m.base_channels > 32 || m.max_channels > 256 || m.in_channels > 16 || m.outputs > 1024) return false;
  for (int64_t h : m.hidden)
    if (h > 1024) return false;
  return m.hidden.size() <= 8;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ConfigNode root = ConfigNode::load_string(text, "manifest");
    const api::ParsedJob parsed = api::parse_training_job(root);
    for (const auto& p : parsed.problems)
      if (p.reason.empty()) __builtin_trap();  // every problem has a reason (the field is empty for the document itself)
    if (parsed.ok() && small_model(parsed.job.spec.model)) make_job_config(parsed.job);
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems())
      if (p.reason.empty()) __builtin_trap();
  }
  return 0;
}
