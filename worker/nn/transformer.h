// The layers of a decoder-only Transformer language model. A batch of N sequences of T tokens
// enters as ids (N, T) stored as floats; inside, activations are one row per position, (N*T, D), so
// the fully connected layers are nn/linear.h's and the normalisation works on rows. Attention is the
// one layer that sees the sequences: it takes the rows of T positions of each sequence together.
//
// Every layer computes the same arithmetic on the CPU (oneDNN's sgemm, the row functions of
// nn/kernels.h) and on the GPU (cuBLAS, the same row functions in CUDA kernels).
#pragma once

#include <cstdint>

#include "worker/nn/layer.h"

namespace tessera {

// Token and position embeddings: ids (N, T) -> rows (N*T, D), row (n, t) = token[id] + position[t].
// An id outside [0, vocab) is a ConfigError naming dataset.vocabSize. Both tables start N(0, stddev).
class Embedding : public Layer {
 public:
  Embedding(std::string name, int vocab, int context, int width, uint64_t seed, float stddev = 0.02f);
  const char* kind() const override { return "embedding"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& ids, bool training) override;
  Tensor backward(const Tensor& dy) override;  // returns an empty tensor: ids have no gradient
  std::vector<Param*> params() override { return {&token_, &position_}; }
  // The token embedding (vocab, D), which the output layer shares (TiedOutput).
  Param& token() { return token_; }

 private:
  int vocab_, context_, width_;
  Param token_, position_;
  Tensor ids_;
};

// Logits over the vocabulary from rows (N*T, D) with the embedding's token matrix E (vocab, D):
// logits = x E^T, no bias. Its gradient adds into E's (the Embedding owns the parameter, and its
// backward, which runs after this one, makes the gradient final).
class TiedOutput : public Layer {
 public:
  TiedOutput(std::string name, Param& embedding);
  const char* kind() const override { return "tied_output"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  double forward_flops(const Shape& in) const override;

 private:
  Param* e_;
  Tensor x_;
  bool have_input_ = false;  // a training forward ran (x_ may hold zero rows)
};

// Layer normalisation over the last dimension (D): gamma * (x - mean) / sqrt(var + eps) + beta,
// var biased (PyTorch's nn.LayerNorm).
class LayerNorm : public Layer {
 public:
  LayerNorm(std::string name, int width, float eps = 1e-5f);
  const char* kind() const override { return "layer_norm"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& x, bool training) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Param*> params() override { return {&gamma_, &beta_}; }

 private:
  int width_;
  float eps_;
  Param gamma_, beta_;
  Tensor xhat_, rstd_;  // of the last training forward: (rows, D) and (rows)
};

// Causal multi-head self-attention on projected rows: (N*T, 3D) holding each position's query, key
// and value (in that order, heads side by side in each) -> (N*T, D), every head's
// softmax(q k^T / sqrt(D / heads)) v over the positions up to its own. The projections around it
// are Linear layers.
class CausalAttention : public Layer {
 public:
  CausalAttention(std::string name, int context, int width, int heads);
  const char* kind() const override { return "causal_attention"; }
  Shape output_shape(const Shape& in) const override;
  Tensor forward(const Tensor& qkv, bool training) override;
  Tensor backward(const Tensor& dy) override;
  double forward_flops(const Shape& in) const override;

 private:
  int t_, d_, heads_;
  Tensor qkv_, p_;  // input and attention probabilities (N, heads, T, T) of the last training forward
};

}  // namespace tessera
