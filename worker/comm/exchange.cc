#include "worker/comm/exchange.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "tessera/config.h"
#include "worker/compress/sparse.h"
#include "worker/core/device.h"
#include "worker/core/tensor.h"
#include "worker/nn/kernels.h"
#if TESSERA_HAVE_CUDA
#include "worker/compress/cuda/topk_cuda.h"
#endif

namespace tessera {
namespace {

// A bucket's values as they travel: the bucket itself in fp32, or its values rounded to bf16 in a
// buffer kept between calls (to_wire), written back into the bucket after the exchange (from_wire).
class WireBuffer {
 public:
  explicit WireBuffer(DType wire) : wire_(wire) {}
  DType dtype() const { return wire_; }
  void* to_wire(std::span<float> grad) {
    if (wire_ == DType::kFloat32) return grad.data();
    bits_.resize(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) bits_[i] = kernels::bf16_bits(grad[i]);
    return bits_.data();
  }
  void from_wire(std::span<float> grad) const {
    if (wire_ == DType::kFloat32) return;
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = kernels::bf16_value(bits_[i]);
  }

 private:
  DType wire_;
  std::vector<uint16_t> bits_;
};

// ---- dense: ring all-reduce ----
class DenseAllreduce final : public GradientExchange {
 public:
  DenseAllreduce(CommGroups& g, DType wire) : GradientExchange("dense", g), wire_(wire) {}
  size_t run(int, std::span<float> grad) override {
    groups_.world->allreduce(wire_.to_wire(grad), grad.size(), wire_.dtype(), ReduceOp::kSum, Millis(0));
    wire_.from_wire(grad);
    return grad.size();
  }

 private:
  WireBuffer wire_;
};

// ---- torus: 2D-torus all-reduce ----
// Reduce-scatter inside the node, all-reduce of each rank's shard across nodes, all-gather inside the
// node. A large gradient goes in chunks, pipelined over the two communicators: while chunk c crosses
// between nodes (on a helper thread, which alone uses the inter-node communicator), this thread
// reduce-scatters chunk c+1 and all-gathers chunk c-1 inside the node, so the slow link does not
// wait for the copies inside the node. Every rank cuts the same chunks and issues the same calls in
// the same order on each communicator.
class TorusAllreduce final : public GradientExchange {
 public:
  TorusAllreduce(CommGroups& g, Device device, DType wire)
      : GradientExchange("torus", g), device_(device), wire_(wire) {}
  size_t run(int, std::span<float> grad) override {
    Communicator& intra = *groups_.intra;
    const DType t = wire_.dtype();
    char* data = static_cast<char*>(wire_.to_wire(grad));
    if (intra.size() == 1) {  // one rank per node: the torus is the ring across nodes, on the gradient in place
      groups_.inter->allreduce(data, grad.size(), t, ReduceOp::kSum, Millis(0));
      wire_.from_wire(grad);
      return grad.size();
    }
    const bool two_levels = intra.size() > 1 && groups_.inter->size() > 1;
    const size_t n = two_levels ? std::clamp<size_t>(grad.size() / kChunkFloats, 1, kMaxChunks) : 1;
    const auto sizes = even_split(grad.size(), static_cast<int>(n));
    chunks_.resize(n);
    for (size_t c = 0, offset = 0; c < n; offset += sizes[c++]) {
      chunks_[c].data = data + offset * dtype_size(t);
      chunks_[c].counts = even_split(sizes[c], intra.size());
      chunks_[c].shard_count = chunks_[c].counts[intra.rank()];
      // the shard's entries, in floats (two bf16 values a float)
      const auto floats = static_cast<int64_t>((chunks_[c].shard_count * dtype_size(t) + 3) / 4);
      if (chunks_[c].shard.numel() != floats) chunks_[c].shard = Tensor({floats}, Layout::kPlain, device_);
    }
    if (n == 1) {
      reduce_scatter(chunks_[0]);
      shard_allreduce(chunks_[0]);
      allgather(chunks_[0]);
    } else {
      pipelined();
    }
    wire_.from_wire(grad);
    return grad.size();
  }

