#include "worker/comm/exchange.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "worker/compress/sparse.h"
#include "common/error.h"

namespace tessera {
namespace {

// ---- dense: ring all-reduce ----
class DenseAllreduce final : public GradientExchange {
 public:
  explicit DenseAllreduce(CommGroups& g) : GradientExchange("dense", g) {}
  size_t run(int, std::span<float> grad) override {
    groups_.world->allreduce(grad);
    return grad.size();
  }
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
  explicit TorusAllreduce(CommGroups& g) : GradientExchange("torus", g) {}
  size_t run(int, std::span<float> grad) override {
    Communicator& intra = *groups_.intra;
    const bool two_levels = intra.size() > 1 && groups_.inter->size() > 1;
    const size_t n = two_levels ? std::clamp<size_t>(grad.size() / kChunkFloats, 1, kMaxChunks) : 1;
    const auto sizes = even_split(grad.size(), static_cast<int>(n));
    chunks_.resize(n);
    for (size_t c = 0, offset = 0; c < n; offset += sizes[c++]) {
      chunks_[c].data = grad.subspan(offset, sizes[c]);
      chunks_[c].counts = even_split(sizes[c], intra.size());
      chunks_[c].shard.resize(chunks_[c].counts[intra.rank()]);
    }
    if (n == 1) {
      reduce_scatter(chunks_[0]);
      groups_.inter->allreduce(std::span<float>(chunks_[0].shard));
      allgather(chunks_[0]);
    } else {
      pipelined();
    }
    return grad.size();
  }

 private:
  static constexpr size_t kChunkFloats = size_t{1} << 20, kMaxChunks = 8;
  struct Chunk {
    std::span<float> data;
    std::vector<size_t> counts;
    std::vector<float> shard;
  };

  void reduce_scatter(Chunk& c) {
    groups_.intra->reduce_scatter(c.data.data(), c.shard.data(), c.counts, DType::kFloat32, ReduceOp::kSum, Millis(0));
  }
  void allgather(Chunk& c) {
    groups_.intra->allgatherv(c.shard.data(), c.data.data(), c.counts, DType::kFloat32, Millis(0));
  }

