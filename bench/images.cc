#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "testing/fork_ranks.h"
#include "worker/data/image_folder.h"

namespace tessera::bench {

// Images per second of the ImageFolder pipeline on one thread (read, decode, augment, normalise),
// against the same transforms written with Pillow (bench/pil_images.py), on the same JPEGs.
int images(int argc, char** argv) {
  int size = 224, count = 64, width = 400, iters = 3;
  bool json = false;
  Flags flags("tessera-bench images",
              "usage: tessera-bench images [--size S --images N --width W --iters I] [--json]\n"
              "Writes N generated W x W JPEGs (quality 90) and times one thread turning each into the model's\n"
              "S x S input: the training transform (random-resized crop and flip) and the validation one\n"
              "(resize and centre crop), with no cache, against Pillow doing the same (bench/pil_images.py).\n");
  flags.integer("--size", &size, 8, 4096)
      .integer("--images", &count, 10, 1'000'000)
      .integer("--width", &width, 8, 8192)
      .integer("--iters", &iters, 1, 1000)
      .toggle("--json", &json);
  if (!flags.parse(argc, argv, 2)) return 0;
  const std::string dir = testing::make_temp_dir("tessera-images-bench") + "/data";
  const ImageFolderIndex index = generate_image_folder(dir, static_cast<uint64_t>(count), width, 10, 1, 0.25, false);
  PosixFileSystem fs;
  nlohmann::json out = {{"bench", "images"},
                        {"size", size},
                        {"images", index.train.size()},
                        {"width", width},
                        {"jpeg_kb", index.compressed_bytes() / 1e3 / (index.train.size() + index.val.size())}};
  for (const bool train : {true, false}) {
    const auto split = train ? ImageFolderDataset::Split::kTrain : ImageFolderDataset::Split::kVal;
    ImageFolderDataset data(dir, index, split, size, 1, fs, nullptr, false);
    const uint64_t n = data.size();
    std::vector<double> rates;
    for (int it = 0; it < iters; ++it) {
      data.set_epoch(it);
      const auto t0 = Clock::now();
      for (uint64_t i = 0; i < n; ++i) data.get(i);
      rates.push_back(n / (ms_since(t0) / 1e3));
    }
    const std::string key = train ? "train" : "val";
    out[key]["tessera"] = median(rates);
    const nlohmann::json peer = python_peer(
        detail::concat("pil_images.py --data ", dir, " --size ", size, " --split ", key, " --iters ", iters));
    if (!peer.is_null()) {
      out[key]["pillow"] = peer["images_per_s"];
      out[key]["ratio"] = median(rates) / peer["images_per_s"].get<double>();
    }
  }
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%zu JPEGs of %dx%d (%.1f kB each) to %dx%d inputs, one thread, no cache:\n", index.train.size(), width,
              width, out["jpeg_kb"].get<double>(), size, size);
  for (const char* key : {"train", "val"}) {
    const auto& r = out[key];
    std::printf("  %-5s Tessera %7.1f images/s", key, r["tessera"].get<double>());
    if (r.contains("pillow"))
      std::printf("   Pillow %7.1f images/s   ratio %.2fx", r["pillow"].get<double>(), r["ratio"].get<double>());
    std::printf("\n");
  }
  return 0;
}

}  // namespace tessera::bench
