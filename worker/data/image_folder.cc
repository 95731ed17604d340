#include "worker/data/image_folder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "worker/core/checksum.h"

namespace tessera {
namespace fs = std::filesystem;
namespace {

constexpr const char* kManifest = "manifest.tsv";
constexpr const char* kHeader = "# tessera-imagefolder v1";
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};  // ImageNet's, as torchvision's recipes normalise
constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};
constexpr size_t kListedErrors = 20;

std::string index_command(const std::string& dir) { return "`tessera data index " + dir + "`"; }
double mb(uint64_t bytes) { return std::round(bytes / 1e5) / 10; }

bool is_jpeg_name(const std::string& name) {
  std::string ext = fs::path(name).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg";
}

std::vector<std::string> sorted_entries(const fs::path& dir, bool directories) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code ec2;
    if (directories ? it->is_directory(ec2) : it->is_regular_file(ec2)) out.push_back(it->path().filename().string());
  }
  if (ec) throw Error("'" + dir.string() + "': cannot list: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string hex(uint64_t v) {
  char s[20];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

// The images of one split: class directories (sorted) and their JPEG files (sorted).
struct SplitScan {
  std::vector<std::string> classes;
  std::vector<std::vector<std::string>> files;  // per class, relative to the dataset directory
  size_t ignored = 0;
};

SplitScan scan_split(const std::string& dir, const std::string& split) {
  SplitScan s;
  const fs::path root = fs::path(dir) / split;
  s.ignored = sorted_entries(root, false).size();  // files beside the class directories
  for (const std::string& c : sorted_entries(root, true)) {
    std::vector<std::string> files;
    for (const std::string& f : sorted_entries(root / c, false)) {
      if (is_jpeg_name(f)) files.push_back(split + "/" + c + "/" + f);
      else ++s.ignored;
    }
    if (files.empty())
      throw ConfigError(dir + "/" + split + "/" + c,
                        "an empty class: no .jpg or .jpeg file in it (remove the directory, or add its images)");
    s.classes.push_back(c);
    s.files.push_back(std::move(files));
  }
  if (s.classes.empty())
    throw ConfigError(dir + "/" + split, "holds no class directories (expected " + split + "/<class>/*.jpg)");
  return s;
}

std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 10; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 10) out += detail::concat(" and ", names.size() - 10, " more");
  return out;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Python's round(): halves to even (torchvision's crops round so).
int round_even(double v) { return static_cast<int>(std::nearbyint(v)); }

// Pillow's resampling coefficients along one axis: output pixel i covers input [start, start + count)
// with the given weights (a triangle widened by the shrink factor, normalised).
struct Coefficients {
  std::vector<int> start, count;
  std::vector<float> weights;  // count[i] of them from i * width
  int width = 0;
};

Coefficients coefficients(int in_size, double in0, double in_len, int out_size) {
  const double scale = in_len / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // bilinear: support 1, widened
  Coefficients c;
  c.width = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.start.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.width, 0.0f);
  for (int i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int lo = static_cast<int>(center - support + 0.5), hi = static_cast<int>(center + support + 0.5);
    lo = std::max(lo, 0);
    hi = std::min(hi, in_size);
    const int n = std::min(std::max(hi - lo, 0), c.width);
    double total = 0;
    std::vector<double> w(n);
    for (int k = 0; k < n; ++k) {
      const double t = (k + lo - center + 0.5) / filter_scale;
      w[k] = std::max(0.0, 1.0 - std::abs(t));
      total += w[k];
    }
    for (int k = 0; k < n; ++k)
      c.weights[static_cast<size_t>(i) * c.width + k] = static_cast<float>(total > 0 ? w[k] / total : 0);
    c.start[i] = lo;
    c.count[i] = n;
  }
  return c;
}

