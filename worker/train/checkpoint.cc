#include "worker/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string_view>

#include <set>

#include "common/error.h"
#include "common/log.h"
#include "worker/comm/communicator.h"
#include "worker/comm/exchange.h"
#include "worker/core/checksum.h"
#include "worker/data/filesystem.h"

namespace tessera {
namespace {

constexpr char kMagic[8] = {'T', 'S', 'R', 'C', 'K', 'P', 'T', '1'};

template <typename T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  Reader(std::string_view s, const std::string& file) : s_(s), file_(file) {}
  template <typename T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view bytes(size_t n) {
    need(n);
    std::string_view v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void need(size_t n) const {
    if (n > s_.size() - pos_) throw Error("checkpoint '" + file_ + "': truncated");
  }
  size_t left() const { return s_.size() - pos_; }

 private:
  std::string_view s_;
  std::string file_;
  size_t pos_ = 0;
};

}  // namespace

std::string checkpoint_file(const std::string& dir, int64_t step, int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "ckpt-%010lld-rank%d.bin", static_cast<long long>(step), rank);
  return dir + "/" + name;
}

void write_checkpoint(FileSystem& fs, const std::string& dir, int64_t step, int rank, const CheckpointData& data) {
  std::string buf(kMagic, sizeof(kMagic));
  put<uint64_t>(buf, data.counters.size());
  for (const auto& [name, v] : data.counters) {
    put<uint32_t>(buf, static_cast<uint32_t>(name.size()));
    buf += name;
    put<int64_t>(buf, v);
  }
  put<uint64_t>(buf, data.arrays.size());
  for (const auto& [name, v] : data.arrays) {
    put<uint32_t>(buf, static_cast<uint32_t>(name.size()));
    buf += name;
    put<uint64_t>(buf, v.size());
    if (!v.empty()) buf.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  put<uint64_t>(buf, fnv1a64(buf));

  try {
    fs.make_dir(dir);
    fs.write_atomic(checkpoint_file(dir, step, rank), buf);
  } catch (const IoError& e) {
    throw IoError(e.path(), std::string("checkpoint: ") + e.what(), e.no_space());
  }
}

CheckpointData read_checkpoint(FileSystem& fs, const std::string& file) {
  std::string bytes;
  try {
    bytes = fs.read(file);
  } catch (const IoError& e) {
    throw IoError(e.path(), std::string("checkpoint: ") + e.what());
  }
  return parse_checkpoint(bytes, file);
}

CheckpointData parse_checkpoint(const std::string& s, const std::string& file) {
  if (s.size() < sizeof(kMagic) + 8 || std::memcmp(s.data(), kMagic, sizeof(kMagic)) != 0)
    throw Error("checkpoint '" + file + "': not a Tessera checkpoint");
  uint64_t stored;
  std::memcpy(&stored, s.data() + s.size() - 8, 8);
  if (fnv1a64(s.data(), s.size() - 8) != stored) throw Error("checkpoint '" + file + "': checksum mismatch (corrupt)");
  Reader r(std::string_view(s).substr(0, s.size() - 8), file);
  r.bytes(sizeof(kMagic));
  CheckpointData d;
  for (uint64_t n = r.get<uint64_t>(); n > 0; --n) {
    std::string name(r.bytes(r.get<uint32_t>()));
    d.counters[name] = r.get<int64_t>();
  }
  for (uint64_t n = r.get<uint64_t>(); n > 0; --n) {
    std::string name(r.bytes(r.get<uint32_t>()));
    const uint64_t count = r.get<uint64_t>();
    if (count > r.left() / sizeof(float))
      throw Error("checkpoint '" + file + "': array '" + name + "' runs past the end");
    const std::string_view raw = r.bytes(count * sizeof(float));
    std::vector<float> v(count);
    if (count) std::memcpy(v.data(), raw.data(), raw.size());
    d.arrays[name] = std::move(v);
  }
  if (r.left() != 0) throw Error("checkpoint '" + file + "': bytes after its last array");
  return d;
}

namespace {
// This rank's files named ckpt-<step>-rank<rank> and a suffix matching `suffix_re`, by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir, int rank,
                                                              const std::string& suffix_re = "\\.bin") {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  const std::regex re("ckpt-(\\d+)-rank" + std::to_string(rank) + suffix_re);
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) out.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

std::optional<int64_t> latest_checkpoint(const std::string& dir, int rank) {
  auto all = list_checkpoints(dir, rank);
  if (all.empty()) return std::nullopt;
  return all.back().first;
}

std::vector<int64_t> checkpoint_steps(const std::string& dir, int rank) {
  std::vector<int64_t> out;
  for (const auto& [step, file] : list_checkpoints(dir, rank)) out.push_back(step);
  return out;
}

int remove_partial_checkpoints(FileSystem& fs, const std::string& dir, int rank) {
  const auto partial = list_checkpoints(dir, rank, "\\.bin\\.tmp\\..+");
  for (const auto& [step, file] : partial) fs.remove(file);
  return static_cast<int>(partial.size());
}

std::map<int, std::vector<double>> summed_bucket_arrays(FileSystem& fs, const std::string& dir, int64_t step, int world,
                                                        const std::vector<size_t>& bucket_sizes,
                                                        const std::string& kind) {
  const std::string prefix = kind + "/";
  std::map<int, std::vector<double>> sum;
  for (int r = 0; r < world; ++r) {
    const std::string file = checkpoint_file(dir, step, r);
    const CheckpointData c = read_checkpoint(fs, file);
    for (const auto& [key, v] : c.arrays) {
      if (key.rfind(prefix, 0) != 0) continue;
      const int b = std::stoi(key.substr(prefix.size()));
      if (b < 0 || static_cast<size_t>(b) >= bucket_sizes.size())
        throw ConfigError("spec.checkpoint.path",
                          detail::concat("'", file, "' holds a ", kind, " of bucket ", b, ", which this job's ",
                                         bucket_sizes.size(), " gradient buckets do not have"));
      const auto off = c.counters.find(kind + "_offset/" + std::to_string(b));
      const size_t offset = off == c.counters.end() ? 0 : static_cast<size_t>(std::max<int64_t>(0, off->second));
      auto& s = sum[b];
      s.resize(bucket_sizes[b], 0.0);
      if (offset > s.size() || v.size() > s.size() - offset)
        throw ConfigError(
            "spec.checkpoint.path",
            detail::concat("'", file, "': the ", kind, " of bucket ", b, " (", v.size(), " entries at ", offset,
                           ") does not fit its ", s.size(), " entries (was spec.communication.bucketSize changed?)"));
      for (size_t i = 0; i < v.size(); ++i) s[offset + i] += v[i];
    }
  }
  return sum;
}

void prune_checkpoints(FileSystem& fs, const std::string& dir, int rank, int keep) {
  auto all = list_checkpoints(dir, rank);
  for (size_t i = 0; i + keep < all.size(); ++i) fs.remove(all[i].second);
}

namespace {

// Rank `rank`'s checkpoint of an elastic job's `step` (see agree_checkpoint), and the file it came from.
CheckpointData read_elastic_step(FileSystem& fs, const std::string& dir, int64_t step, int rank, std::string& from) {
  from = checkpoint_file(dir, step, 0);
  CheckpointData first = read_checkpoint(fs, from);
  const auto w = first.counters.find("world");
  const int64_t writers = w == first.counters.end() ? 1 : std::max<int64_t>(1, w->second);
  // re-sharding the residuals reads every writer's file, and a lost node leaves its ranks' files of
  // the step it was writing unwritten
  for (int64_t r = 1; r < writers; ++r)
    if (const std::string f = checkpoint_file(dir, step, static_cast<int>(r)); !std::filesystem::exists(f))
      throw Error(detail::concat("checkpoint '", f, "' is missing: the gang of ", writers, " ranks that wrote step ",
                                 step, " did not finish it"));
  if (rank % writers == 0) return first;
  from = checkpoint_file(dir, step, static_cast<int>(rank % writers));
  CheckpointData mine = read_checkpoint(fs, from);
  // A file left by an earlier gang that reached the same step is not this step's.
  if (const auto m = mine.counters.find("world"); m == mine.counters.end() || m->second != writers)
    throw Error(detail::concat("checkpoint '", from, "' was written by a gang of ",
                               m == mine.counters.end() ? 1 : m->second, " ranks, rank 0's of step ", step,
                               " by one of ", writers));
  return mine;
}

}  // namespace

AgreedCheckpoint agree_checkpoint(FileSystem& fs, const std::string& dir, int rank, bool elastic, Communicator* world) {
  if (const int partial = remove_partial_checkpoints(fs, dir, rank))
    log_info("removed ", detail::count(partial, "partly written checkpoint"), " of rank ", rank, " in ", dir,
             " (an earlier run stopped while writing)");
  // every gang has a rank 0
  const std::vector<int64_t> steps = checkpoint_steps(dir, elastic ? 0 : rank);
  std::set<int64_t> unreadable;
  AgreedCheckpoint held;  // the newest readable step at most `at_most`, once read
  auto newest_readable = [&](int64_t at_most) -> int64_t {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (*it > at_most || unreadable.count(*it)) continue;
      if (held.step == *it) return held.step;
      try {
        std::string from = checkpoint_file(dir, *it, rank);
        held.data = elastic ? read_elastic_step(fs, dir, *it, rank, from) : read_checkpoint(fs, from);
        held.step = *it;
        held.file = from;
        return held.step;
      } catch (const Error& e) {
        log_warn(e.what(), ": rank ", rank, " resumes from an older checkpoint");
        unreadable.insert(*it);
      }
    }
    return -1;
  };
  int64_t agreed = INT64_MAX;
  for (;;) {
    int64_t v = newest_readable(agreed);
    if (world) world->allreduce(&v, 1, DType::kInt64, ReduceOp::kMin, Millis(0));
    const bool settled = v == agreed || v < 0;
    agreed = v;
    if (settled) break;
  }
  if (agreed < 0) {
    if (!steps.empty()) log_warn("no checkpoint under ", dir, " that every rank can read: training starts at step 0");
    return {};
  }
  return held;
}

std::map<int, std::vector<float>> reshard_residuals(FileSystem& fs, const std::string& dir, int64_t step, int world,
                                                    const std::vector<size_t>& bucket_sizes,
                                                    const GradientExchange& exchange, bool holds) {
  std::map<int, std::vector<double>> sum;  // bucket -> the whole bucket's residual, summed over the writers
  if (holds) sum = summed_bucket_arrays(fs, dir, step, world, bucket_sizes);
  std::map<int, std::vector<float>> out;
  for (size_t b = 0; b < bucket_sizes.size(); ++b) {
    const size_t n = bucket_sizes[b], size = exchange.residual_size(n), offset = exchange.residual_offset(n);
    std::vector<float> mine(size, 0.0f);
    if (auto it = sum.find(static_cast<int>(b)); it != sum.end())
      for (size_t i = 0; i < size; ++i) mine[i] = static_cast<float>(it->second[offset + i]);
    out[static_cast<int>(b)] = std::move(mine);
  }
  return out;
}

}  // namespace tessera
