#include "worker/data/dataset_index.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "worker/core/checksum.h"
#include "worker/data/filesystem.h"
#include "worker/data/synthetic.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "manifest.tsv";
constexpr size_t kScanBytes = size_t{64} << 20;  // a volume is scanned in slabs of about this many bytes

std::string index_command(const std::string& dir) { return "`tessera data index " + dir + "`"; }

double mb(uint64_t bytes) { return std::round(bytes / 1e5) / 10; }

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// "int16 [4, 64, 64, 64]" back into an ArrayInfo.
ArrayInfo parse_info(const std::string& text, const std::string& where) {
  static const std::regex kInfo("(\\S+) \\[([0-9, ]*)\\]");
  std::smatch m;
  if (!std::regex_match(text, m, kInfo)) throw ConfigError("dataset.path", where + ": malformed array '" + text + "'");
  ArrayInfo info;
  info.type = m[1];
  info.floating = starts_with(info.type, "float");
  std::string dims = m[2];
  static const std::regex kNumber("[0-9]+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), kNumber); it != std::sregex_iterator(); ++it) {
    if (it->length() > 9 || std::stoll(it->str()) < 1)
      throw ConfigError("dataset.path", where + ": malformed array '" + text + "'");
    info.shape.push_back(std::stoll(it->str()));
  }
  return info;
}

// The checksum and size of a file, read in pieces.
std::pair<uint64_t, uint64_t> file_sum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("'" + path + "': cannot open");
  std::vector<char> buf(size_t{4} << 20);
  uint64_t h = kFnv1a64Basis, n = 0;
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = static_cast<size_t>(in.gcount());
    h = fnv1a64(buf.data(), got, h);
    n += got;
  }
  if (in.bad()) throw Error("'" + path + "': read failed");
  return {h, n};
}

std::string hex(uint64_t v) {
  char s[20];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

void write_index(const std::string& dir, const DatasetIndex& x) {
  std::ostringstream o;
  o.precision(9);  // the statistics of standardize round-trip as float
  o << "# tessera-dataset v2\n"
    << "layout=" << x.layout << "\n"
    << "input=" << (x.input_key.empty() ? "-" : x.input_key) << " " << x.input.str() << "\n"
    << "target=" << (x.target_key.empty() ? "-" : x.target_key) << " " << x.target.str() << "\n"
    << "transform=" << x.transform << "\n"
    << "classes=" << x.classes << "\n"
    << "samples=" << x.entries.size() << "\n";
  for (const auto& e : x.entries) {
    o << e.file << "\t" << e.bytes << "\t" << hex(e.sum);
    if (!e.target_file.empty()) o << "\t" << e.target_file << "\t" << e.target_bytes << "\t" << hex(e.target_sum);
    if (!e.mean.empty()) {
      o << "\t";
      for (size_t c = 0; c < e.mean.size(); ++c) o << (c ? "," : "") << e.mean[c] << ":" << e.stdev[c];
    }
    o << "\n";
  }
  PosixFileSystem().write_atomic(dir + "/" + kManifest, o.str());
}

// The files of a dataset directory, relative and sorted: HDF5 files, or the input halves of .npy pairs.
struct Scan {
  std::vector<std::string> h5, npy_x;
  size_t ignored = 0;
};

Scan scan(const std::string& dir) {
  Scan s;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) throw Error("'" + dir + "': cannot list: " + ec.message());
    if (!it->is_regular_file()) continue;
    const std::string rel = fs::relative(it->path(), dir).string();
    const std::string name = it->path().filename().string();
    if (ends_with(name, ".h5") || ends_with(name, ".hdf5")) s.h5.push_back(rel);
    else if (ends_with(name, "_x.npy")) s.npy_x.push_back(rel);
    else if (!ends_with(name, "_y.npy") && name != kManifest) ++s.ignored;
  }
  if (ec) throw Error("'" + dir + "': cannot list: " + ec.message());
  std::sort(s.h5.begin(), s.h5.end());
  std::sort(s.npy_x.begin(), s.npy_x.end());
  return s;
}

std::string names(const std::map<std::string, ArrayInfo>& arrays) {
  std::string out;
  for (const auto& [k, v] : arrays) out += (out.empty() ? "'" : ", '") + k + "' " + v.str();
  return out.empty() ? "none" : out;
}