 private:
  static constexpr size_t kChunkFloats = size_t{1} << 20, kMaxChunks = 8;
  struct Chunk {
    char* data;  // the chunk's first entry in the wire buffer
    std::vector<size_t> counts;
    size_t shard_count = 0;  // counts[intra rank]
    Tensor shard;            // on the gradient's device
  };

  void shard_allreduce(Chunk& c) {
    groups_.inter->allreduce(c.shard.data(), c.shard_count, wire_.dtype(), ReduceOp::kSum, Millis(0));
  }
  void reduce_scatter(Chunk& c) {
    groups_.intra->reduce_scatter(c.data, c.shard.data(), c.counts, wire_.dtype(), ReduceOp::kSum, Millis(0));
  }
  void allgather(Chunk& c) { groups_.intra->allgatherv(c.shard.data(), c.data, c.counts, wire_.dtype(), Millis(0)); }

  void pipelined() {
    const size_t n = chunks_.size();
    std::mutex mu;
    std::condition_variable cv;
    size_t reduced = 0, crossed = 0;
    bool stop = false;
    std::exception_ptr cross_error;
    const int cuda_device = device_ == Device::kCuda ? gpu::current_device() : -1;
    std::thread cross([&] {
      try {
        if (cuda_device >= 0) gpu::set_device(cuda_device);  // the shards' device
        for (size_t c = 0; c < n; ++c) {
          {
            std::unique_lock<std::mutex> lock(mu);
            cv.wait(lock, [&] { return reduced > c || stop; });
            if (stop) return;
          }
          shard_allreduce(chunks_[c]);
          std::lock_guard<std::mutex> lock(mu);
          ++crossed;
          cv.notify_all();
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        cross_error = std::current_exception();
        cv.notify_all();
      }
    });
    auto crossed_at_least = [&](size_t k) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return crossed >= k || cross_error; });
      if (cross_error) std::rethrow_exception(cross_error);
    };
    try {
      for (size_t c = 0; c < n; ++c) {
        reduce_scatter(chunks_[c]);
        {
          std::lock_guard<std::mutex> lock(mu);
          ++reduced;
        }
        cv.notify_all();
        if (c > 0) {
          crossed_at_least(c);
          allgather(chunks_[c - 1]);
        }
      }
      crossed_at_least(n);
      allgather(chunks_[n - 1]);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      cross.join();  // an all-reduce under way ends by its peers or its deadline
      throw;
    }
    cross.join();
  }

  Device device_;
  WireBuffer wire_;
  std::vector<Chunk> chunks_;
};

// What a sparse strategy selected: `count` entries in its wire format, at `data`.
struct Selected {
  const void* data;
  size_t count;
};

// Shared by the sparse strategies: error feedback plus the configured selector.
class SparseSelector {
 public:
  SparseSelector(double density, bool exact, bool bf16) : density_(density), exact_(exact), bf16_(bf16) {}

  // acc := residual + grad; picks k = topk_count(acc) entries; packs them with `offset` added to
  // their indices (values rounded to bf16 where they travel so); takes what was sent from the
  // residual. Adds the seconds it took to `seconds`.
  Selected select(int bucket, std::span<const float> grad, uint32_t offset, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    std::span<float> acc = feedback_.accumulate(bucket, grad);
    const size_t k = topk_count(acc.size(), density_);
    const std::string name = "bucket " + std::to_string(bucket);
    if (exact_) {
      exact_topk(acc, k, idx_, name);
    } else {
      mstopk_.select(acc, k, idx_, name);
    }
    Selected out{nullptr, idx_.size()};
    if (bf16_) {
      entries_bf16_.resize(idx_.size());
      pack_entries(acc, idx_, offset, entries_bf16_);
      out.data = entries_bf16_.data();
    } else {
      entries_.resize(idx_.size());
      pack_entries(acc, idx_, offset, entries_);
      out.data = entries_.data();
    }
    feedback_.mark_sent(bucket, idx_, bf16_);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  }

