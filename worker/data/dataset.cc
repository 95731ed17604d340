#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/error.h"

namespace tessera {
namespace {

class SyntheticDataset final : public Dataset {
 public:
  explicit SyntheticDataset(const SyntheticConfig& c) : c_(c) {
    Sample s = generate(0);
    input_ = s.input.shape();
    target_ = s.target.shape();
  }
  uint64_t size() const override { return c_.samples; }
  Shape input_shape() const override { return input_; }
  Shape target_shape() const override { return target_; }
  Sample get(uint64_t index) const override {
    TESSERA_CHECK_LT(index, c_.samples, "sample index");
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = memo_.find(index);
      if (it != memo_.end()) return it->second;
    }
    Sample s = generate(index);
    const size_t bytes = (s.input.numel() + s.target.numel()) * sizeof(float);
    std::lock_guard<std::mutex> lock(mu_);
    if (memo_used_ + bytes <= c_.memo_bytes && memo_.emplace(index, s).second) memo_used_ += bytes;
    return s;
  }

 private:
  Sample generate(uint64_t index) const {
    if (c_.kind == "cosmo") return cosmo_sample(c_.size, c_.seed, index);
    if (c_.kind == "shapes") return shapes_sample(c_.size, c_.classes, c_.seed, index);
    return image_sample(c_.size, c_.classes, c_.seed, index, c_.channels);
  }
  SyntheticConfig c_;
  Shape input_, target_;
  mutable std::mutex mu_;
  mutable std::map<uint64_t, Sample> memo_;  // GUARDED_BY(mu_)
  mutable size_t memo_used_ = 0;
};

}  // namespace

Tensor crop_volume(const Tensor& v, const VolumeBox& box) {
  const bool labels = v.rank() == 3;
  TESSERA_CHECK(v.rank() == 4 || labels, "crop of ", shape_str(v.shape()));
  const int64_t c = labels ? 1 : v.dim(0);
  const int64_t D = v.dim(-3), H = v.dim(-2), W = v.dim(-1);
  const int64_t d = box.end[0] - box.begin[0], h = box.end[1] - box.begin[1], w = box.end[2] - box.begin[2];
  TESSERA_CHECK(box.begin[0] >= 0 && box.end[0] <= D && box.begin[1] >= 0 && box.end[1] <= H && box.begin[2] >= 0 &&
                    box.end[2] <= W && d > 0 && h > 0 && w > 0,
                "box ", box.str(), " outside ", shape_str(v.shape()));
  Tensor out(labels ? Shape{d, h, w} : Shape{c, d, h, w});
  float* o = out.data();
  for (int64_t ci = 0; ci < c; ++ci)
    for (int64_t z = 0; z < d; ++z)
      for (int64_t y = 0; y < h; ++y) {
        const float* src = v.data() + ((ci * D + box.begin[0] + z) * H + box.begin[1] + y) * W + box.begin[2];
        std::memcpy(o, src, w * sizeof(float));
        o += w;
      }
  return out;
}

Sample Dataset::get_block(uint64_t index, const VolumeBox& box) const {
  Sample s = get(index);
  if (box == VolumeBox{} || s.input.rank() != 4) return s;
  s.input = crop_volume(s.input, box);
  if (s.target.rank() == 3) s.target = crop_volume(s.target, box);
  return s;
}

std::unique_ptr<Dataset> make_synthetic(const SyntheticConfig& config) {
  SyntheticConfig c = config;
  if (c.kind != "cosmo" && c.kind != "shapes" && c.kind != "images")
    throw ConfigError("dataset.synthetic", "unknown kind '" + c.kind + "' (expected cosmo, shapes or images)");
  if (c.samples < 1) throw ConfigError("dataset.samples", "must be positive");
  if (c.kind == "cosmo" && (c.size < 4 || (c.size & (c.size - 1))))
    throw ConfigError("dataset.size", detail::concat(c.size, ": cosmo fields need a power of two, at least 4"));
  if (c.size < 4) throw ConfigError("dataset.size", detail::concat(c.size, " is too small"));
  if (c.classes == 0) c.classes = c.kind == "shapes" ? 3 : 10;
  if (c.kind == "shapes" && c.classes != 3) throw ConfigError("dataset.classes", "shapes have exactly 3 classes");
  if (c.classes < 2) throw ConfigError("dataset.classes", "need at least 2");
  return std::make_unique<SyntheticDataset>(c);
}

std::vector<uint64_t> epoch_order(uint64_t size, uint64_t seed, int epoch) {
  std::vector<uint64_t> order(size);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

std::pair<std::unique_ptr<Dataset>, std::unique_ptr<Dataset>> split_validation(std::shared_ptr<const Dataset> all,
                                                                               double fraction, uint64_t seed) {
  const uint64_t n = all->size();
  const auto held = static_cast<uint64_t>(std::max<double>(1.0, std::round(fraction * static_cast<double>(n))));
  if (held >= n)
    throw ConfigError("spec.dataset.validationSplit",
                      detail::concat(fraction, " of ", detail::count(n, "sample"), " leaves no sample to train on"));
  std::vector<uint64_t> order = epoch_order(n, seed, -1);  // not any epoch's training order
  std::vector<uint64_t> val(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(held));
  std::vector<uint64_t> train(order.begin() + static_cast<std::ptrdiff_t>(held), order.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
  return {std::make_unique<Subset>(all, std::move(train)), std::make_unique<Subset>(all, std::move(val))};
}

std::vector<uint64_t> shard_batch(const std::vector<uint64_t>& order, int64_t step, int global_batch, int replica,
                                  int replicas) {
  TESSERA_CHECK(replicas > 0 && global_batch % replicas == 0, "global batch ", global_batch, " over ", replicas,
                " replicas");
  const int64_t b = global_batch / replicas;
  const int64_t start = step * global_batch + replica * b;
  TESSERA_CHECK_LE(static_cast<size_t>(start + b), order.size(), "step ", step, " past the epoch");
  return std::vector<uint64_t>(order.begin() + start, order.begin() + start + b);
}

Batch stack_samples(const std::vector<Sample>& samples) {
  TESSERA_CHECK(!samples.empty(), "empty batch");
  const int64_t b = static_cast<int64_t>(samples.size());
  Shape is = {b}, ts = {b};
  for (int64_t d : samples[0].input.shape()) is.push_back(d);
  for (int64_t d : samples[0].target.shape()) ts.push_back(d);
  Batch out{Tensor(is), Tensor(ts)};
  const int64_t in_n = samples[0].input.numel(), t_n = samples[0].target.numel();
  for (int64_t i = 0; i < b; ++i) {
    TESSERA_CHECK(samples[i].input.numel() == in_n && samples[i].target.numel() == t_n, "samples of different shapes");
    std::memcpy(out.inputs.data() + i * in_n, samples[i].input.data(), in_n * sizeof(float));
    std::memcpy(out.targets.data() + i * t_n, samples[i].target.data(), t_n * sizeof(float));
  }
  return out;
}

Batch stack(const Dataset& data, const std::vector<uint64_t>& indices) {
  std::vector<Sample> samples;
  samples.reserve(indices.size());
  for (uint64_t i : indices) samples.push_back(data.get(i));
  return stack_samples(samples);
}

}  // namespace tessera
