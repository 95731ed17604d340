#include "worker/train/job_config.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

JobConfig parse(const std::string& yaml) { return parse_job_config(ConfigNode::load_string(yaml)); }

std::string field_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.field();
  }
  return "accepted";
}

TEST(JobConfigTest, ManifestAndDefaults) {
  JobConfig j = parse(R"(
apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata: {name: demo}
spec:
  replicas: 2
  model: {name: cosmoflow, inputSize: 32}
  training: {epochs: 3, batchSize: 16, optimizer: {name: adam, learningRate: 0.002}, schedule: {decay: cosine, warmupEpochs: 1}}
  communication: {strategy: hybrid, density: 0.001, switchAtEpoch: 2, bucketSize: 4Mi}
  checkpoint: {path: /tmp/x, everySteps: 50}
)");
  EXPECT_EQ(j.name, "demo");
  EXPECT_EQ(j.model.input_size, 32);
  EXPECT_EQ(j.dataset.kind, "cosmo");
  EXPECT_EQ(j.dataset.size, 32);
  EXPECT_EQ(j.training.epochs, 3);
  EXPECT_EQ(j.training.optimizer.name, "adam");
  EXPECT_DOUBLE_EQ(j.training.schedule.base_lr, 0.002);
  EXPECT_EQ(j.communication.sparse, "hitopk");
  EXPECT_EQ(j.communication.dense, "torus");
  EXPECT_EQ(j.communication.bucket_bytes, 4 << 20);
  EXPECT_EQ(j.checkpoint.every_steps, 50);
  JobConfig bare = parse("model: {name: unet3d, inputSize: 16}\n");
  EXPECT_EQ(bare.dataset.kind, "shapes");
}

TEST(JobConfigTest, EveryMistakeNamesItsField) {
  EXPECT_EQ(field_of("model: {name: resnet}"), "model.name");
  EXPECT_EQ(field_of("model: {name: cosmoflow, inputSize: 48}"), "model.inputSize");
  EXPECT_EQ(field_of("model: {inputSize: abc}"), "model.inputSize");
  EXPECT_EQ(field_of("training: {batchSize: 0}"), "training.batchSize");
  EXPECT_EQ(field_of("training: {bachSize: 4}"), "training.bachSize");
  EXPECT_EQ(field_of("training: {optimizer: {name: rmsprop}}"), "training.optimizer.name");
  EXPECT_EQ(field_of("training: {optimizer: {learningRate: -1}}"), "training.optimizer.learningRate");
  EXPECT_EQ(field_of("training: {schedule: {decay: linear}}"), "training.schedule.decay");
  EXPECT_EQ(field_of("communication: {strategy: ring}"), "communication.strategy");
  EXPECT_EQ(field_of("communication: {strategy: hybrid, sparse: torus}"), "communication.sparse");
  EXPECT_EQ(field_of("communication: {density: 2}"), "communication.density");
  EXPECT_EQ(field_of("communication: {strategy: hybrid, switchAtEpoch: 5}"), "communication.switchAtEpoch");
  EXPECT_EQ(field_of("communication: {bucketSize: 12 parsecs}"), "communication.bucketSize");
  EXPECT_EQ(field_of("dataset: {format: parquet}"), "dataset.format");
  EXPECT_EQ(field_of("model: {name: cnn2d, inputSize: 16}\nparallelism: {spatial: {d: 2}}"), "parallelism.spatial");
  EXPECT_EQ(field_of("parallelism: {spatial: {d: 0}}"), "parallelism.spatial.d");
  EXPECT_EQ(field_of("parallelism: {spatial: {d: 2, depth: 2}}"), "parallelism.spatial.depth");
  EXPECT_EQ(parse("parallelism: {spatial: {d: 2, h: 2}, data: 3}").model.spatial.size(), 4);
  EXPECT_EQ(field_of("kind: Pod\nspec: {}"), "kind");
  EXPECT_EQ(field_of("model: [1, 2]"), "model");
  EXPECT_EQ(field_of("spec:\n  training: {epochs: -3}"), "spec.training.epochs");
}

TEST(JobConfigTest, YamlSyntaxErrorsNameLineAndColumn) {
  try {
    ConfigNode::load_string("model: {name: cosmoflow\ntraining: [", "job.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "job.yaml");
    EXPECT_NE(std::string(e.what()).find("line"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera
