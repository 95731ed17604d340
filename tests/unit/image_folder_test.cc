// JPEG decoding (libjpeg-turbo), the image transforms of ImageFolder datasets (torchvision's crops,
// Pillow's antialiased bilinear resize), the cache's choice between decoded and compressed bytes, and
// the dataset's samples: the same on every rank and whatever the cache keeps. (Pillow's own files and
// pixels are compared in tests/e2e/image_folder_run_test.py.)
#include "worker/data/image_folder.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/error.h"
#include "testing/fork_ranks.h"

namespace tessera {
namespace {

Image gradient(int w, int h) {
  Image img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(255 * x / (w - 1));
      p[1] = static_cast<uint8_t>(255 * y / (h - 1));
      p[2] = 128;
    }
  return img;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(JpegTest, DecodesWhatItEncodedAndNamesDamagedFiles) {
  const Image img = gradient(67, 45);
  const std::string bytes = jpeg_encode(img, 95);
  const Image back = jpeg_decode(bytes, "a.jpg");
  ASSERT_EQ(back.width, 67);
  ASSERT_EQ(back.height, 45);
  int worst = 0;
  for (size_t i = 0; i < img.rgb.size(); ++i) worst = std::max(worst, std::abs(int(img.rgb[i]) - int(back.rgb[i])));
  EXPECT_LE(worst, 12) << "quality 95 of a smooth gradient";
  const Image size = jpeg_size(bytes, "a.jpg");
  EXPECT_EQ(size.width, 67);
  EXPECT_TRUE(size.rgb.empty());
  const Image checked = jpeg_check(bytes, "a.jpg");
  EXPECT_EQ(checked.width, 67);
  EXPECT_EQ(checked.height, 45);

  EXPECT_NE(
      error_of([&] { jpeg_decode("not an image", "notes.jpg"); }).find("'notes.jpg': not a JPEG libjpeg can decode"),
      std::string::npos);
  // Cut short: the header reads, the data does not; both the check and the decode refuse it.
  const std::string cut = bytes.substr(0, bytes.size() / 2);
  for (const std::string& e :
       {error_of([&] { jpeg_decode(cut, "cut.jpg"); }), error_of([&] { jpeg_check(cut, "cut.jpg"); })})
    EXPECT_NE(e.find("'cut.jpg': damaged JPEG data"), std::string::npos) << e;
}

TEST(ImageTransformTest, RandomResizedCropDrawsTorchvisionsRanges) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const CropBox b = random_resized_crop(500, 375, rng);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.width, 500);
    ASSERT_LE(b.y + b.height, 375);
    const double area = double(b.width) * b.height / (500.0 * 375), aspect = double(b.width) / b.height;
    EXPECT_GE(area, 0.08 * 0.9) << i;  // rounding of w and h to whole pixels
    EXPECT_GE(aspect, 0.75 * 0.93) << i;
    EXPECT_LE(aspect, 4.0 / 3 * 1.07) << i;
  }
  std::mt19937_64 a(9), b(9);
  const CropBox x = random_resized_crop(500, 375, a), y = random_resized_crop(500, 375, b);
  EXPECT_EQ(std::tie(x.x, x.y, x.width, x.height), std::tie(y.x, y.y, y.width, y.height));
  // No draw fits a 1000 x 10 strip: the centre crop of aspect 4/3, 13 x 10.
  const CropBox strip = random_resized_crop(1000, 10, rng);
  EXPECT_EQ(std::tie(strip.x, strip.y, strip.width, strip.height), std::make_tuple(493, 0, 13, 10));
}

