// A stored TrainingJob parsed from its JSON (controller/reconcile/manifest.h) as the API parses its
// YAML text: the same spec, the same problems at the same fields.
#include "controller/reconcile/manifest.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "common/config_node.h"

namespace tessera::reconcile {
namespace {

const char* kHead =
    "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: cosmo, namespace: ml}\nspec:\n";

std::string problems(const api::ParsedJob& p) {
  std::string out;
  for (const auto& f : p.problems) out += f.field + ": " + f.reason + "\n";
  return out;
}

// The manifest parsed from its text, and through the JSON the API server would store.
std::pair<api::ParsedJob, api::ParsedJob> both(const std::string& spec) {
  const std::string text = kHead + spec;
  return {api::parse_training_job(ConfigNode::load_string(text, "job")), parse_job(yaml_to_json(YAML::Load(text)))};
}

TEST(ManifestTest, ValidJobParsesAsItsText) {
  const auto [text, stored] = both(
      "  replicas: 4\n  ranksPerReplica: 2\n  model: {name: cosmoflow, inputSize: 16, hidden: [32, 16]}\n"
      "  dataset: {format: synthetic, samples: 512}\n  training: {epochs: 3, batchSize: 8, optimizer: {name: adam, "
      "learningRate: 0.001}}\n  communication: {strategy: hybrid, sparse: hitopk, dense: torus, density: 0.05}\n"
      "  checkpoint: {path: /ckpt, everySteps: 10}\n  runPolicy: {backoffLimit: 3, suspend: false}\n");
  ASSERT_EQ(problems(text), "");
  ASSERT_EQ(problems(stored), "");
  EXPECT_EQ(stored.job.name, "cosmo");
  EXPECT_EQ(stored.job.spec.replicas, 4);
  EXPECT_EQ(stored.job.spec.model.hidden, (std::vector<int64_t>{32, 16}));
  EXPECT_DOUBLE_EQ(stored.job.spec.training.optimizer.learning_rate, 0.001);
  EXPECT_DOUBLE_EQ(stored.job.spec.communication.density, text.job.spec.communication.density);
  EXPECT_EQ(stored.job.spec.checkpoint.every_steps, 10);
  EXPECT_FALSE(stored.job.spec.run_policy.suspend);
}

TEST(ManifestTest, AStringWhereANumberBelongsIsNamedAsInTheText) {
  // A quoted "4" is stored as a JSON string: a string, not the number, in both readings.
  const auto [text, stored] = both("  replicas: \"4\"\n  model: {name: cosmoflow}\n  dataset: {format: synthetic}\n");
  ASSERT_NE(problems(text), "");
  EXPECT_EQ(problems(stored), problems(text));
  EXPECT_NE(problems(stored).find("spec.replicas"), std::string::npos) << problems(stored);
  EXPECT_NE(problems(stored).find("the string '4'"), std::string::npos) << problems(stored);
}

TEST(ManifestTest, NullAndBooleansKeepTheirMeaning) {
  const auto [text, stored] = both(
      "  replicas: 2\n  model: {name: cosmoflow}\n  dataset: {format: synthetic}\n"
      "  elastic: null\n  runPolicy: {suspend: true, restartInPlace: \"yes\"}\n");
  EXPECT_EQ(problems(stored), problems(text));
  EXPECT_TRUE(stored.job.spec.run_policy.suspend);
}

}  // namespace
}  // namespace tessera::reconcile
