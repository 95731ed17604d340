// The TrainingJob API: defaults, the runtime configuration a worker builds from it, and validation
// that reports every problem with its field path (the corpus in tests/api/manifests.yaml, shared
// with the CRD schema test).
#include "api/training_job.h"

#include <gtest/gtest.h>

#include <fstream>

#include <set>

#include "testing/fork_ranks.h"
#include "worker/train/job_config.h"

namespace tessera {
namespace {

std::vector<FieldProblem> problems_of(const ConfigNode& root) {
  api::ParsedJob p = api::parse_training_job(root);
  if (!p.ok()) return p.problems;
  try {
    make_job_config(p.job);  // the model's own rules
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

std::vector<FieldProblem> problems_of(const std::string& yaml) { return problems_of(ConfigNode::load_string(yaml)); }

std::set<std::string> fields(const std::vector<FieldProblem>& problems) {
  std::set<std::string> out;
  for (const auto& p : problems) out.insert(p.field);
  return out;
}

const char* kHeader = "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: demo}\n";

TEST(TrainingJobTest, DefaultsAndTheWorkersRuntimeConfiguration) {
  api::ParsedJob p = api::parse_training_job(ConfigNode::load_string(std::string(kHeader) + R"(
spec:
  replicas: 2
  ranksPerReplica: 2
  model: {name: cosmoflow, inputSize: 32}
  dataset: {format: synthetic}
  training: {epochs: 3, batchSize: 16, optimizer: {name: adam, learningRate: 0.002}, schedule: {decay: cosine, warmupEpochs: 1}}
  parallelism: {spatial: {d: 2}}
  communication: {strategy: hybrid, density: 0.001, switchAtEpoch: 2, bucketSize: 4Mi}
  checkpoint: {path: /tmp/x, everySteps: 50}
  cache: {memory: 1.5Gi}
)"));
  ASSERT_TRUE(p.ok()) << p.problems.front().field << ": " << p.problems.front().reason;
  const api::TrainingJobSpec& s = p.job.spec;
  EXPECT_EQ(p.job.name, "demo");
  EXPECT_EQ(p.job.namespace_, "default");
  EXPECT_EQ(s.workers(), 4);
  EXPECT_EQ(s.data_replicas(), 2);
  EXPECT_EQ(s.dataset.synthetic, "cosmo");  // defaulted from the model
  EXPECT_EQ(s.local.nodes, 2);              // one virtual node per replica
  EXPECT_EQ(s.local.gpus_per_node, 2);
  EXPECT_EQ(s.local.work_dir, ".tessera/demo");
  EXPECT_EQ(s.run_policy.backoff_limit, 3);
  EXPECT_EQ(s.cache.memory_bytes, int64_t{3} << 29);

  JobConfig j = make_job_config(p.job);
  EXPECT_EQ(j.workers, 4);
  EXPECT_EQ(j.model.input_size, 32);
  EXPECT_EQ(j.model.spatial.size(), 2);
  EXPECT_EQ(j.dataset.kind, "cosmo");
  EXPECT_EQ(j.dataset.size, 32);
  EXPECT_EQ(j.training.epochs, 3);
  EXPECT_EQ(j.training.optimizer.name, "adam");
  EXPECT_DOUBLE_EQ(j.training.schedule.base_lr, 0.002);
  EXPECT_DOUBLE_EQ(j.training.warmup_epochs, 1);
  EXPECT_EQ(j.communication.sparse, "hitopk");
  EXPECT_EQ(j.communication.dense, "torus");
  EXPECT_EQ(j.communication.bucket_bytes, 4 << 20);
  EXPECT_EQ(j.checkpoint.every_steps, 50);
}

TEST(TrainingJobTest, EveryProblemIsReportedAtOnce) {
  auto got = fields(problems_of(R"(
apiVersion: tessera.dev/v1
kind: TrainingJob
metadata: {name: Bad_Name}
spec:
  replicas: 2
  ranksPerReplica: "2"
  training: {epochs: 3, bachSize: 3, optimizer: {learningRate: -1}}
  parallelism: {spatial: {d: 3}}
  communication: {strategy: hybrid, switchAtEpoch: 3, density: 0}
)"));
  const std::set<std::string> want = {"apiVersion",
                                      "metadata.name",
                                      "spec.dataset",
                                      "spec.ranksPerReplica",
                                      "spec.training.bachSize",
                                      "spec.training.optimizer.learningRate",
                                      "spec.communication.density",
                                      "spec.parallelism.spatial.d",
                                      "spec.communication.switchAtEpoch"};
  EXPECT_EQ(got, want);
}

// A key given twice is reported at its path, in a list item as well, instead of one value
// silently winning.
// Valid fields that have no effect where they stand are warnings with their path and why; the job
// stays valid, and a job that uses them where they act has none.
TEST(TrainingJobTest, FieldsWithNoEffectAreWarnings) {
  const std::string head = "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: w}\nspec:\n";
  const api::ParsedJob p =
      api::parse_training_job(ConfigNode::load_string(
          head + "  communication: {strategy: dense, sparse: topk, switchAtEpoch: 1, density: 0.01}\n"
                 "  training: {epochs: 3, schedule: {decay: cosine, gamma: 0.5, power: 2}}\n"
                 "  dataset: {format: synthetic, remoteThrottle: {mbps: 10}}\n"));
  ASSERT_TRUE(p.ok()) << p.problems.front().field << ": " << p.problems.front().reason;
  std::set<std::string> got;
  for (const auto& w : p.warnings) got.insert(w.field);
  EXPECT_EQ(got, (std::set<std::string>{"spec.communication.sparse", "spec.communication.switchAtEpoch",
                                        "spec.communication.density", "spec.training.schedule.gamma",
                                        "spec.training.schedule.power", "spec.dataset.remoteThrottle"}));
  for (const auto& w : p.warnings)
    EXPECT_NE(w.reason.find("has no effect"), std::string::npos) << w.field << ": " << w.reason;
  const api::ParsedJob files = api::parse_training_job(
      ConfigNode::load_string(head + "  dataset: {format: hdf5, path: /d, samples: 10, seed: 3}\n"));
  ASSERT_EQ(files.warnings.size(), 2u);
  EXPECT_EQ(files.warnings[0].field, "spec.dataset.samples");
  const api::ParsedJob clean =
      api::parse_training_job(ConfigNode::load_string(
          head + "  communication: {strategy: hybrid, sparse: topk, switchAtEpoch: 1, density: 0.01}\n"
                 "  training: {epochs: 3, schedule: {decay: step, milestones: [2], gamma: 0.5}}\n  dataset: {format: "
                 "synthetic}\n"));
  EXPECT_TRUE(clean.ok());
  EXPECT_TRUE(clean.warnings.empty()) << clean.warnings.front().field;
}

// strategy auto: the controller chooses; a sparse phase may reach switchAtEpoch, by default half the
// epochs; sparse and dense are its to choose, so given they have no effect.
TEST(TrainingJobTest, AutoLeavesTheLastHalfOfTheEpochsDenseByDefault) {
  const std::string head =
      "apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a}\nspec:\n"
      "  dataset: {format: synthetic}\n";
  auto parse = [&](const std::string& spec) { return api::parse_training_job(ConfigNode::load_string(head + spec)); };
  const api::ParsedJob seven =
      parse("  communication: {strategy: auto}\n  training: {epochs: 7, optimizer: {name: adam}}\n");
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(seven.job.spec.communication.switch_at_epoch, 3);
  EXPECT_TRUE(seven.warnings.empty());
  // the default (no strategy named) is auto
  EXPECT_EQ(parse("  training: {epochs: 7}\n").job.spec.communication.strategy, "auto");
  // momentum applied after the exchange (lars; sgd without momentum correction): no sparse phase
  // unless switchAtEpoch allows one; sgd (the default optimizer, momentum corrected by default),
  // sgd without momentum and adamw as adam
  auto switch_epoch = [&](const std::string& optimizer, const std::string& comm = "{strategy: auto}",
                          const std::string& more = "") {
    return parse("  communication: " + comm + "\n  training: {epochs: 7, optimizer: " + optimizer + more + "}\n")
        .job.spec.communication.switch_at_epoch;
  };
  EXPECT_EQ(switch_epoch("{name: sgd}"), 3);
  EXPECT_EQ(switch_epoch("{name: sgd}", "{strategy: auto, momentumCorrection: false}"), 0);
  EXPECT_EQ(switch_epoch("{name: sgd, nesterov: true}"), 0);
  EXPECT_EQ(switch_epoch("{name: sgd}", "{strategy: auto}", ", gradClip: 1"), 0);
  EXPECT_EQ(switch_epoch("{name: lars}"), 0);
  EXPECT_EQ(switch_epoch("{name: sgd, momentum: 0}"), 3);
  EXPECT_EQ(switch_epoch("{name: adamw}"), 3);
  EXPECT_EQ(switch_epoch("{name: sgd}", "{strategy: auto, switchAtEpoch: 2}"), 2);
  EXPECT_EQ(parse("  communication: {strategy: auto}\n").job.spec.communication.switch_at_epoch,
            0);  // one epoch: none sparse
  const api::ParsedJob more = parse(
      "  communication: {strategy: auto, switchAtEpoch: 5, density: 0.001}\n  training: {epochs: 7, optimizer: {name: "
      "lars}}\n");
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more.job.spec.communication.switch_at_epoch, 5);
  EXPECT_TRUE(more.warnings.empty());
  const api::ParsedJob late = parse("  communication: {strategy: auto, switchAtEpoch: 7}\n  training: {epochs: 7}\n");
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.problems.front().field, "spec.communication.switchAtEpoch");
  EXPECT_NE(late.problems.front().reason.find("is not before the last epoch"), std::string::npos)
      << late.problems.front().reason;
  const api::ParsedJob chosen = parse("  communication: {strategy: auto, sparse: topk, dense: dense}\n");
  ASSERT_TRUE(chosen.ok());
  std::set<std::string> got;
  for (const auto& w : chosen.warnings) {
    got.insert(w.field);
    EXPECT_NE(w.reason.find("the controller chooses"), std::string::npos) << w.reason;
  }
  EXPECT_EQ(got, (std::set<std::string>{"spec.communication.sparse", "spec.communication.dense"}));
}

// A synthetic job with these communication and training sections.
api::ParsedJob parse_sections(const std::string& comm, const std::string& training) {
  return api::parse_training_job(
      ConfigNode::load_string("apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: a}\nspec:\n"
                              "  dataset: {format: synthetic}\n  communication: " +
                              comm + "\n  training: " + training + "\n"));
}

// communication.gradientPrecision: the training precision unless set.
TEST(TrainingJobTest, GradientPrecisionDefaultsToTheTrainingPrecision) {
  auto wire = [](const std::string& comm, const std::string& training) {
    return parse_sections(comm, training).job.spec.communication.gradient_precision;
  };
  EXPECT_EQ(wire("{}", "{}"), "fp32");
  EXPECT_EQ(wire("{}", "{precision: bf16}"), "bf16");
  EXPECT_EQ(wire("{gradientPrecision: fp32}", "{precision: bf16}"), "fp32");
  EXPECT_EQ(wire("{gradientPrecision: bf16}", "{precision: fp32}"), "bf16");
}

// communication.momentumCorrection: on by default where sgd with momentum may exchange sparsely; set,
// it is refused (named, with the reason) where it cannot keep SGD's momentum.
TEST(TrainingJobTest, MomentumCorrectionDefaultsAndLimits) {
  const auto parse = parse_sections;
  auto corrected = [&](const std::string& comm, const std::string& training) {
    const api::ParsedJob p = parse(comm, training);
    EXPECT_TRUE(p.ok()) << comm << " " << training;
    return p.job.spec.communication.momentum_correction;
  };
  for (const char* s : {"hitopk", "topk", "hybrid", "auto"})
    EXPECT_TRUE(corrected(std::string("{strategy: ") + s + "}", "{epochs: 4}")) << s;
  EXPECT_FALSE(corrected("{strategy: torus}", "{epochs: 4}"));  // every entry sent: nothing to correct
  EXPECT_FALSE(corrected("{strategy: hitopk}", "{optimizer: {name: sgd, momentum: 0}}"));
  EXPECT_FALSE(corrected("{strategy: hitopk}", "{optimizer: {name: adamw}}"));
  EXPECT_FALSE(corrected("{strategy: hitopk}", "{optimizer: {name: lars}}"));
  EXPECT_FALSE(corrected("{strategy: hitopk}", "{optimizer: {name: sgd, nesterov: true}}"));
  EXPECT_FALSE(corrected("{strategy: hitopk}", "{gradClip: 1}"));
  EXPECT_FALSE(corrected("{strategy: hitopk, momentumCorrection: false}", "{epochs: 4}"));
  const api::ParsedJob dense = parse("{strategy: dense, momentumCorrection: true}", "{epochs: 4}");
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(dense.job.spec.communication.momentum_correction);
  ASSERT_EQ(dense.warnings.size(), 1u);
  EXPECT_EQ(dense.warnings[0].field, "spec.communication.momentumCorrection");
  for (const auto& [training, why] : std::vector<std::pair<std::string, std::string>>{
           {"{optimizer: {name: lars}}", "LARS scales each layer"},
           {"{optimizer: {name: adam}}", "applies to optimizer sgd, not adam"},
           {"{optimizer: {name: sgd, momentum: 0}}", "no momentum to keep"},
           {"{optimizer: {name: sgd, nesterov: true}}", "Nesterov"},
           {"{gradClip: 0.5}", "gradClip"}}) {
    const api::ParsedJob p = parse("{strategy: hybrid, momentumCorrection: true}", "{epochs: 4, " + training.substr(1));
    ASSERT_EQ(p.problems.size(), 1u) << training;
    EXPECT_EQ(p.problems[0].field, "spec.communication.momentumCorrection");
    EXPECT_NE(p.problems[0].reason.find(why), std::string::npos) << p.problems[0].reason;
  }
}
TEST(TrainingJobTest, DuplicateKeysAreReportedAtTheirPath) {
  auto p = problems_of(std::string(kHeader) +
                       "spec:\n  replicas: 2\n  replicas: 3\n"
                       "  placement: {tolerations: [{key: a, key: b, operator: Exists}]}\n"
                       "  dataset: {format: synthetic}\n");
  std::vector<std::string> got;
  for (const auto& q : p) got.push_back(q.field + ": " + q.reason);
  const std::vector<std::string> want = {"spec.replicas: is given twice (lines 5 and 6); keep one",
                                         "spec.placement.tolerations[0].key: is given twice (lines 7 and 7); keep one"};
  EXPECT_EQ(got, want);
}

// spec.elastic: at most spec.replicas, and every gang between it and replicas whole spatial groups.
TEST(TrainingJobTest, ElasticGangsAreWholeSpatialGroupsOfAtLeastMinReplicas) {
  auto check = [](const std::string& spec) {
    auto p = problems_of(std::string(kHeader) +
                         "spec:\n  dataset: {format: synthetic}\n  model: {name: cosmoflow, inputSize: 16}\n" + spec);
    return p.empty() ? std::string("accepted") : p.front().field + ": " + p.front().reason;
  };
  EXPECT_EQ(check("  replicas: 4\n  elastic: {minReplicas: 3}\n"), "accepted");
  EXPECT_EQ(check("  replicas: 4\n  elastic: {minReplicas: 5}\n"),
            "spec.elastic.minReplicas: 5 is more than spec.replicas (4)");
  EXPECT_EQ(check("  replicas: 4\n  elastic: {minReplicas: 0}\n"),
            "spec.elastic.minReplicas: 0 is outside [1, 100000]");
  // Pods of one rank, spatial groups of two: a gang of 3 pods would split one.
  EXPECT_EQ(check("  replicas: 4\n  parallelism: {spatial: {d: 2}}\n  elastic: {minReplicas: 2}\n"),
            "spec.elastic.minReplicas: a gang of 3 pods (3 ranks) is not whole spatial groups of 2 ranks");
  EXPECT_EQ(
      check("  replicas: 4\n  ranksPerReplica: 2\n  parallelism: {spatial: {d: 2}}\n  elastic: {minReplicas: 2}\n"),
      "accepted");
  const api::ParsedJob job = api::parse_training_job(ConfigNode::load_string(
      std::string(kHeader) +
      "spec:\n  replicas: 4\n  ranksPerReplica: 2\n  dataset: {format: synthetic}\n  elastic: {minReplicas: 3}\n"));
  ASSERT_TRUE(job.ok());
  const JobConfig c = make_job_config(job.job);
  EXPECT_EQ(c.workers, 8);
  EXPECT_EQ(c.min_workers, 6);
}

TEST(TrainingJobTest, TypesAreStrictAsInTheKubernetesApi) {
  auto field = [](const std::string& spec) {
    const std::string data = spec.rfind("dataset:", 0) == 0 ? "" : "  dataset: {format: synthetic}\n";
    auto p = problems_of(std::string(kHeader) + "spec:\n  " + spec + "\n" + data);
    return p.empty() ? std::string("accepted") : p.front().field + ": " + p.front().reason;
  };
  EXPECT_EQ(field("replicas: \"2\""), "spec.replicas: expected an integer, got the string '2'");
  EXPECT_EQ(field("image: 5"), "spec.image: expected a string, got the number 5 (quote it)");
  EXPECT_EQ(field("runPolicy: {suspend: \"true\"}"),
            "spec.runPolicy.suspend: expected true or false, got the string 'true'");
  EXPECT_EQ(field("cache: {memory: 1.5}"),
            "spec.cache.memory: expected an integer or a string such as 512Mi or 10G, got the number 1.5 (quote a "
            "fractional quantity)");
  EXPECT_EQ(
      field("cache: {memory: 256MB}"),
      "spec.cache.memory: '256MB': MB is not a unit of this quantity; use Ki, Mi, Gi, Ti (powers of 1024) or K, M, G, "
      "T (powers of 1000), as in 512Mi or 10G");
  EXPECT_EQ(field("cache: {memory: \"256MB\"}"), field("cache: {memory: 256MB}"));
  EXPECT_EQ(field("cache: {memory: \"-5Gi\"}"), "spec.cache.memory: -5Gi: must not be negative");
  EXPECT_EQ(field("dataset: {seed: -5}"), "spec.dataset.seed: must not be negative, got -5");
  EXPECT_EQ(field("replicas: 0"), "spec.replicas: 0 is outside [1, 100000]");
  EXPECT_EQ(field("cache: {memory: \"1.5Gi\"}"), "accepted");
  EXPECT_EQ(field("communication: {density: 0}"), "spec.communication.density: 0 is outside (0, 1]");
  EXPECT_EQ(field("model: {name: cosmoflow, inputSize: 48}"),
            "spec.model.inputSize: 48: CosmoFlow needs a power of two from 8 to 1024");
}

TEST(TrainingJobTest, YamlSyntaxErrorsNameTheFileLineAndColumn) {
  const std::string dir = testing::make_temp_dir("tessera-manifest");  // removed at exit
  const std::string file = dir + "/broken.yaml";
  FILE* f = std::fopen(file.c_str(), "w");
  std::fputs("spec: {model: {name: cosmoflow\ntraining: [", f);
  std::fclose(f);
  api::ParsedJob p = api::read_training_job(file);
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_EQ(p.problems[0].field, file);
  EXPECT_NE(p.problems[0].reason.find("line"), std::string::npos);
  EXPECT_THROW(api::load_training_job(file), ConfigError);
  EXPECT_EQ(api::read_training_job("/nonexistent/job.yaml").problems.at(0).reason, "no such file");
  EXPECT_EQ(api::read_training_job(dir).problems.at(0).reason, "is a directory, not a manifest file");
  FILE* g = std::fopen(file.c_str(), "w");
  std::fputs("- not\n- a mapping\n", g);
  std::fclose(g);
  p = api::read_training_job(file);
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_EQ(p.problems[0].field, file);
  EXPECT_EQ(p.problems[0].reason, "a TrainingJob manifest must be a mapping");
  // A file far larger than any manifest is refused before it is parsed.
  {
    std::ofstream big(file);
    big << "metadata: {name: big}\n# " << std::string(2 << 20, 'x') << "\n";
  }
  p = api::read_training_job(file);
  ASSERT_EQ(p.problems.size(), 1u);
  EXPECT_NE(p.problems[0].reason.find("larger than a manifest can be (at most 1048576)"), std::string::npos)
      << p.problems[0].reason;
  // A key that is not a name (found by fuzz/manifest_fuzz) is a problem at its mapping, not a crash.
  const api::ParsedJob bad_key =
      api::parse_training_job(ConfigNode::load_string("spec:\n  model: {[a, b]: 1, name: cosmoflow}\n"));
  bool named = false;
  for (const auto& q : bad_key.problems)
    named |= q.field == "spec.model" && q.reason == "a key at line 2 is not a field name (a list)";
  EXPECT_TRUE(named);
}

// Maps merge key by key, anything else replaces, null deletes.
YAML::Node merge(const YAML::Node& base, const YAML::Node& patch) {
  if (!base.IsMap() || !patch.IsMap()) return YAML::Clone(patch);
  YAML::Node out = YAML::Clone(base);
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (it->second.IsNull()) out.remove(k);
    else out[k] = merge(out[k] ? out[k] : YAML::Node(), it->second);
  }
  return out;
}

TEST(TrainingJobTest, CorpusOfManifestsEachRejectedAtItsField) {
  const YAML::Node corpus = YAML::LoadFile(std::string(TESSERA_SOURCE_DIR) + "/tests/api/manifests.yaml");
  for (const auto& c : corpus["valid"]) {
    auto p = problems_of(ConfigNode(merge(corpus["base"], c["patch"])));
    EXPECT_TRUE(p.empty()) << c["name"].as<std::string>() << ": " << p.front().field << ": " << p.front().reason;
  }
  int invalid = 0;
  for (const auto& c : corpus["invalid"]) {
    const std::string want = c["field"].as<std::string>();
    auto got = fields(problems_of(ConfigNode(merge(corpus["base"], c["patch"]))));
    EXPECT_TRUE(got.count(want)) << c["name"].as<std::string>() << ": expected a problem at " << want;
    ++invalid;
  }
  EXPECT_GE(invalid, 30);
  for (const char* example :
       {"cosmoflow-small.yaml", "cosmoflow-spatial.yaml", "cosmoflow-local.yaml", "transformer-local.yaml",
        "resnet50-local.yaml", "resnet50-imagenet.yaml", "cosmoflow-bf16.yaml"}) {
    auto p = api::read_training_job(std::string(TESSERA_SOURCE_DIR) + "/examples/" + example);
    EXPECT_TRUE(p.ok()) << example;
  }
}

}  // namespace
}  // namespace tessera