std::vector<float> resample_rgb(const uint8_t* rgb, int width, int height, double x0, double y0, double w, double h,
                                int out_w, int out_h) {
  const Coefficients cx = coefficients(width, x0, w, out_w), cy = coefficients(height, y0, h, out_h);
  int row_lo = height, row_hi = 0;
  for (int i = 0; i < out_h; ++i) {
    row_lo = std::min(row_lo, cy.start[i]);
    row_hi = std::max(row_hi, cy.start[i] + cy.count[i]);
  }
  row_hi = std::max(row_hi, row_lo);
  // Horizontal pass over the rows the vertical one needs: (rows, out_w, 3).
  std::vector<float> tmp(static_cast<size_t>(row_hi - row_lo) * out_w * 3);
  for (int r = row_lo; r < row_hi; ++r) {
    const uint8_t* src = rgb + static_cast<size_t>(r) * width * 3;
    float* dst = tmp.data() + static_cast<size_t>(r - row_lo) * out_w * 3;
    for (int j = 0; j < out_w; ++j) {
      const float* wk = cx.weights.data() + static_cast<size_t>(j) * cx.width;
      const uint8_t* p = src + static_cast<size_t>(cx.start[j]) * 3;
      float a = 0, b = 0, c = 0;
      for (int k = 0; k < cx.count[j]; ++k) {
        a += wk[k] * p[3 * k];
        b += wk[k] * p[3 * k + 1];
        c += wk[k] * p[3 * k + 2];
      }
      dst[3 * j] = a;
      dst[3 * j + 1] = b;
      dst[3 * j + 2] = c;
    }
  }
  // Vertical pass, into planes (3, out_h, out_w).
  std::vector<float> out(static_cast<size_t>(3) * out_h * out_w, 0.0f);
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  for (int i = 0; i < out_h; ++i) {
    const float* wk = cy.weights.data() + static_cast<size_t>(i) * cy.width;
    for (int k = 0; k < cy.count[i]; ++k) {
      const float* src = tmp.data() + static_cast<size_t>(cy.start[i] + k - row_lo) * out_w * 3;
      for (int j = 0; j < out_w; ++j)
        for (int ch = 0; ch < 3; ++ch) out[ch * plane + static_cast<size_t>(i) * out_w + j] += wk[k] * src[3 * j + ch];
    }
  }
  return out;
}

// Decoded blobs in the cache: width and height (int32 each), then the RGB rows.
std::string pack(const Image& image) {
  std::string out(8 + image.rgb.size(), '\0');
  const int32_t wh[2] = {image.width, image.height};
  std::memcpy(out.data(), wh, 8);
  std::memcpy(out.data() + 8, image.rgb.data(), image.rgb.size());
  return out;
}

constexpr const char* kShapes[] = {"disc",    "square", "triangle", "plus", "ring",
                                   "diamond", "hbar",   "vbar",     "x",    "pair"};

// A generated photo of class `label` (of kShapes): the shape in a random colour, at a random place
// and size (25-45% of the side), on a noisy background of random shade. The classes survive a
// horizontal flip and a change of scale, as objects in photos do, so the training augmentation keeps
// them apart.
Image shape_image(int size, int label, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 18.0f);
  const float r = size * (0.25f + 0.2f * u(rng)), cx = size * (0.4f + 0.2f * u(rng)),
              cy = size * (0.4f + 0.2f * u(rng));
  float bg[3], fg[3];
  for (int c = 0; c < 3; ++c) {
    bg[c] = 60 + 100 * u(rng);
    fg[c] = u(rng) < 0.5f ? bg[c] - 50 - 40 * u(rng) : bg[c] + 50 + 40 * u(rng);
  }
  Image img{size, size, std::vector<uint8_t>(static_cast<size_t>(size) * size * 3)};
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      const float dx = (x + 0.5f - cx) / r, dy = (y + 0.5f - cy) / r, d = std::sqrt(dx * dx + dy * dy);
      const float ax = std::abs(dx), ay = std::abs(dy), t = 0.25f;
      bool in = false;
      switch (label) {
        case 0: in = d < 1; break;
        case 1: in = ax < 0.8f && ay < 0.8f; break;
        case 2: in = dy < 0.8f && dy > -0.8f && ax < (dy + 0.8f) * 0.6f; break;
        case 3: in = (ax < t && ay < 1) || (ay < t && ax < 1); break;
        case 4: in = d < 1 && d > 0.6f; break;
        case 5: in = ax + ay < 1; break;
        case 6: in = ax < 1 && ay < t; break;
        case 7: in = ay < 1 && ax < t; break;
        case 8: in = d < 1.1f && std::abs(ax - ay) < t * 1.2f; break;
        default: in = std::hypot(ax - 0.55f, dy) < 0.4f; break;
      }
      for (int c = 0; c < 3; ++c)
        img.rgb[(static_cast<size_t>(y) * size + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp((in ? fg[c] : bg[c]) + noise(rng), 0.0f, 255.0f));
    }
  return img;
}

}  // namespace