TEST(ImageTransformTest, CentreCropBoxIsTorchvisionsResizeThenCrop) {
  // 500 x 375 at S 224: resized to 341 x 256, cropped at left round(58.5) = 58 (half to even), top 16.
  const auto b = center_crop_box(500, 375, 224);
  EXPECT_DOUBLE_EQ(b[0], 58 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(b[1], 16 * 375.0 / 256);
  EXPECT_DOUBLE_EQ(b[2], 224 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(b[3], 224 * 375.0 / 256);
  // Shorter side already S / 0.875 (36 for S 32): no resize, the centre 32 x 32.
  const auto same = center_crop_box(36, 50, 32);
  EXPECT_DOUBLE_EQ(same[0], 2);
  EXPECT_DOUBLE_EQ(same[1], 9);
  EXPECT_DOUBLE_EQ(same[2], 32);
  EXPECT_DOUBLE_EQ(same[3], 32);
}

TEST(ImageTransformTest, ResampleKeepsPixelsAtScaleOneAndLinearRampsWhenShrinking) {
  const Image img = gradient(40, 30);
  const auto same = resample(img, 3, 2, 20, 10, 20, 10);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 10; ++y)
      for (int x = 0; x < 20; ++x)
        ASSERT_FLOAT_EQ(same[(c * 10 + y) * 20 + x], img.rgb[((y + 2) * 40 + x + 3) * 3 + c]);
  // A ramp in x, shrunk by 2 with the antialiasing filter: interior outputs are the ramp at their centres.
  Image ramp{40, 4, std::vector<uint8_t>(40 * 4 * 3)};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 40; ++x)
      for (int c = 0; c < 3; ++c) ramp.rgb[(y * 40 + x) * 3 + c] = static_cast<uint8_t>(5 * x);
  const auto half = resample(ramp, 0, 0, 40, 4, 20, 4);
  for (int x = 1; x < 19; ++x) EXPECT_NEAR(half[x], 5 * ((x + 0.5) * 2 - 0.5), 1e-4) << x;
}

