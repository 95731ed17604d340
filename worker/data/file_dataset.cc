#include "worker/data/file_dataset.h"

#include <cmath>
#include <cstring>

#include "common/error.h"

namespace tessera {
namespace {

void put_tensor(std::string& out, const Tensor& t) {
  const uint32_t rank = static_cast<uint32_t>(t.rank());
  out.append(reinterpret_cast<const char*>(&rank), 4);
  for (int64_t d : t.shape()) out.append(reinterpret_cast<const char*>(&d), 8);
  out.append(reinterpret_cast<const char*>(t.data()), t.numel() * sizeof(float));
}

Tensor get_tensor(const std::string& in, size_t& pos) {
  uint32_t rank;
  TESSERA_CHECK(pos + 4 <= in.size(), "cached block truncated");
  std::memcpy(&rank, in.data() + pos, 4);
  pos += 4;
  Shape s(rank);
  for (auto& d : s) {
    std::memcpy(&d, in.data() + pos, 8);
    pos += 8;
  }
  Tensor t(s);
  TESSERA_CHECK(pos + t.numel() * sizeof(float) <= in.size(), "cached block truncated");
  std::memcpy(t.data(), in.data() + pos, t.numel() * sizeof(float));
  pos += t.numel() * sizeof(float);
  return t;
}

std::string dims(const Shape& v) { return detail::concat(v[1], "x", v[2], "x", v[3]); }

}  // namespace

std::array<int64_t, 3> fit_sample(const Shape& volume, const Shape& sample, bool crop, const std::string& dir) {
  if (sample.size() != 4)
    throw ConfigError("spec.model.name",
                      detail::concat("the model takes samples of shape ", shape_str(sample), "; the files under '", dir,
                                     "' hold volumes ", shape_str(volume)));
  if (volume[0] != sample[0])
    throw ConfigError("spec.model.inChannels", detail::concat("the model takes ", detail::count(sample[0], "channel"),
                                                              " but the volumes under '", dir, "' have ", volume[0],
                                                              "; set inChannels: ", volume[0]));
  const std::array<int64_t, 3> want{sample[1], sample[2], sample[3]};
  if (volume[1] == want[0] && volume[2] == want[1] && volume[3] == want[2]) return want;
  bool tiles = true;
  for (int d = 0; d < 3; ++d) tiles = tiles && want[d] <= volume[1 + d] && volume[1 + d] % want[d] == 0;
  const std::string size = detail::concat("inputSize ", want[0], " (samples of ", dims(sample), ")");
  if (!crop) {
    throw ConfigError(
        "spec.model.inputSize",
        detail::concat(size, " does not fit the ", dims(volume), " volumes under '", dir,
                       "': set inputSize: ", volume[1],
                       tiles ? detail::concat(", or spec.dataset.crop: true to train on the ",
                                              (volume[1] / want[0]) * (volume[2] / want[1]) * (volume[3] / want[2]),
                                              " sub-volumes of each")
                             : std::string()));
  }
  if (!tiles)
    throw ConfigError("spec.model.inputSize",
                      detail::concat(size, " does not tile the ", dims(volume), " volumes under '", dir,
                                     "' (spec.dataset.crop cuts each into whole sub-volumes)"));
  return want;
}

FileDataset::FileDataset(const std::string& dir, DatasetIndex index, std::array<int64_t, 3> extent, FileSystem& remote,
                         TieredCache* cache)
    : dir_(dir), index_(std::move(index)), extent_(extent), remote_(remote), cache_(cache) {
  const Shape v = index_.volume();
  if (extent_ == std::array<int64_t, 3>{}) extent_ = {v[1], v[2], v[3]};
  for (int d = 0; d < 3; ++d) {
    TESSERA_CHECK(extent_[d] > 0 && v[1 + d] % extent_[d] == 0, "sample extent does not tile ", shape_str(v));
    tiles_[d] = v[1 + d] / extent_[d];
  }
  per_file_ = static_cast<uint64_t>(tiles_[0] * tiles_[1] * tiles_[2]);
}

FileDataset::FileDataset(const std::string& dir, FileSystem& remote, TieredCache* cache)
    : FileDataset(dir, read_index(dir), std::array<int64_t, 3>{}, remote, cache) {}

Shape FileDataset::input_shape() const { return {index_.volume()[0], extent_[0], extent_[1], extent_[2]}; }

Shape FileDataset::target_shape() const {
  if (index_.segmentation()) return {extent_[0], extent_[1], extent_[2]};
  return index_.target.shape;
}

VolumeBox FileDataset::sub_volume(uint64_t index) const {
  const auto sub = static_cast<int64_t>(index % per_file_);
  const std::array<int64_t, 3> at{sub / (tiles_[1] * tiles_[2]), (sub / tiles_[2]) % tiles_[1], sub % tiles_[2]};
  VolumeBox b;
  for (int d = 0; d < 3; ++d) {
    b.begin[d] = at[d] * extent_[d];
    b.end[d] = b.begin[d] + extent_[d];
  }
  return b;
}

Sample FileDataset::get_block(uint64_t index, const VolumeBox& box) const {
  TESSERA_CHECK_LT(index, size(), "sample index");
  const DatasetIndex::Entry& e = index_.entries[index / per_file_];
  // The block in the file's volume.
  const VolumeBox sub = sub_volume(index);
  VolumeBox abs = sub;
  if (!box.empty())
    for (int d = 0; d < 3; ++d) {
      TESSERA_CHECK(box.begin[d] >= 0 && box.end[d] <= extent_[d] && box.begin[d] < box.end[d], "box ", box.str(),
                    " outside a sample of ", extent_[0], "x", extent_[1], "x", extent_[2]);
      abs.begin[d] = sub.begin[d] + box.begin[d];
      abs.end[d] = sub.begin[d] + box.end[d];
    }
  const std::string in_path = dir_ + "/" + e.file;
  const std::string t_path = e.target_file.empty() ? in_path : dir_ + "/" + e.target_file;
  auto fetch = [&]() {
    ArrayRead in = read_array({in_path, index_.input_key}, abs, index_.channels_last());
    Tensor v = in.values.rank() == 3 ? in.values.reshape({1, in.values.dim(0), in.values.dim(1), in.values.dim(2)})
                                     : in.values;
    if (index_.input.floating)
      for (float x : v.span())
        if (!std::isfinite(x))
          throw Error("'" + in_path + "': the volume holds NaN or infinite values (block " + abs.str() + ")");
    if (index_.transform == "log1p") {
      log1p_inplace(v);
    } else if (index_.transform == "standardize") {
      const int64_t per = v.numel() / v.dim(0);
      for (int64_t c = 0; c < v.dim(0); ++c) {
        const float m = e.mean.at(c), inv = 1.0f / e.stdev.at(c);
        float* p = v.data() + c * per;
        for (int64_t i = 0; i < per; ++i) p[i] = (p[i] - m) * inv;
      }
    }
    ArrayRead t =
        index_.segmentation() ? read_array({t_path, index_.target_key}, abs) : read_array({t_path, index_.target_key});
    Tensor target = t.values;
    if (index_.segmentation() && target.rank() == 4)
      target = target.reshape({target.dim(1), target.dim(2), target.dim(3)});
    remote_.charge_read(in.stored_bytes + t.stored_bytes);
    remote_bytes_ += in.stored_bytes + t.stored_bytes;
    std::string out;
    put_tensor(out, v);
    put_tensor(out, target);
    return out;
  };
  std::string local;
  TieredCache::Blob blob;
  const std::string* bytes = nullptr;
  if (cache_) {
    blob = cache_->get(in_path + "#" + abs.str() + "#" + index_.transform, fetch);
    bytes = blob.get();
  } else {
    local = fetch();
    bytes = &local;
  }
  size_t pos = 0;
  Sample s;
  s.input = get_tensor(*bytes, pos);
  s.target = get_tensor(*bytes, pos);
  return s;
}

}  // namespace tessera