  std::map<int, std::vector<float>> residuals() const {
    std::map<int, std::vector<float>> out(feedback_.all().begin(), feedback_.all().end());
    return out;
  }
  void restore(const std::map<int, std::vector<float>>& r) {
    for (const auto& [b, v] : r) feedback_.restore(b, v);
  }

  // out[offset + i] += residual[i].
  void add_residual(int bucket, std::span<float> out, size_t offset) const {
    auto r = feedback_.residual(bucket);
    for (size_t i = 0; i < r.size(); ++i) out[offset + i] += r[i];
  }

 private:
  double density_;
  bool exact_, bf16_;
  ErrorFeedback feedback_;
  MSTopK mstopk_;
  std::vector<uint32_t> idx_;
  std::vector<SparseEntry> entries_;
  std::vector<SparseEntryBf16> entries_bf16_;
};

// This rank's shard (offset, length) of a bucket of `size` split over the ranks of its node: what
// hitopk selects from and keeps the residual of.
std::pair<size_t, size_t> node_shard(size_t size, const Communicator& intra) {
  const auto counts = even_split(size, intra.size());
  size_t offset = 0;
  for (int l = 0; l < intra.rank(); ++l) offset += counts[l];
  return {offset, counts[intra.rank()]};
}

// What the sparse strategies share, on the host (SparseSelector) and the GPU: the selector that keeps
// the error-feedback residuals, and where in a bucket they lie (the whole bucket, or this rank's
// shard of it under hitopk).
template <class Selector>
class SparseStrategy : public GradientExchange {
 public:
  size_t residual_size(size_t bucket_size) const override {
    return sharded_ ? node_shard(bucket_size, *groups_.intra).second : bucket_size;
  }
  size_t residual_offset(size_t bucket_size) const override {
    return sharded_ ? node_shard(bucket_size, *groups_.intra).first : 0;
  }
  void add_residual(int bucket, std::span<float> out) const override {
    selector_.add_residual(bucket, out, residual_offset(out.size()));
  }
  std::map<int, std::vector<float>> residuals() const override { return selector_.residuals(); }
  void restore_residuals(const std::map<int, std::vector<float>>& r) override { selector_.restore(r); }

 protected:
  SparseStrategy(std::string name, CommGroups& g, Selector selector, bool sharded, DType wire)
      : GradientExchange(std::move(name), g),
        selector_(std::move(selector)),
        sharded_(sharded),
        entry_bytes_(wire == DType::kBFloat16 ? sizeof(SparseEntryBf16) : sizeof(SparseEntry)) {}
  Selector selector_;
  bool sharded_;
  size_t entry_bytes_;  // of the wire format
};

// Where a sparse strategy's buffers live and how its device-specific steps run. HostBuffers: host
// memory, the CPU's selector and scatter-add. DeviceBuffers (below): device memory, CUDA kernels.
struct HostBuffers {
  using Selector = SparseSelector;
  using Floats = std::vector<float>;
  using Entries = std::vector<std::byte>;
  static Selector selector(const ExchangeConfig& c) {
    return SparseSelector(c.density, c.selector == "exact", c.wire == DType::kBFloat16);
  }
  static float* floats(Floats& b, size_t n) {
    b.resize(n);
    return b.data();
  }
  static std::byte* entries(Entries& b, size_t n, size_t entry_bytes) {
    b.resize(n * entry_bytes);
    return b.data();
  }
  // This rank's k selected entries of `grad` (see SparseSelector::select).
  static Selected select(Selector& s, int bucket, std::span<const float> grad, uint32_t offset, double& seconds) {
    return s.select(bucket, grad, offset, seconds);
  }
  static void zero(std::span<float> grad) { std::fill(grad.begin(), grad.end(), 0.0f); }
  // grad += `chunks` runs of `len` entries each (the entries of a run distinct).
  static void add(std::span<float> grad, const std::byte* e, size_t len, int chunks, size_t entry_bytes) {
    const size_t n = len * static_cast<size_t>(chunks);
    if (entry_bytes == sizeof(SparseEntryBf16))
      scatter_add(grad, std::span<const SparseEntryBf16>(reinterpret_cast<const SparseEntryBf16*>(e), n));
    else scatter_add(grad, std::span<const SparseEntry>(reinterpret_cast<const SparseEntry*>(e), n));
  }
};