// Which end of a 4-d regression volume holds the channels.
bool detect_channels_last(const std::string& file, const ArrayInfo& in, const std::string& option) {
  if (option == "last") return true;
  if (option == "first") return false;
  const Shape& s = in.shape;
  if (s[1] == s[2] && s[2] == s[3]) return false;
  if (s[0] == s[1] && s[1] == s[2]) return true;
  if (s[0] <= 16) return false;
  if (s[3] <= 16) return true;
  throw Error(detail::concat("'", file, "': cannot tell which dimension of ", shape_str(s),
                             " holds the channels; pass --channels first or --channels last"));
}

// Detects the layout from the first sample.
DatasetIndex detect(const std::string& dir, const std::string& first, bool npy, const IndexOptions& o) {
  DatasetIndex x;
  const std::string path = dir + "/" + first;
  if (npy) {
    if (!o.layout.empty() && o.layout != "unet-npy")
      throw ConfigError("--layout", "'" + o.layout + "' does not fit .npy pairs (they are unet-npy)");
    if (!o.input_key.empty() || !o.target_key.empty())
      throw ConfigError(o.input_key.empty() ? "--target-key" : "--input-key", ".npy files hold one unnamed array each");
    x.layout = "unet-npy";
    return x;
  }
  const auto arrays = h5_arrays(path);
  auto pick = [&](const std::string& given, std::initializer_list<const char*> defaults, const char* flag) {
    if (!given.empty()) {
      if (!arrays.count(given))
        throw Error(detail::concat("'", path, "' has no dataset '", given, "' (", flag, "); it has ", names(arrays)));
      return given;
    }
    for (const char* d : defaults)
      if (arrays.count(d)) return std::string(d);
    std::string expected;
    for (const char* d : defaults) expected += (expected.empty() ? "'" : " or '") + std::string(d) + "'";
    throw Error(
        detail::concat("'", path, "' has no dataset ", expected, "; it has ", names(arrays), ". Name it with ", flag));
  };
  x.input_key = pick(o.input_key, {"full", "volume"}, "--input-key");
  x.target_key = pick(o.target_key, {"unitPar", "segmentation"}, "--target-key");
  const ArrayInfo& in = arrays.at(x.input_key);
  const ArrayInfo& t = arrays.at(x.target_key);
  const bool segmentation = t.shape.size() >= 3;
  if (!segmentation) {
    if (in.shape.size() != 4)
      throw Error(detail::concat("'", path, "': ", x.input_key, " is ", in.str(),
                                 "; a regression volume is (C, D, H, W) or (D, H, W, C)"));
    x.layout = detect_channels_last(path, in,
                                    o.layout == "cosmo-channels-last" ? "last"
                                    : o.layout == "cosmo"             ? "first"
                                                                      : o.channels)
                   ? "cosmo-channels-last"
                   : "cosmo";
  } else {
    if (o.channels == "last") throw ConfigError("--channels", "segmentation volumes are (C, D, H, W) or (D, H, W)");
    x.layout = "unet";
  }
  if (!o.layout.empty() && o.layout != x.layout)
    throw ConfigError("--layout",
                      detail::concat("'", o.layout, "' does not fit '", path, "': ", x.target_key, " is ", t.str(),
                                     segmentation ? " (per-voxel labels: layout unet)" : " (regression targets)"));
  return x;
}

// Checks a sample's arrays against the first sample's (or, for the first, on their own).
void check_shapes(const DatasetIndex& x, const std::string& in_path, const std::string& t_path, const ArrayInfo& in,
                  const ArrayInfo& t, const std::string& first) {
  const ArrayRef ir{in_path, x.input_key}, tr{t_path, x.target_key};
  if (x.entries.empty()) {
    if (x.segmentation()) {
      if (in.shape.size() != 3 && in.shape.size() != 4)
        throw Error(ir.str() + " is " + in.str() + "; a segmentation volume is (C, D, H, W) or (D, H, W)");
      const Shape spatial(in.shape.end() - 3, in.shape.end());
      const Shape labels = t.shape.size() == 4 && t.shape[0] == 1 ? Shape(t.shape.begin() + 1, t.shape.end()) : t.shape;
      if (labels != spatial)
        throw Error(detail::concat(tr.str(), " is ", t.str(), " but its volume is ", in.str(),
                                   ": labels are (D, H, W) or (1, D, H, W) of the volume's D, H, W"));
      if (t.floating) log_warn(tr.str(), " holds floats; labels are read as integers and checked to be whole");
    } else if (t.shape.size() != 1) {
      throw Error(tr.str() + " is " + t.str() + "; regression targets are one vector");
    }
    return;
  }
  auto differs = [&](const ArrayRef& r, const ArrayInfo& got, const ArrayInfo& want) {
    if (got.shape == want.shape && got.type == want.type) return;
    throw Error(detail::concat(r.str(), " is ", got.str(), " but the first sample's (", first, ") is ", want.str(),
                               "; every sample of a dataset has the same shape and type"));
  };
  differs(ir, in, x.input);
  differs(tr, t, x.target);
}

