// Top-k gradient selection: the indices of the k entries of largest magnitude.
//
// exact_topk is the reference (std::nth_element on the magnitudes). MSTopK is the fast selector used
// on the training path: it estimates the threshold from a strided random sample, gathers every entry
// above it in one streaming pass over the gradient (comparing magnitudes as integers, 8 entries at a
// time, so the pass runs near memory bandwidth), and picks exactly k from the small candidate set
// with a selection on (magnitude, index) keys. Its result is exact: the magnitudes are the true top k
// (ties broken any way).
// If the sampled threshold turns out too high it is lowered and the pass repeated; degenerate inputs
// (mostly equal magnitudes) fall back to the exact selector.
//
// Both reject NaN and Inf with NumericError naming the bucket and the element. Indices come back
// unordered. A selector object holds scratch buffers and is not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace tessera {

// Throws NumericError("bucket 'b': element i is NaN") if any element is NaN or infinite.
void check_finite(std::span<const float> x, std::string_view bucket);

// The reference: idx := the k indices of largest |x|. Requires k <= x.size().
void exact_topk(std::span<const float> x, size_t k, std::vector<uint32_t>& idx, std::string_view bucket = "");

class MSTopK {
 public:
  struct Options {
    size_t sample_size = 65536;  // entries sampled to estimate the threshold
    size_t exact_below = 4096;   // gradients shorter than this use exact_topk directly
    uint64_t seed = 0x9e3779b97f4a7c15ull;
  };
  struct Stats {
    size_t passes = 0;       // streaming passes over the gradient in the last call
    size_t candidates = 0;   // entries gathered above the threshold in the last pass
    bool fell_back = false;  // the last call used the exact selector
  };

  MSTopK() : MSTopK(Options{}) {}
  explicit MSTopK(Options options) : options_(options), rng_(options.seed) {}

  // idx := the k indices of largest |x|. Requires k <= x.size().
  void select(std::span<const float> x, size_t k, std::vector<uint32_t>& idx, std::string_view bucket = "");
  const Stats& last() const { return stats_; }

 private:
  uint32_t sample_threshold(std::span<const float> x, size_t rank_from_top);
  // Gathers the entries with |x| > t into above_ (as |x| bits << 32 | index) and the indices of those
  // with |x| == t into ties_ (at most `max_ties`), counting them in above_count_ and ties_count_;
  // false if a non-finite element was seen.
  bool gather(std::span<const float> x, uint32_t t, size_t max_ties);

  Options options_;
  uint64_t rng_;
  Stats stats_;
  std::vector<uint32_t> sample_, ties_;
  std::vector<uint64_t> above_;
  size_t above_count_ = 0, ties_count_ = 0;  // the filled part of above_ and ties_ (they are scratch beyond)
};

// The number of entries a sparse strategy sends for a bucket of n entries at `density` in (0, 1]:
// ceil(density * n), at least 1 when n > 0, at most n.
size_t topk_count(size_t n, double density);

}  // namespace tessera