uint64_t ImageFolderIndex::compressed_bytes() const {
  uint64_t n = 0;
  for (const auto* split : {&train, &val})
    for (const Entry& e : *split) n += e.bytes;
  return n;
}

uint64_t ImageFolderIndex::decoded_bytes() const {
  uint64_t n = 0;
  for (const auto* split : {&train, &val})
    for (const Entry& e : *split) n += static_cast<uint64_t>(e.width) * static_cast<uint64_t>(e.height) * 3;
  return n;
}

bool is_image_folder(const std::string& dir) {
  std::error_code ec;
  if (fs::is_directory(fs::path(dir) / "train", ec)) return true;
  std::ifstream in(dir + "/" + kManifest);
  std::string line;
  return in && std::getline(in, line) && line == kHeader;
}

bool is_image_folder_split(const std::string& dir) {
  std::error_code ec;
  const fs::path path = fs::path(dir).lexically_normal();
  const fs::path parent = (path.has_filename() ? path : path.parent_path()).parent_path();
  const std::string name = (path.has_filename() ? path : path.parent_path()).filename().string();
  if ((name == "train" || name == "val") && is_image_folder(parent.empty() ? "." : parent.string())) return true;
  // class directories holding JPEG files
  const std::vector<std::string> classes = sorted_entries(path, true);
  if (classes.empty() || !sorted_entries(path, false).empty()) return false;
  for (const std::string& c : classes) {
    bool jpeg = false;
    for (const std::string& f : sorted_entries(path / c, false)) jpeg = jpeg || is_jpeg_name(f);
    if (!jpeg) return false;
  }
  return true;
}

