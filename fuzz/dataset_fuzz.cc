// Sample files and dataset manifests as a user's directory could hold them: the first byte picks
// what the rest is (a .npy file, an HDF5 file, a manifest.tsv); reading it either succeeds or is an
// Error naming the file. Reads go through the same code as indexing and training (arrays.h,
// dataset_index.h); an HDF5 file is also indexed as the one sample of a directory (the checks of
// `tessera data index`); a manifest naming files outside its directory is refused.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "worker/data/arrays.h"
#include "worker/data/dataset_index.h"

namespace {

// A directory of this process for the files, removed at exit. A plain buffer, not a std::string:
// the handler runs after static objects are destroyed.
const char* scratch() {
  static char dir[512] = "";
  if (!dir[0]) {
    std::string t = (std::filesystem::temp_directory_path() / "tessera-fuzz-XXXXXX").string();
    if (t.size() >= sizeof(dir) || !mkdtemp(t.data())) std::abort();
    std::memcpy(dir, t.c_str(), t.size() + 1);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
  }
  return dir;
}

void write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

void read_volume(const tessera::ArrayRef& a) {
  using namespace tessera;
  const ArrayInfo info = array_info(a);
  if (shape_numel(info.shape) > (1 << 20)) return;  // a large header is valid; reading it is not the point
  read_array(a);
  if (info.shape.size() >= 3) {
    const size_t r = info.shape.size();
    VolumeBox box{{0, 0, 0}, {info.shape[r - 3], info.shape[r - 2], std::max<int64_t>(1, info.shape[r - 1] / 2)}};
    if (box.end[2] > 0 && info.shape[r - 3] > 0 && info.shape[r - 2] > 0) read_array(a, box);
    if (r == 4) read_array(a, {}, true);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::set_log_level(tessera::LogLevel::kError);  // indexing logs its progress
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  if (size < 1) return 0;
  const std::string dir = scratch();
  try {
    switch (data[0] % 3) {
      case 0:
        write(dir + "/a_x.npy", data + 1, size - 1);
        read_volume({dir + "/a_x.npy", ""});
        break;
      case 1: {
        const std::string set = dir + "/set", path = set + "/sample-000000.h5";
        std::filesystem::create_directories(set);
        write(path, data + 1, size - 1);
        for (const auto& [key, info] : h5_arrays(path)) read_volume({path, key});
        index_dataset(set);
        break;
      }
      default: write(dir + "/manifest.tsv", data + 1, size - 1); read_index(dir);
    }
  } catch (const Error&) {
  }
  return 0;
}