// Reads what indexing checks and computes: non-finite inputs, regression targets, labels, and the
// per-channel statistics of standardize.
void scan_values(DatasetIndex& x, DatasetIndex::Entry& e, const ArrayRef& in, const ArrayRef& t) {
  const bool need_input = x.input.floating || x.transform == "standardize";
  const int64_t channels = x.volume()[0];
  std::vector<double> sum, sq;  // sized once a slab is read: the header's channel count is not yet known to be real
  double count = 0;
  if (need_input)
    for_each_slab(in, x.input, x.channels_last(), kScanBytes, [&](const Tensor& slab) {
      sum.resize(channels, 0.0);
      sq.resize(channels, 0.0);
      const int64_t per = slab.numel() / channels;
      for (int64_t c = 0; c < channels; ++c) {
        const float* p = slab.data() + c * per;
        double s = 0, q = 0;
        for (int64_t i = 0; i < per; ++i) {
          if (!std::isfinite(p[i])) throw Error(in.str() + " holds NaN or infinite values; fix or remove the file");
          s += p[i];
          q += static_cast<double>(p[i]) * p[i];
        }
        sum[c] += s;
        sq[c] += q;
      }
      count += static_cast<double>(per);
    });
  if (x.transform == "standardize" && count == 0) throw Error(in.str() + " holds no values to standardize");
  if (x.transform == "standardize")
    for (int64_t c = 0; c < channels; ++c) {
      const double mean = sum[c] / count, var = std::max(0.0, sq[c] / count - mean * mean);
      e.mean.push_back(static_cast<float>(mean));
      e.stdev.push_back(var > 0 ? static_cast<float>(std::sqrt(var)) : 1.0f);  // a constant channel stays constant
    }
  if (!x.segmentation()) {
    const ArrayRead targets = read_array(t);  // held here: a span of a temporary's tensor would dangle
    for (float v : targets.values.span())
      if (!std::isfinite(v)) throw Error(t.str() + " holds NaN or infinite targets");
    return;
  }
  for_each_slab(t, x.target, false, kScanBytes, [&](const Tensor& slab) {
    for (float v : slab.span()) {
      if (!(v >= 0) || v != std::floor(v))
        throw Error(detail::concat(t.str(), " holds the label ", v, "; labels are whole numbers from 0"));
      x.classes = std::max(x.classes, static_cast<int>(v) + 1);
    }
  });
}

}  // namespace

Shape DatasetIndex::volume() const {
  const Shape& s = input.shape;
  if (s.size() == 3) return {1, s[0], s[1], s[2]};
  if (channels_last()) return {s[3], s[0], s[1], s[2]};
  return s;
}

Shape DatasetIndex::sample_target() const {
  if (!segmentation()) return target.shape;
  const Shape v = volume();
  return {v[1], v[2], v[3]};
}

std::string DatasetIndex::describe() const {
  auto name = [](const std::string& k) { return k.empty() ? std::string(".npy") : k; };
  return detail::concat("layout ", layout, ", ", name(input_key), " ", input.str(), ", ", name(target_key), " ",
                        target.str(), ", transform ", transform,
                        segmentation() ? detail::concat(", ", classes, " classes") : "");
}

