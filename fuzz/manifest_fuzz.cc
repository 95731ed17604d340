// A TrainingJob manifest as YAML text: it parses and validates, or every problem is a field path
// (empty for the document itself) with a reason. A valid job becomes the worker's configuration
// (make_job_config, which builds the model once with tensors that hold no storage, so a model of any
// size is checked without allocating it); anything else that escapes (another exception, a crash, a
// hang, an allocation past the fuzzer's limit) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/training_job.h"
#include "common/config_node.h"
#include "common/error.h"
#include "worker/train/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ConfigNode root = ConfigNode::load_string(text, "manifest");
    const api::ParsedJob parsed = api::parse_training_job(root);
    for (const auto& p : parsed.problems)
      if (p.reason.empty())
        __builtin_trap();  // every problem has a reason (the field is empty for the document itself)
    if (parsed.ok()) make_job_config(parsed.job);
  } catch (const ConfigError& e) {
    for (const auto& p : e.problems())
      if (p.reason.empty()) __builtin_trap();
  }
  return 0;
}