TEST(ImageCacheTest, KeepsDecodedPixelsWhenTheyFitTheMemoryTierElseJpegBytes) {
  ImageFolderIndex x;
  x.classes = {"a"};
  x.train = {{"train/a/1.jpg", 0, 50'000, 1, 400, 300}, {"train/a/2.jpg", 0, 50'000, 2, 400, 300}};
  x.val = {{"val/a/1.jpg", 0, 50'000, 3, 400, 300}};
  EXPECT_EQ(x.compressed_bytes(), 150'000u);
  EXPECT_EQ(x.decoded_bytes(), 3u * 400 * 300 * 3);
  CacheOptions co;
  co.memory_bytes = 2'000'000;
  const ImageCacheChoice fits = choose_image_cache(x, co);
  EXPECT_TRUE(fits.decoded);
  EXPECT_NE(fits.reason.find("the decoded images (1.1 MB) fit the memory tier (2 MB)"), std::string::npos)
      << fits.reason;
  co.memory_bytes = 1'000'000;
  co.ssd_dir = "/ssd";
  const ImageCacheChoice not_fit = choose_image_cache(x, co);
  EXPECT_FALSE(not_fit.decoded);
  EXPECT_NE(
      not_fit.reason.find(
          "do not fit the memory tier (1 MB); their JPEG bytes (0.2 MB, 7.2x smaller) are kept instead, all in memory"),
      std::string::npos)
      << not_fit.reason;
  co.memory_bytes = 100'000;
  const ImageCacheChoice part = choose_image_cache(x, co);
  EXPECT_FALSE(part.decoded);
  EXPECT_NE(part.reason.find("are kept instead, as many as fit in memory and the rest on the local SSD"),
            std::string::npos)
      << part.reason;
  co.memory_bytes = 0;
  EXPECT_FALSE(choose_image_cache(x, co).decoded);
}

// A folder of two classes written with libjpeg, indexed.
std::string write_folder(const std::string& root) {
  for (const char* split : {"train", "val"})
    for (const char* cls : {"ants", "bees"}) {
      std::filesystem::create_directories(root + "/" + split + "/" + cls);
      for (int i = 0; i < (split[0] == 't' ? 3 : 1); ++i)
        std::ofstream(root + "/" + split + "/" + cls + "/" + std::to_string(i) + ".jpg", std::ios::binary)
            << jpeg_encode(gradient(40 + 7 * i, 50 - 3 * i), 90);
    }
  return root;
}

TEST(ImageFolderTest, SamplesAreTheSameOnEveryRankAndWhateverTheCacheKeeps) {
  const std::string dir = write_folder(testing::make_temp_dir("tessera-imagefolder") + "/data");
  const ImageFolderIndex x = index_image_folder(dir, 5, 2);
  ASSERT_EQ(x.classes, (std::vector<std::string>{"ants", "bees"}));
  ASSERT_EQ(x.train.size(), 6u);
  EXPECT_EQ(x.train[3].file, "train/bees/0.jpg");
  EXPECT_EQ(x.train[3].label, 1);
  const ImageFolderIndex back = read_image_folder_index(dir);
  ASSERT_EQ(back.train.size(), 6u);
  EXPECT_EQ(back.train[4].sum, x.train[4].sum);
  EXPECT_EQ(back.val[1].width, 40);

  PosixFileSystem fs;
  CacheOptions co;
  TieredCache decoded_cache(co, fs), jpeg_cache(co, fs);
  using Split = ImageFolderDataset::Split;
  ImageFolderDataset plain(dir, x, Split::kTrain, 32, 5, fs, nullptr, false);
  ImageFolderDataset decoded(dir, x, Split::kTrain, 32, 5, fs, &decoded_cache, true);
  ImageFolderDataset jpeg(dir, x, Split::kTrain, 32, 5, fs, &jpeg_cache, false);
  for (int epoch : {0, 1}) {
    for (auto* d : {&plain, &decoded, &jpeg}) d->set_epoch(epoch);
    for (uint64_t i = 0; i < 6; ++i) {
      const Sample a = plain.get(i);
      ASSERT_EQ(a.input.shape(), (Shape{3, 32, 32}));
      EXPECT_EQ(a.target[0], static_cast<float>(x.train[i].label));
      for (const Sample& b : {decoded.get(i), decoded.get(i), jpeg.get(i)})
        for (int64_t k = 0; k < a.input.numel(); ++k)
          ASSERT_EQ(a.input[k], b.input[k]) << "epoch " << epoch << " sample " << i;
    }
  }
  EXPECT_EQ(decoded_cache.counters().hits[TieredCache::kMemory], 18u);  // all but the first read of each image
  // Another epoch draws other crops.
  plain.set_epoch(0);
  const Sample e0 = plain.get(2);
  plain.set_epoch(7);
  const Sample e7 = plain.get(2);
  double moved = 0;
  for (int64_t k = 0; k < e0.input.numel(); ++k) moved = std::max(moved, double(std::abs(e0.input[k] - e7.input[k])));
  EXPECT_GT(moved, 0.05);
  // Validation images are not augmented: every epoch the same.
  ImageFolderDataset val(dir, x, Split::kVal, 32, 5, fs, nullptr, false);
  const Sample v0 = val.get(1);
  val.set_epoch(3);
  const Sample v3 = val.get(1);
  for (int64_t k = 0; k < v0.input.numel(); ++k) ASSERT_EQ(v0.input[k], v3.input[k]);
  EXPECT_EQ(v0.target[0], 1.0f);
  EXPECT_GT(plain.remote_bytes_read(), 0u);
}

TEST(ImageFolderTest, AChangedImageOrManifestIsNamed) {
  const std::string dir = write_folder(testing::make_temp_dir("tessera-imagefolder") + "/data");
  const ImageFolderIndex x = index_image_folder(dir, 5, 1);
  std::ofstream(dir + "/train/ants/1.jpg", std::ios::app) << "x";
  PosixFileSystem fs;
  ImageFolderDataset d(dir, x, ImageFolderDataset::Split::kTrain, 32, 5, fs, nullptr, false);
  const std::string e = error_of([&] { d.get(1); });
  EXPECT_NE(e.find("train/ants/1.jpg' changed since it was indexed"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { verify_image_folder(dir); }).find("train/ants/1.jpg' changed since it was indexed"),
            std::string::npos);

  std::string manifest;
  {
    std::ifstream in(dir + "/manifest.tsv");
    std::getline(in, manifest, '\0');
  }
  std::ofstream(dir + "/manifest.tsv") << manifest.substr(0, manifest.find("train/bees"));
  const std::string m = error_of([&] { read_image_folder_index(dir); });
  EXPECT_NE(m.find("manifest.tsv' line 10: the manifest ends early; re-index"), std::string::npos) << m;
  std::ofstream(dir + "/manifest.tsv") << "# tessera-dataset v2\nlayout=cosmo\n";
  EXPECT_NE(error_of([&] { read_image_folder_index(dir); }).find("does not index an ImageFolder dataset"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