DatasetIndex read_index(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw ConfigError("dataset.path", "'" + dir + "' is not a directory");
    throw ConfigError("dataset.path", "'" + dir + "' has no index (" + kManifest + "): index its files with " +
                                          index_command(dir) + " (or generate a dataset with `tessera data generate`)");
  }
  auto bad = [&](const std::string& what) -> ConfigError {
    return ConfigError("dataset.path", "'" + path + "': " + what + "; re-index with " + index_command(dir));
  };
  std::string line;
  std::getline(in, line);
  if (starts_with(line, "# tessera-imagefolder"))
    throw ConfigError(
        "dataset.path",
        "'" + dir + "' holds an ImageFolder dataset of JPEG images: set spec.dataset.format: imagefolder");
  DatasetIndex x;
  const bool v1 = starts_with(line, "# tessera-dataset v1");
  if (v1) {  // generated before the layouts were recorded: cosmo or unet, detected from the first file
    x.layout = line.find("format=unet") != std::string::npos ? "unet" : "cosmo";
    x.input_key = x.layout == "unet" ? "volume" : "full";
    x.target_key = x.layout == "unet" ? "segmentation" : "unitPar";
    x.transform = x.layout == "unet" ? "none" : "log1p";
    x.classes = 3;
  } else if (line != "# tessera-dataset v2") {
    throw bad("not a Tessera dataset manifest");
  }
  std::optional<uint64_t> listed_samples;  // samples=N, as written since v2
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.find('\t') == std::string::npos) {
      const auto eq = line.find('=');
      if (eq == std::string::npos) throw bad("malformed line '" + line + "'");
      const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
      auto array = [&](std::string& key, ArrayInfo& info) {
        const auto sp = v.find(' ');
        if (sp == std::string::npos) throw bad("malformed line '" + line + "'");
        key = v.substr(0, sp) == "-" ? "" : v.substr(0, sp);
        info = parse_info(v.substr(sp + 1), path);
      };
      if (k == "layout") x.layout = v;
      else if (k == "input") array(x.input_key, x.input);
      else if (k == "target") array(x.target_key, x.target);
      else if (k == "transform") x.transform = v;
      else if (k == "classes") {
        static const std::regex kCount("[0-9]{1,9}");
        if (!std::regex_match(v, kCount)) throw bad("malformed line '" + line + "'");
        x.classes = std::stoi(v);
      } else if (k == "samples") {
        static const std::regex kCount("[0-9]{1,19}");
        if (!std::regex_match(v, kCount)) throw bad("malformed line '" + line + "'");
        listed_samples = std::stoull(v);
      } else {
        // A key this version does not know (a manifest written by a newer one): said, not silently dropped.
        log_warn(path, ": unknown key '", k,
                 "' ignored (this version reads layout, input, target, transform, classes and samples)");
      }
      continue;
    }
    std::vector<std::string> cols;
    std::istringstream ls(line);
    for (std::string c; std::getline(ls, c, '\t');) cols.push_back(c);
    if (cols.size() < 3) throw bad("malformed line '" + line + "'");
    DatasetIndex::Entry e;
    size_t i = 0;
    auto file = [&](std::string& name, uint64_t& bytes, uint64_t& sum) {
      name = cols.at(i);
      // A manifest names files inside its directory only.
      const fs::path rel(name);
      if (name.empty() || rel.is_absolute() ||
          std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; }))
        throw bad("'" + name + "' is not a file inside the dataset directory");
      static const std::regex kBytes("[0-9]{1,19}"), kSum("[0-9a-f]{16}");
      if (!std::regex_match(cols.at(i + 1), kBytes) || !std::regex_match(cols.at(i + 2), kSum))
        throw bad("malformed line '" + line + "'");
      bytes = std::stoull(cols.at(i + 1));
      sum = std::stoull(cols.at(i + 2), nullptr, 16);
      i += 3;
    };
    try {
      file(e.file, e.bytes, e.sum);
      if (x.layout == "unet-npy") file(e.target_file, e.target_bytes, e.target_sum);
      if (x.transform == "standardize") {
        std::istringstream st(cols.at(i));
        for (std::string ms; std::getline(st, ms, ',');) {
          const auto colon = ms.find(':');
          e.mean.push_back(std::stof(ms.substr(0, colon)));
          e.stdev.push_back(std::stof(ms.substr(colon + 1)));
        }
      }
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception&) {
      throw bad("malformed line '" + line + "'");
    }
    x.entries.push_back(std::move(e));
  }
  if (x.entries.empty()) throw bad("lists no samples");
  if (listed_samples && *listed_samples != x.entries.size())
    throw bad(detail::concat("says samples=", *listed_samples, " but lists ", x.entries.size(),
                             " (cut short? `tessera data index` writes it again)"));
  static const std::vector<std::string> kLayouts = {"cosmo", "cosmo-channels-last", "unet", "unet-npy"};
  if (std::find(kLayouts.begin(), kLayouts.end(), x.layout) == kLayouts.end())
    throw bad("unknown layout '" + x.layout + "'");
  if (x.transform != "log1p" && x.transform != "none" && x.transform != "standardize")
    throw bad("unknown transform '" + x.transform + "'");
  if (v1) {
    x.input = array_info({dir + "/" + x.entries[0].file, x.input_key});
    x.target = array_info({dir + "/" + x.entries[0].file, x.target_key});
  }
  if (x.input.shape.empty() || x.target.shape.empty()) throw bad("no input or target array recorded");
  // The shapes the layout implies (the readers index them).
  const size_t in_rank = x.input.shape.size(), t_rank = x.target.shape.size();
  const bool shapes_fit =
      x.segmentation() ? (in_rank == 3 || in_rank == 4) && (t_rank == 3 || t_rank == 4) : in_rank == 4 && t_rank == 1;
  if (!shapes_fit)
    throw bad("its input " + x.input.str() + " and target " + x.target.str() + " do not fit layout " + x.layout);
  if (x.transform == "standardize")
    for (const auto& e : x.entries)
      if (e.mean.size() != static_cast<size_t>(x.volume()[0]) || e.stdev.size() != e.mean.size() ||
          std::any_of(e.stdev.begin(), e.stdev.end(), [](float v) { return !(v > 0) || !std::isfinite(v); }) ||
          std::any_of(e.mean.begin(), e.mean.end(), [](float v) { return !std::isfinite(v); }))
        throw bad("the statistics of '" + e.file + "' do not fit its " + std::to_string(x.volume()[0]) + " channels");
  return x;
}

