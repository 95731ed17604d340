#include "worker/compress/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "common/error.h"

namespace tessera {
namespace {

// |x| as the bit pattern of a non-negative float: orders exactly like the magnitude, and every
// value >= kNonFinite is Inf or NaN.
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kNonFinite = 0x7f800000u;

inline uint32_t abs_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u & kAbsMask;
}

[[noreturn]] void throw_non_finite(std::span<const float> x, std::string_view bucket) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i]))
      throw NumericError(detail::concat("bucket '", bucket, "': gradient element ", i, " of ", x.size(), " is ",
                                        std::isnan(x[i]) ? "NaN" : "Inf"));
  }
  TESSERA_CHECK(false, "non-finite element reported but not found in bucket '", bucket, "'");
}

inline uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

void check_k(size_t k, size_t n, std::string_view bucket) {
  if (k > n)
    throw std::invalid_argument(
        detail::concat("top-k on bucket '", bucket, "': k=", k, " exceeds its ", n, " entries"));
}

}  // namespace

void check_finite(std::span<const float> x, std::string_view bucket) {
  uint32_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, abs_bits(x[i]));
  if (worst >= kNonFinite) throw_non_finite(x, bucket);
}

size_t topk_count(size_t n, double density) {
  if (n == 0) return 0;
  if (!(density > 0.0 && density <= 1.0)) throw ConfigError("density", detail::concat(density, " is outside (0, 1]"));
  size_t k = static_cast<size_t>(std::ceil(density * static_cast<double>(n)));
  return std::clamp<size_t>(k, 1, n);
}

void exact_topk(std::span<const float> x, size_t k, std::vector<uint32_t>& idx, std::string_view bucket) {
  check_k(k, x.size(), bucket);
  // Magnitudes as ordered integers, contiguous, so nth_element runs on plain values; then one pass
  // takes the entries above the k-th magnitude and fills up with entries equal to it.
  std::vector<uint32_t> mags(x.size());
  uint32_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, mags[i] = abs_bits(x[i]));
  if (worst >= kNonFinite) throw_non_finite(x, bucket);
  idx.clear();
  if (k == 0) return;
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<uint32_t>());
  const uint32_t t = mags[k - 1];
  idx.reserve(k);
  for (size_t i = 0; i < x.size(); ++i)
    if (abs_bits(x[i]) > t) idx.push_back(static_cast<uint32_t>(i));
  for (size_t i = 0; i < x.size() && idx.size() < k; ++i)
    if (abs_bits(x[i]) == t) idx.push_back(static_cast<uint32_t>(i));
}

uint32_t MSTopK::sample_threshold(std::span<const float> x, size_t rank_from_top) {
  const size_t d = x.size();
  // Runs of kRun consecutive entries (one cache line), one run at a random offset inside each of
  // s/kRun equal strides: spread over the whole gradient, and one memory access per run.
  constexpr size_t kRun = 16;
  const size_t runs = std::max<size_t>(1, std::min(d, options_.sample_size) / kRun);
  const double stride = static_cast<double>(d) / static_cast<double>(runs);
  sample_.clear();
  for (size_t i = 0; i < runs; ++i) {
    size_t lo = static_cast<size_t>(i * stride);
    size_t hi = std::min(d, static_cast<size_t>((i + 1) * stride));
    size_t span = hi > lo + kRun ? hi - lo - kRun : 0;
    size_t start = lo + (span ? next_random(rng_) % (span + 1) : 0);
    for (size_t j = start; j < std::min(d, start + kRun); ++j) sample_.push_back(abs_bits(x[j]));
  }
  rank_from_top = std::min(rank_from_top, sample_.size());
  std::nth_element(sample_.begin(), sample_.begin() + (rank_from_top - 1), sample_.end(), std::greater<uint32_t>());
  return std::min(sample_[rank_from_top - 1], kNonFinite - 1);
}

