// Image classification data in the ImageFolder layout users have:
//
//   DIR/train/<class>/*.jpg   the training images, one directory per class
//   DIR/val/<class>/*.jpg     the validation images, the same classes
//
// `tessera data index DIR` checks every JPEG (decoded by libjpeg-turbo at 1/8 scale: the same damage
// is found without the full-size inverse DCT and colour conversion), on every core, and writes
// DIR/manifest.tsv:
//
//   # tessera-imagefolder v1
//   classes=2                         the class directories, sorted; label = position
//   class=cat
//   class=dog
//   train=3                           training images, then validation images
//   val=1
//   train/cat/1.jpg<TAB>0<TAB>bytes<TAB>fnv64<TAB>width<TAB>height
//
// Errors name what to fix: a missing train/ or val/, an empty class, every undecodable file (up to
// 20 listed), and class sets that differ between train/ and val/. A failed index writes nothing.
//
// An ImageFolderDataset serves one split as (3, S, S) float images, normalised by ImageNet's mean and
// standard deviation, with the class as target. Training images get a random-resized crop (scale
// 0.08-1, aspect 3/4-4/3, as torchvision draws it) and a horizontal flip with probability 1/2, drawn
// from (seed, epoch, sample): every rank draws the same, so data-parallel training equals a single
// process. Validation images are resized so their shorter side is S / 0.875 and centre-cropped to S.
// Resizing is bilinear with Pillow's antialiasing (the filter widens when it shrinks an image).
//
// Bytes come through the rank's TieredCache. It keeps either each image's decoded pixels or its JPEG
// bytes, decided once for the dataset by choose_image_cache: decoded pixels when all of them fit the
// memory tier (every image decoded once), the JPEG bytes otherwise (decoded again every epoch, on the
// loader's threads, but 5-15x smaller, so many more stay in memory and on the SSD).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "worker/data/dataset.h"
#include "worker/data/filesystem.h"
#include "worker/data/jpeg.h"
#include "worker/data/tiered_cache.h"

namespace tessera {

struct ImageFolderIndex {
  struct Entry {
    std::string file;  // relative to the directory: train/<class>/<name>
    int label = 0;
    uint64_t bytes = 0, sum = 0;
    int width = 0, height = 0;
  };
  std::vector<std::string> classes;
  std::vector<Entry> train, val;

  // Bytes of the JPEG files and of their decoded RGB pixels, both splits.
  uint64_t compressed_bytes() const;
  uint64_t decoded_bytes() const;
};

// Whether dir holds an ImageFolder dataset: a train/ subdirectory, or an ImageFolder manifest.
bool is_image_folder(const std::string& dir);
// Whether dir is one split of an ImageFolder (train/ or val/ of a directory that is one, or class
// directories of JPEG files beside no other files): the dataset to index is its parent.
bool is_image_folder_split(const std::string& dir);
// Indexes dir (see above) on `threads` threads (0: every core), logging progress every
// progress_seconds. ConfigError naming the directory or class for a layout problem, Error listing the
// undecodable files.
ImageFolderIndex index_image_folder(const std::string& dir, double progress_seconds = 5, int threads = 0);
// Reads dir/manifest.tsv. ConfigError("dataset.path", ...) when there is none (naming the index
// command), when it indexes another kind of dataset, or when it is malformed.
ImageFolderIndex read_image_folder_index(const std::string& dir);

// `tessera data verify` of an ImageFolder: every image's size and checksum against the manifest;
// Error naming the first that differs or is missing.
void verify_image_folder(const std::string& dir);

// `tessera data generate --kind images`: an ImageFolder of JPEGs (quality 90), size x size, of
// `classes` (2-10) kinds of shape (disc, square, triangle, plus, ring, diamond, hbar, vbar, x, pair:
// the class directories) in random colours, places and sizes on noisy backgrounds, classes in turn;
// `samples` training and round(samples * validation_fraction) validation images, then indexed.
// out_dir must be new or empty; with `replace`, an ImageFolder already there (train/, val/ and its
// manifest, nothing else) is removed first.
ImageFolderIndex generate_image_folder(const std::string& out_dir, uint64_t samples, int size, int classes,
                                       uint64_t seed, double validation_fraction, bool replace);

// What the cache keeps of each image, and why (a sentence for the log).
struct ImageCacheChoice {
  bool decoded = false;  // decoded RGB pixels; false: the JPEG bytes
  std::string reason;
};
ImageCacheChoice choose_image_cache(const ImageFolderIndex& index, const CacheOptions& cache);

// The image transforms, for tests and `tessera data read`.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
};
// torchvision's RandomResizedCrop.get_params: up to 10 draws of area (scale) and aspect (log-uniform
// ratio), else the centre crop of the nearest allowed aspect.
CropBox random_resized_crop(int width, int height, std::mt19937_64& rng, double min_scale = 0.08,
                            double max_scale = 1.0);
// Pixels of `image` in the box (x0, y0, w, h) (fractional: a crop of an image resized first) resampled
// to out_w x out_h, bilinear with antialiasing, as (3, out_h, out_w) floats in 0-255.
std::vector<float> resample(const Image& image, double x0, double y0, double w, double h, int out_w, int out_h);
// The validation transform's box: the centre S x S of the image resized so its shorter side is
// floor(S / 0.875), in the original image's coordinates.
std::array<double, 4> center_crop_box(int width, int height, int size);

class ImageFolderDataset final : public Dataset {
 public:
  enum class Split { kTrain, kVal };
  // size: S; cache may be null (every image read from dir through `remote`).
  ImageFolderDataset(std::string dir, const ImageFolderIndex& index, Split split, int size, uint64_t seed,
                     FileSystem& remote, TieredCache* cache, bool cache_decoded);
  uint64_t size() const override { return entries_.size(); }
  Sample get(uint64_t index) const override;
  Shape input_shape() const override { return {3, size_, size_}; }
  Shape target_shape() const override { return {}; }
  // The epoch whose augmentations get() draws; set between epochs, when no load is in flight.
  void set_epoch(int epoch) { epoch_.store(epoch); }
  const ImageFolderIndex::Entry& entry(uint64_t index) const { return entries_.at(index); }
  std::string file(uint64_t index) const { return dir_ + "/" + entries_.at(index).file; }
  // Bytes read from the directory so far (cache misses only).
  uint64_t remote_bytes_read() const { return remote_bytes_.load(); }

 private:
  // The decoded pixels of a sample, through the cache: an image decoded here, or a view of the
  // cache's decoded blob (kept alive by `blob`, not copied).
  struct Pixels {
    Image decoded;
    TieredCache::Blob blob;
    const uint8_t* rgb = nullptr;
    int width = 0, height = 0;
  };
  Pixels pixels(uint64_t index) const;

  std::string dir_;
  std::vector<ImageFolderIndex::Entry> entries_;
  bool train_;
  int64_t size_;
  uint64_t seed_;
  FileSystem& remote_;
  TieredCache* cache_;
  bool cache_decoded_;
  std::atomic<int> epoch_{0};
  mutable std::atomic<uint64_t> remote_bytes_{0};
};

}  // namespace tessera