#if TESSERA_HAVE_CUDA
// ---- the sparse strategies on the GPU (gradients in device memory, NCCL communicators) ----
// The same steps as on the host: error feedback (the residual takes the gradient), CUDA MSTopK of
// exactly k entries (so both selectors are the same there), the entries packed in the wire format,
// the sent entries zeroed in the residual; gathered entries are scatter-added into the zeroed bucket.
// Kernels run on the calling thread's stream, which is idle before each collective (NCCL runs on
// the communicator's own stream and returns when it is done).
class DeviceSparseSelector {
 public:
  explicit DeviceSparseSelector(double density) : density_(density) {}

  const Tensor& select(int bucket, std::span<const float> grad, uint32_t offset, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor& acc = residuals_[bucket];
    if (acc.numel() != static_cast<int64_t>(grad.size())) {
      TESSERA_CHECK(acc.empty(), "bucket ", bucket, " changed size from ", acc.numel(), " to ", grad.size());
      acc = Tensor::zeros({static_cast<int64_t>(grad.size())}, Device::kCuda);
    }
    gpu::add_into(acc.data(), grad.data(), grad.size());
    const size_t k = topk_count(grad.size(), density_);
    if (idx_.numel() != static_cast<int64_t>(k)) {
      idx_ = Tensor({static_cast<int64_t>(k)}, Layout::kPlain, Device::kCuda);  // uint32 indices, float-sized
      val_ = Tensor({static_cast<int64_t>(k)}, Layout::kPlain, Device::kCuda);
      entries_ = Tensor({static_cast<int64_t>(2 * k)}, Layout::kPlain, Device::kCuda);  // SparseEntry is 8 bytes
    }
    auto* idx = reinterpret_cast<uint32_t*>(idx_.data());
    cuda::mstopk(acc.data(), grad.size(), k, idx, val_.data(), "bucket " + std::to_string(bucket), gpu::stream());
    cuda::pack_entries(idx, val_.data(), k, offset, entries(), gpu::stream());
    cuda::zero_at(acc.data(), idx, k, gpu::stream());
    gpu::synchronize();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return entries_;
  }
  SparseEntry* entries() { return reinterpret_cast<SparseEntry*>(entries_.data()); }
  size_t count() const { return static_cast<size_t>(idx_.numel()); }

  std::map<int, std::vector<float>> residuals() const {
    std::map<int, std::vector<float>> out;
    for (const auto& [b, r] : residuals_) {
      const Tensor h = r.to(Device::kCpu);
      out[b].assign(h.span().begin(), h.span().end());
    }
    return out;
  }
  void restore(const std::map<int, std::vector<float>>& r) {
    for (const auto& [b, v] : r) {
      Tensor h({static_cast<int64_t>(v.size())});
      std::copy(v.begin(), v.end(), h.span().begin());
      residuals_[b] = h.to(Device::kCuda);
    }
  }
  // out[offset + i] += residual[i] (out in device memory).
  void add_residual(int bucket, std::span<float> out, size_t offset) const {
    auto it = residuals_.find(bucket);
    if (it == residuals_.end()) return;
    gpu::add_into(out.data() + offset, it->second.data(), static_cast<size_t>(it->second.numel()));
    gpu::synchronize();
  }

 private:
  double density_;
  std::map<int, Tensor> residuals_;
  Tensor idx_, val_, entries_;
};