ImageFolderIndex index_image_folder(const std::string& dir, double progress_seconds, int threads) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw ConfigError(dir, "is not a directory");
  for (const char* split : {"train", "val"})
    if (!fs::is_directory(fs::path(dir) / split, ec))
      throw ConfigError(dir, std::string("is not an ImageFolder dataset: it has no ") + split +
                                 "/ directory (expected train/<class>/*.jpg and val/<class>/*.jpg)");
  const SplitScan train = scan_split(dir, "train"), val = scan_split(dir, "val");
  if (train.classes != val.classes) {
    std::vector<std::string> only_train, only_val;
    std::set_difference(train.classes.begin(), train.classes.end(), val.classes.begin(), val.classes.end(),
                        std::back_inserter(only_train));
    std::set_difference(val.classes.begin(), val.classes.end(), train.classes.begin(), train.classes.end(),
                        std::back_inserter(only_val));
    std::string what;
    if (!only_train.empty())
      what += detail::concat(detail::concat(only_train.size(), only_train.size() == 1 ? " class" : " classes"),
                             " only in train/: ", listed(only_train));
    if (!only_val.empty())
      what += detail::concat(what.empty() ? "" : "; ",
                             detail::concat(only_val.size(), only_val.size() == 1 ? " class" : " classes"),
                             " only in val/: ", listed(only_val));
    throw ConfigError(dir,
                      "train/ and val/ hold different classes (" + what + "); both need the same class directories");
  }
  ImageFolderIndex x;
  x.classes = train.classes;
  for (const auto& [scan, out] : {std::pair{&train, &x.train}, std::pair{&val, &x.val}})
    for (size_t c = 0; c < scan->files.size(); ++c)
      for (const std::string& f : scan->files[c]) out->push_back({f, static_cast<int>(c)});
  std::vector<ImageFolderIndex::Entry*> all;
  for (auto& e : x.train) all.push_back(&e);
  for (auto& e : x.val) all.push_back(&e);

  const int n_threads = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  log_info("indexing ", detail::count(all.size(), "image"), " of ",
           detail::concat(x.classes.size(), x.classes.size() == 1 ? " class" : " classes"), " under ", dir, " (",
           x.train.size(), " train, ", x.val.size(), " val) on ", detail::count(n_threads, "thread"));
  std::vector<std::string> errors(all.size());
  std::atomic<size_t> next{0}, done{0};
  std::atomic<uint64_t> bytes{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < n_threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < all.size(); done.fetch_add(1)) {
        ImageFolderIndex::Entry& e = *all[i];
        try {
          const std::string data = PosixFileSystem().read(dir + "/" + e.file);
          const Image size = jpeg_check(data, e.file);
          e.bytes = data.size();
          e.sum = fnv1a64(data);
          e.width = size.width;
          e.height = size.height;
          bytes.fetch_add(data.size());
        } catch (const std::exception& err) {
          errors[i] = err.what();
        }
      }
    });
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  while (done.load() < all.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto now = std::chrono::steady_clock::now();
    if (now - last >= std::chrono::duration<double>(progress_seconds) && done.load() < all.size()) {
      const double secs = std::chrono::duration<double>(now - t0).count();
      log_info("indexed ", done.load(), "/", all.size(), " images (", mb(bytes.load()), " MB, ",
               std::lround(done.load() / secs), " images/s)");
      last = now;
    }
  }
  for (auto& t : pool) t.join();
  std::vector<std::string> bad;
  for (const std::string& e : errors)
    if (!e.empty()) bad.push_back(e);
  if (!bad.empty()) {
    std::string what;
    for (size_t i = 0; i < bad.size() && i < kListedErrors; ++i) what += "\n  " + bad[i];
    if (bad.size() > kListedErrors) what += detail::concat("\n  and ", bad.size() - kListedErrors, " more");
    throw Error(detail::concat(dir, ": ", detail::count(bad.size(), "image"), " cannot be decoded (remove or replace ",
                               bad.size() == 1 ? "it" : "them", ", then index again):", what));
  }
  std::ostringstream o;
  o << kHeader << "\nclasses=" << x.classes.size() << "\n";
  for (const std::string& c : x.classes) o << "class=" << c << "\n";
  o << "train=" << x.train.size() << "\nval=" << x.val.size() << "\n";
  for (const auto* split : {&x.train, &x.val})
    for (const auto& e : *split)
      o << e.file << "\t" << e.label << "\t" << e.bytes << "\t" << hex(e.sum) << "\t" << e.width << "\t" << e.height
        << "\n";
  PosixFileSystem().write_atomic(dir + "/" + kManifest, o.str());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("indexed ", detail::count(all.size(), "image"), " (", mb(x.compressed_bytes()), " MB of JPEG, ",
           mb(x.decoded_bytes()), " MB decoded) in ", std::lround(secs * 10) / 10.0, " s",
           train.ignored + val.ignored
               ? detail::concat("; ", detail::count(train.ignored + val.ignored, "other file"), " ignored")
               : "");
  return x;
}