bool MSTopK::gather(std::span<const float> x, uint32_t t, size_t max_ties) {
  const float* p = x.data();
  const size_t d = x.size();
  constexpr size_t kBlock = 8;
  size_t na = 0, nt = 0;
  uint32_t worst = 0;  // the largest magnitude seen: every non-finite entry is above t, so in a scanned block
  // Branch-free: every entry is written, and the count moves on only for a candidate. Candidates are
  // (magnitude, index) keys, so the selection compares contiguous integers.
  auto scan = [&](size_t from, size_t to) {
    if (na + kBlock > above_.size()) above_.resize(std::max(2 * above_.size(), na + kBlock));
    if (nt + kBlock > ties_.size()) ties_.resize(std::max(2 * ties_.size(), nt + kBlock));
    uint64_t* a = above_.data();
    uint32_t* e = ties_.data();
    for (size_t j = from; j < to; ++j) {
      const uint32_t u = abs_bits(p[j]);
      a[na] = (static_cast<uint64_t>(u) << 32) | j;
      na += u > t;
      e[nt] = static_cast<uint32_t>(j);
      nt += (u == t) & (nt < max_ties);
    }
  };
  size_t i = 0;
  for (; i + kBlock <= d; i += kBlock) {
    uint32_t m = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      uint32_t u;
      std::memcpy(&u, p + i + j, sizeof(u));
      m = std::max(m, u & kAbsMask);
    }
    worst = std::max(worst, m);
    if (m >= t) scan(i, i + kBlock);
  }
  for (size_t j = i; j < d; ++j) worst = std::max(worst, abs_bits(p[j]));
  scan(i, d);
  above_count_ = na;
  ties_count_ = nt;
  return worst < kNonFinite;
}

void MSTopK::select(std::span<const float> x, size_t k, std::vector<uint32_t>& idx, std::string_view bucket) {
  const size_t d = x.size();
  check_k(k, d, bucket);
  stats_ = Stats{};
  if (k == 0 || k == d || d < options_.exact_below) {
    stats_.fell_back = true;
    stats_.passes = 1;
    exact_topk(x, k, idx, bucket);
    return;
  }
  const size_t s = std::max<size_t>(16, std::min(d, options_.sample_size) / 16 * 16);
  // Expected number of sampled entries at or above the true k-th magnitude, plus a margin of four
  // standard deviations so the pass gathers at least k candidates with high probability.
  const double expect = static_cast<double>(k) * static_cast<double>(s) / static_cast<double>(d);
  size_t rank = static_cast<size_t>(std::ceil(expect + 4.0 * std::sqrt(expect) + 4.0));
  for (;;) {
    if (rank >= s) break;  // the sample cannot separate the top k: use the exact selector
    const uint32_t t = sample_threshold(x, rank);
    if (t == 0) break;  // more than d-k zeros: the band would be most of the gradient
    ++stats_.passes;
    if (!gather(x, t, k)) throw_non_finite(x, bucket);
    stats_.candidates = above_count_ + ties_count_;
    if (above_count_ >= k) {
      const auto end = above_.begin() + static_cast<std::ptrdiff_t>(above_count_);
      std::nth_element(above_.begin(), above_.begin() + static_cast<std::ptrdiff_t>(k - 1), end,
                       std::greater<uint64_t>());
      idx.resize(k);
      for (size_t j = 0; j < k; ++j) idx[j] = static_cast<uint32_t>(above_[j]);  // the index half of the key
      return;
    }
    if (above_count_ + ties_count_ >= k) {
      idx.resize(above_count_);
      for (size_t j = 0; j < above_count_; ++j) idx[j] = static_cast<uint32_t>(above_[j]);
      idx.insert(idx.end(), ties_.begin(), ties_.begin() + static_cast<std::ptrdiff_t>(k - above_count_));
      return;
    }
    rank *= 4;  // threshold too high: lower it
  }
  stats_.fell_back = true;
  ++stats_.passes;
  exact_topk(x, k, idx, bucket);
}

}  // namespace tessera