struct DeviceBuffers {
  using Selector = DeviceSparseSelector;
  using Floats = Tensor;
  using Entries = Tensor;  // SparseEntry is 8 bytes: two floats each
  static Selector selector(const ExchangeConfig& c) { return DeviceSparseSelector(c.density); }
  static float* floats(Tensor& b, size_t n) {
    if (b.numel() != static_cast<int64_t>(n)) b = Tensor({static_cast<int64_t>(n)}, Layout::kPlain, Device::kCuda);
    return b.data();
  }
  // The device's wire format is SparseEntry (make_exchange refuses bf16 there).
  static std::byte* entries(Tensor& b, size_t n, size_t entry_bytes) {
    TESSERA_CHECK_EQ(entry_bytes, sizeof(SparseEntry));
    return reinterpret_cast<std::byte*>(floats(b, 2 * n));
  }
  static Selected select(Selector& s, int bucket, std::span<const float> grad, uint32_t offset, double& seconds) {
    s.select(bucket, grad, offset, seconds);
    return {s.entries(), s.count()};
  }
  static void zero(std::span<float> grad) { gpu::fill(grad.data(), grad.size(), 0.0f); }
  static void add(std::span<float> grad, const std::byte* e, size_t len, int chunks, size_t entry_bytes) {
    TESSERA_CHECK_EQ(entry_bytes, sizeof(SparseEntry));
    cuda::scatter_add(grad.data(), grad.size(), reinterpret_cast<const SparseEntry*>(e), len, chunks, gpu::stream());
  }
};
#endif

// ---- topk: TopK-SGD with a sparse all-gather ----
template <class Buffers>
class SparseAllgather final : public SparseStrategy<typename Buffers::Selector> {
 public:
  SparseAllgather(CommGroups& g, const ExchangeConfig& c)
      : SparseStrategy<typename Buffers::Selector>("topk", g, Buffers::selector(c), false, c.wire) {}
  size_t run(int bucket, std::span<float> grad) override {
    const Selected mine = Buffers::select(this->selector_, bucket, grad, 0, this->select_seconds_);
    Communicator& world = *this->groups_.world;
    const size_t eb = this->entry_bytes_;
    std::byte* all = Buffers::entries(gathered_, mine.count * world.size(), eb);
    world.allgather(mine.data, all, mine.count * eb, DType::kUInt8, Millis(0));
    Buffers::zero(grad);
    Buffers::add(grad, all, mine.count, world.size(), eb);
    return mine.count;
  }

 private:
  typename Buffers::Entries gathered_;
};

// ---- hitopk: hierarchical top-k ----
template <class Buffers>
class HierarchicalTopk final : public SparseStrategy<typename Buffers::Selector> {
 public:
  HierarchicalTopk(CommGroups& g, const ExchangeConfig& c)
      : SparseStrategy<typename Buffers::Selector>("hitopk", g, Buffers::selector(c), true, c.wire),
        density_(c.density) {}
  size_t run(int bucket, std::span<float> grad) override {
    Communicator& intra = *this->groups_.intra;
    Communicator& inter = *this->groups_.inter;
    const int n = intra.size(), m = inter.size(), me = intra.rank();
    const auto counts = even_split(grad.size(), n);
    size_t offset = 0;
    for (int l = 0; l < me; ++l) offset += counts[l];

    // 1. Dense reduce-scatter on the fast links: this rank owns shard `me`, summed over its node.
    float* shard = Buffers::floats(shard_, counts[me]);
    intra.reduce_scatter(grad.data(), shard, counts, DType::kFloat32, ReduceOp::kSum, Millis(0));
    // 2. Error feedback and top-k on the shard (indices made bucket-global).
    const Selected mine = Buffers::select(this->selector_, bucket, std::span<const float>(shard, counts[me]),
                                          static_cast<uint32_t>(offset), this->select_seconds_);
    // 3. Sparse all-gather across nodes among ranks owning the same shard.
    const size_t eb = this->entry_bytes_;
    std::byte* node = Buffers::entries(node_entries_, mine.count * m, eb);
    inter.allgather(mine.data, node, mine.count * eb, DType::kUInt8, Millis(0));
    // 4. All-gather every shard's pairs inside the node (shard l has m * k_l pairs, k_l from its size).
    std::vector<size_t> bytes(n), lens(n);
    size_t total = 0;
    for (int l = 0; l < n; ++l) {
      lens[l] = topk_count(counts[l], density_);
      bytes[l] = lens[l] * m * eb;
      total += lens[l] * m;
    }
    std::byte* all = Buffers::entries(all_entries_, total, eb);
    intra.allgatherv(node, all, bytes, DType::kUInt8, Millis(0));
    // 5. Scatter-add into the dense bucket: shard l's pairs are m runs (one per node) of lens[l]
    // entries, distinct within a run.
    Buffers::zero(grad);
    for (int l = 0; l < n; ++l) {
      Buffers::add(grad, all, lens[l], m, eb);
      all += lens[l] * m * eb;
    }
    return mine.count;
  }

