// The index of a dataset directory: <dir>/manifest.tsv, written by `tessera data index` (and by
// `tessera data generate`), read by every worker. It records how the files store a sample (the
// layout), the input transform, and every sample's files with their sizes and checksums:
//
//   # tessera-dataset v2
//   layout=cosmo-channels-last        cosmo | cosmo-channels-last | unet | unet-npy
//   input=full int16 [64, 64, 64, 4]  the input array's name (HDF5; "-" for .npy), type and shape
//   target=unitPar float32 [4]
//   transform=log1p                   log1p | none | standardize
//   classes=0                         segmentation: the largest label + 1
//   samples=2
//   a/univ-0001.h5<TAB>bytes<TAB>fnv64[<TAB>target file<TAB>bytes<TAB>fnv64][<TAB>mean:std,...]
//
// Indexing scans the directory recursively (sorted), detects the layout from the first file,
// checks that every file agrees with it (shapes, types, target lengths), that float volumes hold
// no NaN or infinity and labels are non-negative integers, and writes the manifest at the end in one
// rename: the files themselves are never changed, and a failed index leaves no manifest behind.
#pragma once

#include <string>
#include <vector>

#include "worker/data/arrays.h"

namespace tessera {

struct DatasetIndex {
  std::string layout;                 // cosmo | cosmo-channels-last | unet | unet-npy
  std::string input_key, target_key;  // HDF5 dataset names; empty for .npy pairs
  ArrayInfo input, target;            // as stored (every file agrees)
  std::string transform;              // log1p | none | standardize (each sample by its file's per-channel mean, std)
  int classes = 0;                    // unet: the largest label + 1
  struct Entry {
    std::string file, target_file;  // relative to the directory; target_file empty when one file holds both
    uint64_t bytes = 0, sum = 0, target_bytes = 0, target_sum = 0;
    std::vector<float> mean, stdev;  // standardize: per channel of the file's volume
  };
  std::vector<Entry> entries;

  bool channels_last() const { return layout == "cosmo-channels-last"; }
  bool segmentation() const { return layout == "unet" || layout == "unet-npy"; }
  Shape volume() const;          // (C, D, H, W)
  Shape sample_target() const;   // regression (T); segmentation (D, H, W)
  std::string describe() const;  // "layout cosmo, full int16 [4, 32, 32, 32], unitPar float32 [4], log1p"
};

struct IndexOptions {
  std::string layout;                 // empty: detect
  std::string input_key, target_key;  // empty: the layout's (full/unitPar, volume/segmentation)
  std::string transform;              // empty: log1p for cosmo layouts, none for unet
  std::string channels;               // first | last; empty: detect (4-d cosmo volumes)
  double progress_seconds = 5;
};

// Reads <dir>/manifest.tsv. ConfigError("dataset.path", ...) when there is none (naming the
// `tessera data index` command) or it is malformed.
DatasetIndex read_index(const std::string& dir);
// Scans dir, checks every file and writes its manifest (see above); returns the index. ConfigError
// on options, Error naming the file for a bad file, ConfigError(dir) for a directory without samples.
DatasetIndex index_dataset(const std::string& dir, const IndexOptions& options = {});
// Reads every file of an indexed directory and checks its size and checksum; Error naming the first bad file.
void verify_dataset(const std::string& dir);

// Writes `samples` generated samples of edge `size` (cosmo: cosmology fields, raw densities as int16
// counts or float32; unet: labelled shapes) into out_dir, then indexes them. Prints progress. out_dir
// must be empty or new; with `replace`, a dataset already there (its manifest and sample files, and
// nothing else) is removed first.
void generate_dataset(const std::string& kind, uint64_t samples, int size, const std::string& out_dir, uint64_t seed,
                      bool int16 = true, bool replace = false);

}  // namespace tessera
