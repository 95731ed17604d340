#include "worker/data/h5_sample.h"

#include <hdf5.h>

#include <mutex>
#include <vector>

#include "worker/core/error.h"

namespace tessera {
namespace {

// The serial HDF5 library is not thread-safe: every call goes through this lock.
std::mutex& h5_mutex() {
  static std::mutex m;
  return m;
}

// Closes an HDF5 handle at scope exit.
struct H5Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~H5Handle() {
    if (id >= 0 && close) close(id);
  }
  H5Handle(const H5Handle&) = delete;
  operator hid_t() const { return id; }
};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("hdf5 sample '" + path + "': " + what);
}

const char* volume_name(SampleFormat f) { return f == SampleFormat::kCosmo ? "full" : "volume"; }
const char* target_name(SampleFormat f) { return f == SampleFormat::kCosmo ? "unitPar" : "segmentation"; }

void write_dataset(hid_t file, const std::string& path, const char* name, const Tensor& t, hid_t file_type,
                   const std::vector<hsize_t>& chunk) {
  std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!chunk.empty()) {
    H5Pset_chunk(plist, static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(plist, 1);
  }
  H5Handle ds(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail(path, std::string("cannot create dataset ") + name);
  if (H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()) < 0)
    fail(path, std::string("cannot write dataset ") + name);
}

}  // namespace

std::string VolumeBox::str() const {
  return detail::concat("[", begin[0], ":", end[0], ", ", begin[1], ":", end[1], ", ", begin[2], ":", end[2], "]");
}

void write_sample(const std::string& path, SampleFormat format, const Tensor& input, const Tensor& target,
                  bool int16_counts) {
  TESSERA_CHECK(input.rank() == 4, "sample volume ", shape_str(input.shape()));
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (file < 0) fail(path, "cannot create the file");
  const std::vector<hsize_t> chunk = {static_cast<hsize_t>(input.dim(0)), static_cast<hsize_t>(std::min<int64_t>(8, input.dim(1))),
                                      static_cast<hsize_t>(std::min<int64_t>(32, input.dim(2))), static_cast<hsize_t>(input.dim(3))};
  write_dataset(file, path, volume_name(format), input,
                format == SampleFormat::kCosmo && int16_counts ? H5T_STD_I16LE : H5T_IEEE_F32LE, chunk);
  if (format == SampleFormat::kCosmo) {
    write_dataset(file, path, target_name(format), target, H5T_IEEE_F32LE, {});
  } else {
    write_dataset(file, path, target_name(format), target, H5T_STD_I16LE,
                  {chunk[1], chunk[2], chunk[3]});
  }
  if (H5Fflush(file, H5F_SCOPE_LOCAL) < 0) fail(path, "cannot flush");
}

namespace {

// Reads the box of a dataset whose last three dimensions are (D, H, W); returns the chunk bytes read.
Tensor read_box(hid_t file, const std::string& path, const char* name, VolumeBox box, uint64_t* stored) {
  H5Handle ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail(path, std::string("no dataset '") + name + "'");
  H5Handle space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 3 || rank > 4) fail(path, std::string("dataset '") + name + "' is not a volume");
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const int lead = rank - 3;
  std::vector<hsize_t> start(rank, 0), count(dims);
  for (int d = 0; d < 3; ++d) {
    if (box.end[d] == 0 && box.begin[d] == 0) box.end[d] = static_cast<int64_t>(dims[lead + d]);
    if (box.begin[d] < 0 || box.end[d] > static_cast<int64_t>(dims[lead + d]) || box.begin[d] >= box.end[d])
      fail(path, detail::concat("box ", box.str(), " is outside dataset '", name, "'"));
    start[lead + d] = static_cast<hsize_t>(box.begin[d]);
    count[lead + d] = static_cast<hsize_t>(box.end[d] - box.begin[d]);
  }
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  H5Handle mem(H5Screate_simple(rank, count.data(), nullptr), H5Sclose);
  Shape shape(count.begin(), count.end());
  Tensor out(shape);
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, out.data()) < 0)
    fail(path, std::string("cannot read dataset '") + name + "' (corrupt or truncated file?)");
  // The chunks the selection touches: their stored (compressed) bytes.
  H5Handle plist(H5Dget_create_plist(ds), H5Pclose);
  if (stored && H5Pget_layout(plist) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(rank);
    H5Pget_chunk(plist, rank, chunk.data());
    std::vector<hsize_t> first(rank), last(rank), at(rank);
    for (int i = 0; i < rank; ++i) {
      first[i] = start[i] / chunk[i];
      last[i] = (start[i] + count[i] - 1) / chunk[i];
      at[i] = first[i];
    }
    for (;;) {  // every chunk index between first and last, like an odometer
      std::vector<hsize_t> offset(rank);
      for (int i = 0; i < rank; ++i) offset[i] = at[i] * chunk[i];
      hsize_t bytes = 0;
      if (H5Dget_chunk_storage_size(ds, offset.data(), &bytes) >= 0) *stored += bytes;
      int i = rank - 1;
      for (; i >= 0; --i) {
        if (at[i] < last[i]) {
          ++at[i];
          break;
        }
        at[i] = first[i];
      }
      if (i < 0) break;
    }
  } else if (stored) {
    H5Handle type(H5Dget_type(ds), H5Tclose);
    *stored += static_cast<uint64_t>(out.numel()) * H5Tget_size(type);
  }
  return out;
}

}  // namespace

BlockRead read_sample_block(const std::string& path, SampleFormat format, VolumeBox box) {
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by return codes, named here
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) fail(path, "cannot open (missing, unreadable or not HDF5)");
  BlockRead r;
  r.input = read_box(file, path, volume_name(format), box, &r.stored_bytes);
  if (format == SampleFormat::kCosmo) {
    H5Handle ds(H5Dopen2(file, target_name(format), H5P_DEFAULT), H5Dclose);
    if (ds < 0) fail(path, "no dataset 'unitPar'");
    H5Handle space(H5Dget_space(ds), H5Sclose);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    r.target = Tensor({static_cast<int64_t>(n)});
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, r.target.data()) < 0)
      fail(path, "cannot read dataset 'unitPar'");
    r.stored_bytes += n * 4;
  } else {
    r.target = read_box(file, path, target_name(format), box, &r.stored_bytes);
  }
  return r;
}

Shape sample_volume_shape(const std::string& path, SampleFormat format) {
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (file < 0) fail(path, "cannot open (missing, unreadable or not HDF5)");
  H5Handle ds(H5Dopen2(file, volume_name(format), H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail(path, std::string("no dataset '") + volume_name(format) + "'");
  H5Handle space(H5Dget_space(ds), H5Sclose);
  hsize_t dims[4] = {0, 0, 0, 0};
  if (H5Sget_simple_extent_ndims(space) != 4) fail(path, "volume is not (C, D, H, W)");
  H5Sget_simple_extent_dims(space, dims, nullptr);
  return {static_cast<int64_t>(dims[0]), static_cast<int64_t>(dims[1]), static_cast<int64_t>(dims[2]),
          static_cast<int64_t>(dims[3])};
}

}  // namespace tessera
