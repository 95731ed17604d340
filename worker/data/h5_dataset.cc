#include "worker/data/h5_dataset.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "worker/core/checksum.h"
#include "worker/core/log.h"

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

struct Manifest {
  SampleFormat format = SampleFormat::kCosmo;
  std::vector<std::string> files;
  std::vector<uint64_t> bytes, sums;
};

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.tsv";
  std::ifstream in(path);
  if (!in) throw ConfigError("dataset.path", "no manifest at '" + path + "' (generate one with `tessera data generate`)");
  Manifest m;
  std::string line;
  std::getline(in, line);
  if (line.rfind("# tessera-dataset v1", 0) != 0) throw ConfigError("dataset.path", "'" + path + "' is not a Tessera manifest");
  m.format = line.find("format=unet") != std::string::npos ? SampleFormat::kUNet : SampleFormat::kCosmo;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string file;
    uint64_t bytes = 0;
    std::string sum;
    if (!(ls >> file >> bytes >> sum)) throw ConfigError("dataset.path", "'" + path + "': malformed line '" + line + "'");
    m.files.push_back(dir + "/" + file);
    m.bytes.push_back(bytes);
    m.sums.push_back(std::stoull(sum, nullptr, 16));
  }
  if (m.files.empty()) throw ConfigError("dataset.path", "'" + path + "' lists no samples");
  return m;
}

}  // namespace

Hdf5Dataset::Hdf5Dataset(const std::string& dir, FileSystem& remote, TieredCache* cache)
    : dir_(dir), remote_(remote), cache_(cache) {
  Manifest m = read_manifest(dir);
  format_ = m.format;
  files_ = m.files;
  input_ = sample_volume_shape(files_[0], format_);
  if (format_ == SampleFormat::kCosmo) {
    target_ = read_sample_block(files_[0], format_, VolumeBox{{0, 0, 0}, {1, 1, 1}}).target.shape();
  } else {
    target_ = {input_[1], input_[2], input_[3]};
  }
}

Sample Hdf5Dataset::get_block(uint64_t index, const VolumeBox& box) const {
  TESSERA_CHECK_LT(index, files_.size(), "sample index");
  const std::string& file = files_[index];
  auto fetch = [&]() {
    BlockRead r = read_sample_block(file, format_, box);
    remote_.charge_read(r.stored_bytes);
    remote_bytes_ += r.stored_bytes;
    if (format_ == SampleFormat::kCosmo) log1p_inplace(r.input);  // the transform, off the training thread
    std::string out;
    put_tensor(out, r.input);
    put_tensor(out, r.target);
    return out;
  };
  std::string local;
  TieredCache::Blob blob;
  const std::string* bytes = nullptr;
  if (cache_) {
    blob = cache_->get(file + "#" + box.str(), fetch);
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

namespace {

// Makes out_dir ready for a new dataset: new or empty, or (with replace) holding only a dataset.
void prepare_output(const std::string& out_dir, bool replace) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(out_dir, ec)) return;
  if (!fs::is_directory(out_dir, ec)) throw ConfigError("--out", "'" + out_dir + "' exists and is not a directory");
  static const std::regex kDatasetFile("manifest\\.tsv|sample-[0-9]+\\.h5(\\.tmp)?");
  std::vector<fs::path> dataset, other;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    (e.is_regular_file() && std::regex_match(name, kDatasetFile) ? dataset : other).push_back(e.path());
  }
  if (dataset.empty() && other.empty()) return;
  if (!replace)
    throw ConfigError("--out", detail::concat("'", out_dir, "' is not empty (", detail::count(dataset.size() + other.size(), "file"),
                                              "); choose a new directory, or pass --replace to replace the dataset there"));
  if (!other.empty())
    throw ConfigError("--out", detail::concat("'", out_dir, "' holds ", other.front().filename().string(),
                                              ", which is not part of a dataset; --replace removes only a dataset's files"));
  for (const auto& p : dataset) fs::remove(p);
}

}  // namespace

void generate_dataset(const std::string& kind, uint64_t samples, int size, const std::string& out_dir, uint64_t seed,
                      bool int16, bool replace) {
  if (kind != "cosmoflow" && kind != "unet") throw ConfigError("--kind", "'" + kind + "' (expected cosmoflow or unet)");
  if (samples < 1) throw ConfigError("--samples", "must be positive");
  if (kind == "cosmoflow" && (size < 4 || (size & (size - 1)))) throw ConfigError("--size", "cosmoflow needs a power of two");
  if (size < 4) throw ConfigError("--size", "must be at least 4");
  if (kind == "unet" && size % 4) throw ConfigError("--size", detail::concat(size, ": unet3d needs a multiple of 4"));
  prepare_output(out_dir, replace);
  PosixFileSystem fs;
  fs.make_dir(out_dir);
  const SampleFormat format = kind == "cosmoflow" ? SampleFormat::kCosmo : SampleFormat::kUNet;
  std::string manifest = detail::concat("# tessera-dataset v1 format=", kind == "cosmoflow" ? "cosmo" : "unet",
                                        " samples=", samples, " size=", size, "\n");
  auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  uint64_t total = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "sample-%06llu.h5", static_cast<unsigned long long>(i));
    const std::string path = out_dir + "/" + name;
    Sample s = format == SampleFormat::kCosmo ? cosmo_sample(size, seed, i, true) : shapes_sample(size, 3, seed, i);
    if (format == SampleFormat::kCosmo && int16)
      for (float& v : s.input.span()) v = std::min(32767.0f, std::round(v));  // counts
    const std::string tmp = path + ".tmp";
    write_sample(tmp, format, s.input, s.target, format == SampleFormat::kCosmo && int16);
    std::string bytes = fs.read(tmp);
    std::rename(tmp.c_str(), path.c_str());
    total += bytes.size();
    char sum[32];
    std::snprintf(sum, sizeof(sum), "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
    manifest += detail::concat(name, "\t", bytes.size(), "\t", sum, "\n");
    auto now = std::chrono::steady_clock::now();
    if (now - last > std::chrono::seconds(5) || i + 1 == samples) {
      const double secs = std::chrono::duration<double>(now - t0).count();
      log_info("generated ", i + 1, "/", samples, " samples (", total / 1e6, " MB, ", (i + 1) / secs, " samples/s)");
      last = now;
    }
  }
  fs.write_atomic(out_dir + "/manifest.tsv", manifest);
}

void verify_dataset(const std::string& dir) {
  Manifest m = read_manifest(dir);
  PosixFileSystem fs;
  for (size_t i = 0; i < m.files.size(); ++i) {
    std::string bytes;
    try {
      bytes = fs.read(m.files[i]);
    } catch (const IoError& e) {
      throw Error("dataset '" + dir + "': sample file missing or unreadable: " + e.what());
    }
    if (bytes.size() != m.bytes[i] || fnv1a64(bytes) != m.sums[i])
      throw Error("dataset '" + dir + "': sample file '" + m.files[i] + "' does not match the manifest (corrupt)");
  }
}

}  // namespace tessera