DatasetIndex index_dataset(const std::string& dir, const IndexOptions& o) {
  if (!o.layout.empty() && o.layout != "cosmo" && o.layout != "cosmo-channels-last" && o.layout != "unet" &&
      o.layout != "unet-npy")
    throw ConfigError("--layout", "'" + o.layout + "' (expected cosmo, cosmo-channels-last, unet or unet-npy)");
  if (!o.transform.empty() && o.transform != "log1p" && o.transform != "none" && o.transform != "standardize")
    throw ConfigError("--transform", "'" + o.transform + "' (expected log1p, none or standardize)");
  if (!o.channels.empty() && o.channels != "first" && o.channels != "last")
    throw ConfigError("--channels", "'" + o.channels + "' (expected first or last)");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError(dir, "is not a directory");
  const Scan files = scan(dir);
  if (!files.h5.empty() && !files.npy_x.empty())
    throw ConfigError(dir,
                      detail::concat("mixes HDF5 files (", files.h5.front(), ") and .npy pairs (", files.npy_x.front(),
                                     "); keep one kind of sample file in a dataset directory"));
  const bool npy = !files.npy_x.empty();
  const std::vector<std::string>& inputs = npy ? files.npy_x : files.h5;
  if (inputs.empty())
    throw ConfigError(
        dir,
        detail::concat("holds no samples: no .h5 or .hdf5 files and no *_x.npy / *_y.npy pairs under it",
                       files.ignored ? detail::concat(" (", detail::count(files.ignored, "other file"), ")") : ""));
  DatasetIndex x = detect(dir, inputs.front(), npy, o);
  x.transform = !o.transform.empty() ? o.transform : x.segmentation() ? "none" : "log1p";
  log_info("indexing ", detail::count(inputs.size(), npy ? "sample pair" : "file"), " under ", dir, " (layout ",
           x.layout, ")");
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  uint64_t total = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DatasetIndex::Entry e;
    e.file = inputs[i];
    const std::string in_path = dir + "/" + e.file;
    std::string t_path = in_path;
    if (npy) {
      e.target_file = e.file.substr(0, e.file.size() - 6) + "_y.npy";
      t_path = dir + "/" + e.target_file;
      if (!fs::is_regular_file(t_path, ec))
        throw Error(detail::concat("'", in_path, "' has no labels: '", t_path,
                                   "' is missing (pairs are NAME_x.npy and NAME_y.npy)"));
    }
    const ArrayInfo in = array_info({in_path, x.input_key}), t = array_info({t_path, x.target_key});
    check_shapes(x, in_path, t_path, in, t, inputs.front());
    if (x.entries.empty()) {
      x.input = in;
      x.target = t;
    }
    scan_values(x, e, {in_path, x.input_key}, {t_path, x.target_key});
    std::tie(e.sum, e.bytes) = file_sum(in_path);
    total += e.bytes;
    if (npy) {
      std::tie(e.target_sum, e.target_bytes) = file_sum(t_path);
      total += e.target_bytes;
    }
    x.entries.push_back(std::move(e));
    const auto now = std::chrono::steady_clock::now();
    if (now - last >= std::chrono::duration<double>(o.progress_seconds) && i + 1 < inputs.size()) {
      const double secs = std::chrono::duration<double>(now - t0).count();
      log_info("indexed ", i + 1, "/", inputs.size(), " (", mb(total), " MB, ", std::lround((i + 1) / secs),
               " files/s)");
      last = now;
    }
  }
  write_index(dir, x);
  log_info("indexed ", detail::count(x.entries.size(), "sample"), " (", mb(total), " MB) in ",
           std::lround(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 10) / 10.0, " s",
           files.ignored ? detail::concat("; ", detail::count(files.ignored, "other file"), " ignored") : "");
  return x;
}

