// Gradient-exchange strategies: how one flat bucket of fused gradients becomes the sum over all
// ranks, with as few bytes on slow links as the strategy allows.
//
//   dense   DenseAllreduce   ring all-reduce over the world group
//   torus   TorusAllreduce   2D-torus: intra-node reduce-scatter, inter-node all-reduce of the 1/n
//                            shard (n rings in parallel), intra-node all-gather
//   topk    SparseAllgather  error feedback + local top-k, all-gather of (index, value) pairs, sum
//   hitopk  HierarchicalTopk intra-node reduce-scatter, error feedback + top-k on the shard,
//                            inter-node all-gather among equal local ranks, intra-node all-gather
//                            of the pairs, scatter-add
//
// After exchange() the bucket holds the sum over ranks of what each rank sent: for dense and torus
// the exact sum; for the sparse strategies at density 1 the same sum (up to summation order). With
// bf16 on the wire, the sum of the rounded values, rounded along the way.
// Every rank ends with bitwise identical values. One thread per strategy object.
//
// With ExchangeConfig::device kCuda the bucket is device memory and the groups' communicators take
// device pointers (NCCL): dense and torus run as they are, the sparse strategies run their error
// feedback, CUDA MSTopK and scatter-add on the device.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>

#include "worker/comm/topology.h"
#include "worker/compress/error_feedback.h"
#include "worker/compress/topk.h"
#include "worker/core/device.h"

namespace tessera {

struct ExchangeConfig {
  std::string strategy = "dense";   // dense | torus | topk | hitopk
  double density = 0.001;           // fraction of a bucket (or shard) sparse strategies send, (0, 1]
  std::string selector = "mstopk";  // top-k selector of sparse strategies: mstopk | exact
  Device device = Device::kCpu;     // where the buckets are (kCuda: the groups are NCCL's)
  // How gradient values travel (communication.gradientPrecision): kFloat32, or kBFloat16 (rounded to
  // nearest even; dense and torus sum in bf16 along their rings, as NCCL's bf16 all-reduce does; the
  // sparse strategies send (index, bf16 value) pairs of 6 bytes and keep what the rounding left out
  // in the fp32 residual). hitopk's reduce-scatter inside the node stays fp32. Host buckets only.
  DType wire = DType::kFloat32;
};

struct ExchangeStats {
  LinkBytes bytes;            // bytes this rank sent during the call, by link kind
  size_t selected = 0;        // entries this rank selected (sparse strategies), else the bucket size
  double seconds = 0;         // wall time of the call
  double select_seconds = 0;  // of which error feedback and top-k selection (sparse strategies)
};

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  const std::string& name() const { return name_; }

  // grad: this rank's gradient of bucket `bucket` on entry, the global sum on return. `bucket` is a
  // stable id: sparse strategies keep an error-feedback residual per bucket.
  ExchangeStats exchange(int bucket, std::span<float> grad);

  // Adds this rank's error-feedback residual of `bucket` (what it selected but has not yet sent)
  // into `out`, a buffer of the bucket's size. Nothing for dense strategies. Summed over ranks and
  // added to the sum of all exchanged results, it gives exactly the sum of all gradients passed in.
  virtual void add_residual(int bucket, std::span<float> out) const { (void)bucket, (void)out; }
  // This rank's error-feedback state (bucket -> residual), for checkpoints; empty for dense strategies.
  virtual std::map<int, std::vector<float>> residuals() const { return {}; }
  virtual void restore_residuals(const std::map<int, std::vector<float>>& r) { (void)r; }
  // The entries of this rank's residual for a bucket of `bucket_size` (its shard under hitopk), and
  // where in the bucket they start.
  virtual size_t residual_size(size_t bucket_size) const { return bucket_size; }
  virtual size_t residual_offset(size_t bucket_size) const {
    (void)bucket_size;
    return 0;
  }

 protected:
  GradientExchange(std::string name, CommGroups& groups) : name_(std::move(name)), groups_(groups) {}
  // Does the work; returns the number of entries selected.
  virtual size_t run(int bucket, std::span<float> grad) = 0;

  std::string name_;
  CommGroups& groups_;
  double select_seconds_ = 0;  // run() adds its error feedback and selection time here
};

// communication.gradientPrecision ("fp32" or "bf16") as the values' type on the wire; ConfigError
// naming the field otherwise.
DType wire_type(const std::string& gradient_precision);

// The strategies' names, for help texts and errors.
const char* exchange_strategy_names();

// Throws ConfigError naming `communication.strategy` or `communication.density` when the strategy is
// unknown, the density is outside (0, 1], or the strategy needs even nodes and the topology has not.
std::unique_ptr<GradientExchange> make_exchange(const ExchangeConfig& config, CommGroups& groups);

}  // namespace tessera
