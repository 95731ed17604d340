// Models assembled from nn/ layers by configuration: CosmoFlow (3D regression), UNet3D (3D
// segmentation), a 2D CNN (classification; small by default, and with wide hidden layers the
// large-gradient model of the exchange benchmarks) and a decoder-only Transformer language model. A Model owns its
// layers, runs forward/backward, and knows its task: which loss trains it and which metric reports it. Configuration
// errors (a size that does not fit the architecture) are ConfigErrors naming the field.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/loss.h"
#include "worker/spatial/partition.h"

namespace tessera {

struct ModelConfig {
  std::string name = "cosmoflow";  // cosmoflow | unet3d | cnn2d | transformer
  int input_size = 32;             // W: the input is channels x W^3 (2D: channels x W^2)
  int in_channels = 0;             // 0: the model's default (cosmoflow 4, unet3d 1, cnn2d 1)
  int base_channels = 0;           // 0: default (cosmoflow 16, unet3d 8, cnn2d 16)
  int max_channels = 256;          // cosmoflow: channels double per block up to this
  std::vector<int> hidden;         // fully connected widths before the output; empty: cosmoflow 2048, 256; cnn2d 128
  int outputs = 0;                 // regression targets (cosmoflow 4) or classes (unet3d 3, cnn2d 10)
  float dropout = 0.0f;            // after each hidden FC layer (cosmoflow, cnn2d)
  float leaky_slope = 0.3f;        // cosmoflow activations
  bool batchnorm = false;          // cosmoflow: BatchNorm after each conv
  uint64_t seed = 1;               // weight initialisation
  ParamInit init;                  // how weights and biases start (every layer; see ParamInit)
  SpatialGrid spatial;             // split of each sample in D, H, W over a spatial group (cosmoflow, unet3d)
  // transformer: a sample is `context` token ids of a vocabulary of `vocab_size` (the dataset's);
  // `depth` pre-norm blocks of `width`, `heads` attention heads each.
  int vocab_size = 0, context = 256, width = 256, depth = 4, heads = 4;
  double label_smoothing = 0;              // classifiers' cross-entropy (training.labelSmoothing)
  Precision precision = Precision::kFp32;  // every layer's products (training.precision)
};

// The fully connected widths the model builds: c.hidden, or the model's default when empty.
std::vector<int> hidden_widths(const ModelConfig& c);

class Communicator;

enum class Task { kRegression, kSegmentation, kClassification };

class Model {
 public:
  // Transformer: a sample's target is its `context` next tokens, and the output one row of logits
  // per position (N * context, vocabulary): the loss and metric are per token.
  virtual ~Model() = default;
  virtual const std::string& name() const = 0;
  virtual Task task() const = 0;
  // Shape of one sample's input (C, spatial...) and target.
  virtual Shape sample_shape() const = 0;
  virtual Shape target_shape() const = 0;
  virtual Tensor forward(const Tensor& x, bool training) = 0;
  // `ready` (may be null) hears of each layer as soon as its parameter gradients are final.
  virtual Tensor backward(const Tensor& dy, const GradReady* ready = nullptr) = 0;
  virtual std::vector<Param*> params() = 0;
  // The model as the cost model (common/cost_model.h) sees it: its top-level layers in forward
  // order (a residual block as one), each with its parameters and forward FLOPs per sample (under
  // spatial parallelism, of this rank's block).
  virtual std::vector<cost::LayerCost> cost_layers() const = 0;
  // Forward floating-point operations per sample: the sum over cost_layers().
  double forward_flops() const;
  // Every layer, those inside residual blocks included: for checkpoints of layer state (batch-norm
  // running statistics) and the dropout layers' draws.
  virtual std::vector<Layer*> layers() = 0;
  // Under spatial parallelism: the partition of the input volume (forward() then takes this rank's
  // block of each sample) and the samples of a local batch of n whose outputs this rank produces.
  virtual const Partition* input_partition() const { return nullptr; }
  virtual std::vector<int64_t> held_samples(int64_t n) const {
    std::vector<int64_t> all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    return all;
  }
  // The fraction of a local batch's loss terms this rank computes (its held samples, or its block's
  // voxels for per-voxel losses): the loss gradient is scaled by it so the spatial group's partial
  // gradients add up to the gradient of the batch mean.
  virtual double loss_share(int64_t n) const { return n ? static_cast<double>(held_samples(n).size()) / n : 0.0; }

  // The loss that trains this model's task, and its metric (MAE for regression, accuracy else).
  LossResult loss(const Tensor& output, const Tensor& target) const;
  void set_label_smoothing(double eps) { label_smoothing_ = eps; }
  double metric(const Tensor& output, const Tensor& target) const;
  const char* metric_name() const;
  int64_t num_params();
  // Moves every layer's parameters and state to `device` (the model then takes inputs there).
  void to(Device device) {
    for (Layer* l : layers()) l->to(device);
  }

 private:
  double label_smoothing_ = 0;
};

// Validates the configuration (ConfigError on model.*) and builds the model. With config.spatial
// larger than 1 x 1 x 1, `spatial` is this rank's spatial group (its size the grid's).
std::unique_ptr<Model> make_model(const ModelConfig& config, Communicator* spatial = nullptr);

// The models that run under spatial parallelism.
inline bool supports_spatial(const std::string& model) { return model == "cosmoflow" || model == "unet3d"; }
// The rule make_model applies to a spatial grid when the ranks meet, checked without building
// anything: each dimension is split into at most as many parts as the smallest volume the model's
// spatial layers split has voxels (cosmoflow: the 4^3 its pooling ends at; unet3d: its bottom level,
// inputSize / 4). Throws ConfigError at parallelism.spatial.d|h|w, naming the layer.
void check_spatial_grid(const ModelConfig& c);

}  // namespace tessera