void verify_dataset(const std::string& dir) {
  const DatasetIndex x = read_index(dir);
  auto check = [&](const std::string& rel, uint64_t bytes, uint64_t sum) {
    const std::string path = dir + "/" + rel;
    std::pair<uint64_t, uint64_t> got;
    try {
      got = file_sum(path);
    } catch (const Error& e) {
      throw Error("dataset '" + dir + "': sample file missing or unreadable: " + e.what());
    }
    if (got.second != bytes || got.first != sum)
      throw Error("dataset '" + dir + "': sample file '" + path +
                  "' does not match the manifest (corrupt or changed since indexing)");
  };
  for (const auto& e : x.entries) {
    check(e.file, e.bytes, e.sum);
    if (!e.target_file.empty()) check(e.target_file, e.target_bytes, e.target_sum);
  }
}

namespace {

// Makes out_dir ready for a new dataset: new or empty, or (with replace) holding only a dataset.
void prepare_output(const std::string& out_dir, bool replace) {
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
    throw ConfigError(
        "--out", detail::concat("'", out_dir, "' is not empty (", detail::count(dataset.size() + other.size(), "file"),
                                "); choose a new directory, or pass --replace to replace the dataset there"));
  if (!other.empty())
    throw ConfigError("--out",
                      detail::concat("'", out_dir, "' holds ", other.front().filename().string(),
                                     ", which is not part of a dataset; --replace removes only a dataset's files"));
  for (const auto& p : dataset) fs::remove(p);
}

}  // namespace

void generate_dataset(const std::string& kind, uint64_t samples, int size, const std::string& out_dir, uint64_t seed,
                      bool int16, bool replace) {
  if (kind != "cosmoflow" && kind != "unet") throw ConfigError("--kind", "'" + kind + "' (expected cosmoflow or unet)");
  if (samples < 1) throw ConfigError("--samples", "must be positive");
  if (kind == "cosmoflow" && (size < 4 || (size & (size - 1))))
    throw ConfigError("--size", "cosmoflow needs a power of two");
  if (size < 4) throw ConfigError("--size", "must be at least 4");
  if (kind == "unet" && size % 4) throw ConfigError("--size", detail::concat(size, ": unet3d needs a multiple of 4"));
  prepare_output(out_dir, replace);
  PosixFileSystem pfs;
  pfs.make_dir(out_dir);
  const bool cosmo = kind == "cosmoflow";
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  for (uint64_t i = 0; i < samples; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "sample-%06llu.h5", static_cast<unsigned long long>(i));
    const std::string path = out_dir + "/" + name;
    Sample s = cosmo ? cosmo_sample(size, seed, i, true) : shapes_sample(size, 3, seed, i);
    if (cosmo && int16)
      for (float& v : s.input.span()) v = std::min(32767.0f, std::round(v));  // counts
    const std::string tmp = path + ".tmp";
    if (cosmo) write_h5_sample(tmp, "full", s.input, "unitPar", s.target, int16, false);
    else write_h5_sample(tmp, "volume", s.input, "segmentation", s.target, false, true);
    fs::rename(tmp, path);
    const auto now = std::chrono::steady_clock::now();
    if (now - last > std::chrono::seconds(5) || i + 1 == samples) {
      const double secs = std::chrono::duration<double>(now - t0).count();
      log_info("generated ", i + 1, "/", samples, " samples (", std::lround((i + 1) / secs), " samples/s)");
      last = now;
    }
  }
  index_dataset(out_dir, IndexOptions{cosmo ? "cosmo" : "unet", "", "", "", "", 5});
}

}  // namespace tessera