 private:
  double density_;
  typename Buffers::Floats shard_;
  typename Buffers::Entries node_entries_, all_entries_;
};

}  // namespace

ExchangeStats GradientExchange::exchange(int bucket, std::span<float> grad) {
  const LinkBytes before = groups_.link_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  ExchangeStats stats;
  select_seconds_ = 0;
  stats.selected = run(bucket, grad);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.select_seconds = select_seconds_;
  stats.bytes = groups_.link_bytes() - before;
  return stats;
}

DType wire_type(const std::string& gradient_precision) {
  if (gradient_precision == "fp32") return DType::kFloat32;
  if (gradient_precision == "bf16") return DType::kBFloat16;
  throw ConfigError("communication.gradientPrecision",
                    "unknown precision '" + gradient_precision + "' (expected fp32 or bf16)");
}

const char* exchange_strategy_names() { return "dense, torus, topk, hitopk"; }

std::unique_ptr<GradientExchange> make_exchange(const ExchangeConfig& c, CommGroups& groups) {
  const std::string& s = c.strategy;
  if (s != "dense" && s != "torus" && s != "topk" && s != "hitopk")
    throw ConfigError("communication.strategy",
                      "unknown strategy '" + s + "' (expected one of " + exchange_strategy_names() + ")");
  if (!(c.density > 0.0 && c.density <= 1.0))
    throw ConfigError("communication.density", detail::concat(c.density, " is outside (0, 1]"));
  if (c.selector != "mstopk" && c.selector != "exact")
    throw ConfigError("communication.selector", "unknown selector '" + c.selector + "' (expected mstopk or exact)");
  TESSERA_CHECK(c.wire == DType::kFloat32 || c.wire == DType::kBFloat16, "gradients travel as ", dtype_name(c.wire));
  if (c.wire == DType::kBFloat16 && c.device == Device::kCuda)
    throw ConfigError("communication.gradientPrecision",
                      "bf16 gradients travel from host memory only; a job whose gradients are on the GPU sends fp32");
  if (s == "torus" || s == "hitopk") groups.topology.require_uniform("communication.strategy", "'" + s + "'");
  if (s == "dense") return std::make_unique<DenseAllreduce>(groups, c.wire);
  if (s == "torus") return std::make_unique<TorusAllreduce>(groups, c.device, c.wire);
  if (c.device == Device::kCuda) {
#if TESSERA_HAVE_CUDA
    if (s == "topk") return std::make_unique<SparseAllgather<DeviceBuffers>>(groups, c);
    return std::make_unique<HierarchicalTopk<DeviceBuffers>>(groups, c);
#else
    throw ConfigError("communication.transport", "gradients on the GPU, but this build of Tessera has no CUDA");
#endif
  }
  if (s == "topk") return std::make_unique<SparseAllgather<HostBuffers>>(groups, c);
  return std::make_unique<HierarchicalTopk<HostBuffers>>(groups, c);
}

}  // namespace tessera