  void pipelined() {
    const size_t n = chunks_.size();
    std::mutex mu;
    std::condition_variable cv;
    size_t reduced = 0, crossed = 0;
    bool stop = false;
    std::exception_ptr cross_error;
    std::thread cross([&] {
      try {
        for (size_t c = 0; c < n; ++c) {
          {
            std::unique_lock<std::mutex> lock(mu);
            cv.wait(lock, [&] { return reduced > c || stop; });
            if (stop) return;
          }
          groups_.inter->allreduce(std::span<float>(chunks_[c].shard));
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

  std::vector<Chunk> chunks_;
};

// Shared by the sparse strategies: error feedback plus the configured selector.
class SparseSelector {
 public:
  SparseSelector(double density, bool exact) : density_(density), exact_(exact) {}

  // acc := residual + grad; picks k = topk_count(acc) entries; packs them with `offset` added to
  // their indices; zeroes them in the residual.
  // Adds the seconds it took to `seconds`.
  const std::vector<SparseEntry>& select(int bucket, std::span<const float> grad, uint32_t offset, double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    std::span<float> acc = feedback_.accumulate(bucket, grad);
    const size_t k = topk_count(acc.size(), density_);
    const std::string name = "bucket " + std::to_string(bucket);
    if (exact_) {
      exact_topk(acc, k, idx_, name);
    } else {
      mstopk_.select(acc, k, idx_, name);
    }
    entries_.resize(idx_.size());
    pack_entries(acc, idx_, offset, entries_);
    feedback_.mark_sent(bucket, idx_);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return entries_;
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
  bool exact_;
  ErrorFeedback feedback_;
  MSTopK mstopk_;
  std::vector<uint32_t> idx_;
  std::vector<SparseEntry> entries_;
};

// ---- topk: TopK-SGD with a sparse all-gather ----
class SparseAllgather final : public GradientExchange {
 public:
  SparseAllgather(CommGroups& g, const ExchangeConfig& c)
      : GradientExchange("topk", g), selector_(c.density, c.selector == "exact") {}
  size_t run(int bucket, std::span<float> grad) override {
    const auto& mine = selector_.select(bucket, grad, 0, select_seconds_);
    Communicator& world = *groups_.world;
    gathered_.resize(mine.size() * world.size());
    world.allgather(mine.data(), gathered_.data(), mine.size() * sizeof(SparseEntry), DType::kUInt8, Millis(0));
    std::fill(grad.begin(), grad.end(), 0.0f);
    scatter_add(grad, gathered_);
    return mine.size();
  }
  void add_residual(int bucket, std::span<float> out) const override { selector_.add_residual(bucket, out, 0); }
  std::map<int, std::vector<float>> residuals() const override { return selector_.residuals(); }
  void restore_residuals(const std::map<int, std::vector<float>>& r) override { selector_.restore(r); }

 private:
  SparseSelector selector_;
  std::vector<SparseEntry> gathered_;
};

// ---- hitopk: hierarchical top-k ----
class HierarchicalTopk final : public GradientExchange {
 public:
  HierarchicalTopk(CommGroups& g, const ExchangeConfig& c)
      : GradientExchange("hitopk", g), density_(c.density), selector_(c.density, c.selector == "exact") {}
  size_t run(int bucket, std::span<float> grad) override {
    Communicator& intra = *groups_.intra;
    Communicator& inter = *groups_.inter;
    const int n = intra.size(), m = inter.size(), me = intra.rank();
    const auto counts = even_split(grad.size(), n);
    size_t offset = 0;
    for (int l = 0; l < me; ++l) offset += counts[l];

    // 1. Dense reduce-scatter on the fast links: this rank owns shard `me`, summed over its node.
    shard_.resize(counts[me]);
    intra.reduce_scatter(grad.data(), shard_.data(), counts, DType::kFloat32, ReduceOp::kSum, Millis(0));
    // 2. Error feedback and top-k on the shard (indices made bucket-global).
    const auto& mine = selector_.select(bucket, shard_, static_cast<uint32_t>(offset), select_seconds_);
    // 3. Sparse all-gather across nodes among ranks owning the same shard.
    node_entries_.resize(mine.size() * m);
    inter.allgather(mine.data(), node_entries_.data(), mine.size() * sizeof(SparseEntry), DType::kUInt8, Millis(0));
    // 4. All-gather every shard's pairs inside the node (shard l has m * k_l pairs, k_l from its size).
    std::vector<size_t> bytes(n);
    size_t total = 0;
    for (int l = 0; l < n; ++l) {
      bytes[l] = topk_count(counts[l], density_) * m * sizeof(SparseEntry);
      total += bytes[l];
    }
    all_entries_.resize(total / sizeof(SparseEntry));
    intra.allgatherv(node_entries_.data(), all_entries_.data(), bytes, DType::kUInt8, Millis(0));
    // 5. Scatter-add into the dense bucket.
    std::fill(grad.begin(), grad.end(), 0.0f);
    scatter_add(grad, all_entries_);
    return mine.size();
  }
  size_t residual_size(size_t bucket_size) const override {
    return even_split(bucket_size, groups_.intra->size())[groups_.intra->rank()];
  }
  void add_residual(int bucket, std::span<float> out) const override {
    const auto counts = even_split(out.size(), groups_.intra->size());
    size_t offset = 0;
    for (int l = 0; l < groups_.intra->rank(); ++l) offset += counts[l];
    selector_.add_residual(bucket, out, offset);
  }
  std::map<int, std::vector<float>> residuals() const override { return selector_.residuals(); }
  void restore_residuals(const std::map<int, std::vector<float>>& r) override { selector_.restore(r); }

 private:
  double density_;
  SparseSelector selector_;
  std::vector<float> shard_;
  std::vector<SparseEntry> node_entries_, all_entries_;
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
  if (s == "torus" || s == "hitopk") groups.topology.require_uniform("communication.strategy", "'" + s + "'");
  if (s == "dense") return std::make_unique<DenseAllreduce>(groups);
  if (s == "torus") return std::make_unique<TorusAllreduce>(groups);
  if (s == "topk") return std::make_unique<SparseAllgather>(groups, c);
  return std::make_unique<HierarchicalTopk>(groups, c);
}

}  // namespace tessera