ImageFolderIndex read_image_folder_index(const std::string& dir) {
  const std::string path = dir + "/" + kManifest;
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) throw ConfigError("dataset.path", "'" + dir + "' is not a directory");
    throw ConfigError("dataset.path",
                      "'" + dir + "' has no index (" + kManifest + "): index its images with " + index_command(dir));
  }
  std::string line;
  std::getline(in, line);
  if (line != kHeader)
    throw ConfigError("dataset.path",
                      "'" + path +
                          "' does not index an ImageFolder dataset (format: imagefolder); index its images with " +
                          index_command(dir) + ", or set the format its files have");
  int number = 1;
  auto bad = [&](const std::string& what) {
    return ConfigError("dataset.path", detail::concat("'", path, "' line ", number, ": ", what, "; re-index with ",
                                                      index_command(dir)));
  };
  auto value = [&](const std::string& key) {
    ++number;
    if (!std::getline(in, line) || line.rfind(key + "=", 0) != 0) throw bad("expected " + key + "=");
    return line.substr(key.size() + 1);
  };
  auto count = [&](const std::string& key) {
    const std::string v = value(key);
    if (v.empty() || v.size() > 12 || v.find_first_not_of("0123456789") != std::string::npos)
      throw bad(key + " is not a count");
    return std::stoull(v);
  };
  ImageFolderIndex x;
  const uint64_t classes = count("classes");
  for (uint64_t c = 0; c < classes; ++c) x.classes.push_back(value("class"));
  const uint64_t n_train = count("train"), n_val = count("val");
  for (auto [split, n] : {std::pair{&x.train, n_train}, std::pair{&x.val, n_val}})
    for (uint64_t i = 0; i < n; ++i) {
      ++number;
      if (!std::getline(in, line)) throw bad("the manifest ends early");
      std::istringstream fields(line);
      ImageFolderIndex::Entry e;
      std::string sum;
      if (!std::getline(fields, e.file, '\t') || !(fields >> e.label >> e.bytes >> sum >> e.width >> e.height) ||
          e.label < 0 || e.label >= static_cast<int>(classes) || e.width < 1 || e.height < 1 || sum.size() != 16)
        throw bad("malformed image entry");
      e.sum = std::stoull(sum, nullptr, 16);
      split->push_back(std::move(e));
    }
  if (x.train.empty() || x.val.empty() || x.classes.empty()) throw bad("no images");
  return x;
}

void verify_image_folder(const std::string& dir) {
  const ImageFolderIndex x = read_image_folder_index(dir);
  uint64_t total = 0;
  for (const auto* split : {&x.train, &x.val})
    for (const auto& e : *split) {
      const std::string path = dir + "/" + e.file;
      std::string data;
      try {
        data = PosixFileSystem().read(path);
      } catch (const Error& err) {
        throw Error(detail::concat("dataset '", dir, "': image missing or unreadable: ", err.what()));
      }
      if (data.size() != e.bytes || fnv1a64(data) != e.sum)
        throw Error(detail::concat("dataset '", dir, "': '", path, "' changed since it was indexed (", data.size(),
                                   " bytes, indexed ", e.bytes, "); index the dataset again with ",
                                   index_command(dir)));
      total += data.size();
    }
  log_info("verified ", detail::count(x.train.size() + x.val.size(), "image"), " (", mb(total), " MB) under ", dir);
}

ImageFolderIndex generate_image_folder(const std::string& out_dir, uint64_t samples, int size, int classes,
                                       uint64_t seed, double validation_fraction, bool replace) {
  if (samples < 1) throw ConfigError("--samples", "required, a positive integer");
  if (size < 8) throw ConfigError("--size", detail::concat(size, ": images need at least 8 pixels a side"));
  if (classes < 2 || classes > 10)
    throw ConfigError("--classes", detail::concat(classes, ": between 2 and 10 (the shapes there are)"));
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec)) throw ConfigError("--out", "'" + out_dir + "' exists and is not a directory");
    std::vector<std::string> other;
    for (const auto& e : fs::directory_iterator(out_dir)) {
      const std::string name = e.path().filename().string();
      if (!(name == "train" || name == "val" || name == kManifest)) other.push_back(name);
    }
    if (!fs::is_empty(out_dir, ec)) {
      if (!replace)
        throw ConfigError(
            "--out",
            "'" + out_dir + "' is not empty; choose a new directory, or pass --replace to replace the dataset there");
      if (!other.empty())
        throw ConfigError(
            "--out", "'" + out_dir + "' holds " + other.front() +
                         ", which is not part of an ImageFolder; --replace removes only train/, val/ and the manifest");
      for (const char* name : {"train", "val", kManifest}) fs::remove_all(fs::path(out_dir) / name);
    }
  }
  const uint64_t n_val = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(samples * validation_fraction)));
  auto name = [](int c) { return std::string(kShapes[c]); };
  for (int c = 0; c < classes; ++c)
    for (const char* split : {"train", "val"}) fs::create_directories(fs::path(out_dir) / split / name(c));
  PosixFileSystem files;
  std::vector<uint64_t> per_class(static_cast<size_t>(classes) * 2, 0);
  for (const auto& [split, n, split_seed] :
       {std::tuple{"train", samples, seed}, std::tuple{"val", n_val, seed + 1000003}})
    for (uint64_t i = 0; i < n; ++i) {
      std::mt19937_64 rng(mix(mix(split_seed) ^ i));
      const int label = static_cast<int>(i % static_cast<uint64_t>(classes));
      const Image img = shape_image(size, label, rng);
      ++per_class[static_cast<size_t>(label) * 2 + (split[0] == 'v')];
      char file[32];
      std::snprintf(file, sizeof(file), "%07llu.jpg", static_cast<unsigned long long>(i));
      files.write_atomic(out_dir + "/" + split + "/" + name(label) + "/" + file, jpeg_encode(img, 90));
    }
  // A class that drew no image in a split (few samples, many classes) would be an empty class.
  for (int c = 0; c < classes; ++c)
    for (int v = 0; v < 2; ++v)
      if (per_class[static_cast<size_t>(c) * 2 + v] == 0)
        throw ConfigError("--samples",
                          detail::concat(samples, " images (", n_val, " for validation) leave class ", c, " without a ",
                                         v ? "validation" : "training", " image; generate more"));
  return index_image_folder(out_dir);
}

ImageCacheChoice choose_image_cache(const ImageFolderIndex& index, const CacheOptions& cache) {
  const uint64_t decoded = index.decoded_bytes(), compressed = index.compressed_bytes();
  const auto memory = static_cast<uint64_t>(std::max<int64_t>(cache.memory_bytes, 0));
  ImageCacheChoice c;
  if (memory > 0 && decoded <= memory) {
    c.decoded = true;
    c.reason = detail::concat("the decoded images (", mb(decoded), " MB) fit the memory tier (", mb(memory),
                              " MB): each image is decoded once and then read from memory");
    return c;
  }
  c.reason = detail::concat("the decoded images (", mb(decoded), " MB) do not fit the memory tier (", mb(memory),
                            " MB); their JPEG bytes (", mb(compressed), " MB, ",
                            std::round(static_cast<double>(decoded) / std::max<uint64_t>(compressed, 1) * 10) / 10,
                            "x smaller) are kept instead, ",
                            compressed <= memory    ? "all in memory"
                            : cache.ssd_dir.empty() ? "as many as fit in memory"
                                                    : "as many as fit in memory and the rest on the local SSD",
                            ", and decoded again each epoch on the loader's threads");
  return c;
}

CropBox random_resized_crop(int width, int height, std::mt19937_64& rng, double min_scale, double max_scale) {
  const double area = static_cast<double>(width) * height;
  std::uniform_real_distribution<double> scale(min_scale, max_scale), log_ratio(std::log(3.0 / 4), std::log(4.0 / 3));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * scale(rng), aspect = std::exp(log_ratio(rng));
    const int w = round_even(std::sqrt(target * aspect)), h = round_even(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = std::uniform_int_distribution<int>(0, height - h)(rng);
      const int x = std::uniform_int_distribution<int>(0, width - w)(rng);
      return {x, y, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < 3.0 / 4) h = round_even(w / (3.0 / 4));
  else if (in_ratio > 4.0 / 3) w = round_even(h * (4.0 / 3));
  return {(width - w) / 2, (height - h) / 2, w, h};
}

std::vector<float> resample(const Image& image, double x0, double y0, double w, double h, int out_w, int out_h) {
  TESSERA_CHECK(image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3, "an image without its pixels");
  return resample_rgb(image.rgb.data(), image.width, image.height, x0, y0, w, h, out_w, out_h);
}

std::array<double, 4> center_crop_box(int width, int height, int size) {
  const int resized = static_cast<int>(size / 0.875);  // torchvision's Resize(int(S / 0.875)) of the shorter side
  int ow = resized, oh = resized;
  if (width <= height) oh = static_cast<int>(static_cast<int64_t>(resized) * height / width);
  else ow = static_cast<int>(static_cast<int64_t>(resized) * width / height);
  const int top = round_even((oh - size) / 2.0), left = round_even((ow - size) / 2.0);
  const double sx = static_cast<double>(width) / ow, sy = static_cast<double>(height) / oh;
  return {left * sx, top * sy, size * sx, size * sy};
}

ImageFolderDataset::ImageFolderDataset(std::string dir, const ImageFolderIndex& index, Split split, int size,
                                       uint64_t seed, FileSystem& remote, TieredCache* cache, bool cache_decoded)
    : dir_(std::move(dir)),
      entries_(split == Split::kTrain ? index.train : index.val),
      train_(split == Split::kTrain),
      size_(size),
      seed_(seed),
      remote_(remote),
      cache_(cache),
      cache_decoded_(cache_decoded) {
  TESSERA_CHECK(size > 0, "image size ", size);
}

ImageFolderDataset::Pixels ImageFolderDataset::pixels(uint64_t index) const {
  const ImageFolderIndex::Entry& e = entries_.at(index);
  const std::string path = dir_ + "/" + e.file;
  auto read = [&] {
    std::string bytes = remote_.read(path);
    remote_bytes_.fetch_add(bytes.size());
    if (bytes.size() != e.bytes || fnv1a64(bytes) != e.sum)
      throw Error(detail::concat("'", path, "' changed since it was indexed (", bytes.size(), " bytes, indexed ",
                                 e.bytes, "); index the dataset again with ", index_command(dir_)));
    return bytes;
  };
  Pixels p;
  if (!cache_ || !cache_decoded_) {
    p.decoded = jpeg_decode(cache_ ? *cache_->get("jpeg:" + path, read) : read(), path);
    p.rgb = p.decoded.rgb.data();
    p.width = p.decoded.width;
    p.height = p.decoded.height;
    return p;
  }
  // The cache's decoded blob is read in place.
  p.blob = cache_->get("rgb:" + path, [&] { return pack(jpeg_decode(read(), path)); });
  int32_t wh[2];
  TESSERA_CHECK(p.blob->size() >= 8, "a decoded image of ", p.blob->size(), " bytes in the cache");
  std::memcpy(wh, p.blob->data(), 8);
  p.width = wh[0];
  p.height = wh[1];
  TESSERA_CHECK(p.blob->size() == 8 + static_cast<size_t>(p.width) * p.height * 3,
                "a decoded image of the wrong size in the cache");
  p.rgb = reinterpret_cast<const uint8_t*>(p.blob->data()) + 8;
  return p;
}

Sample ImageFolderDataset::get(uint64_t index) const {
  const Pixels img = pixels(index);
  const int s = static_cast<int>(size_);
  std::vector<float> out;
  bool flip = false;
  if (train_) {
    std::mt19937_64 rng(mix(mix(seed_) ^ (static_cast<uint64_t>(epoch_.load()) + 1) * 0x9E3779B97F4A7C15ull) ^
                        mix(index));
    const CropBox box = random_resized_crop(img.width, img.height, rng);
    flip = std::bernoulli_distribution(0.5)(rng);
    out = resample_rgb(img.rgb, img.width, img.height, box.x, box.y, box.width, box.height, s, s);
  } else {
    const auto b = center_crop_box(img.width, img.height, s);
    out = resample_rgb(img.rgb, img.width, img.height, b[0], b[1], b[2], b[3], s, s);
  }
  Tensor input({3, size_, size_}), target(Shape{});
  const size_t plane = static_cast<size_t>(s) * s;
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < s; ++y)
      for (int x = 0; x < s; ++x) {
        const float v = out[c * plane + static_cast<size_t>(y) * s + (flip ? s - 1 - x : x)];
        input[c * plane + static_cast<size_t>(y) * s + x] = (v / 255.0f - kMean[c]) / kStd[c];
      }
  target[0] = static_cast<float>(entries_[index].label);
  return Sample{input, target};
}

}  // namespace tessera
