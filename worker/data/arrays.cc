#include "worker/data/arrays.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <regex>
#include <vector>

#include "common/error.h"

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

[[noreturn]] void fail(const ArrayRef& a, const std::string& what) { throw Error(a.str() + ": " + what); }
[[noreturn]] void fail_file(const std::string& path, const std::string& what) {
  throw Error("'" + path + "': " + what);
}

H5Handle open_h5(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // errors are reported by return codes, named here
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) fail_file(path, "cannot open as HDF5 (missing, unreadable, truncated or not an HDF5 file)");
  return H5Handle(f, H5Fclose);
}

std::string type_name(bool floating, bool is_signed, size_t bytes) {
  if (floating) return bytes == 4 ? "float32" : bytes == 8 ? "float64" : "float" + std::to_string(8 * bytes);
  return (is_signed ? "int" : "uint") + std::to_string(8 * bytes);
}

// HDF5 1.10 copies a whole chunk out of the buffer its filters leave without checking that
// buffer's length: a chunk whose stored or inflated bytes fall short of its shape (a corrupt file)
// overruns a heap buffer. So every chunk a read touches is measured first, its filters undone in
// reverse with the ones this reader can follow (deflate, shuffle, fletcher32); a dataset stored
// with any other filter is refused.
struct Filter {
  H5Z_filter_t id;
  std::string name;
};

std::vector<Filter> filters_of(hid_t create) {
  std::vector<Filter> out;
  const int n = H5Pget_nfilters(create);
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    size_t nvalues = 0;
    char name[64] = {};
    const H5Z_filter_t id =
        H5Pget_filter2(create, static_cast<unsigned>(i), &flags, &nvalues, nullptr, sizeof(name), name, &config);
    out.push_back({id, name[0] ? name : "filter " + std::to_string(id)});
  }
  return out;
}

bool followed(H5Z_filter_t id) {
  return id == H5Z_FILTER_DEFLATE || id == H5Z_FILTER_SHUFFLE || id == H5Z_FILTER_FLETCHER32;
}

// The info of an open HDF5 dataset.
ArrayInfo h5_info(hid_t ds) {
  ArrayInfo info;
  H5Handle space(H5Dget_space(ds), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  info.shape.assign(dims.begin(), dims.end());
  H5Handle type(H5Dget_type(ds), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type);
  const size_t bytes = H5Tget_size(type);
  // Only the types a sample holds: HDF5 converts any integer or float layout a file declares, and
  // converting a malformed one (a 131072-byte integer) overruns its own buffers.
  const bool plain = H5Tget_precision(type) == 8 * bytes && H5Tget_offset(type) == 0;
  if (plain && ((cls == H5T_INTEGER && (bytes == 1 || bytes == 2 || bytes == 4 || bytes == 8)) ||
                (cls == H5T_FLOAT && (bytes == 4 || bytes == 8)))) {
    info.floating = cls == H5T_FLOAT;
    info.type = type_name(info.floating, cls == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2, bytes);
  } else {
    info.unreadable = "holds neither 8- to 64-bit integers nor 32- or 64-bit floats";
  }
  H5Handle create(H5Dget_create_plist(ds), H5Pclose);
  for (const Filter& f : filters_of(create))
    if (!followed(f.id) && info.unreadable.empty())
      info.unreadable =
          "is stored with the HDF5 filter '" + f.name +
          "'; samples are read stored raw or with gzip, shuffle and fletcher32 (rewrite it with h5repack -f GZIP=1)";
  return info;
}

// The selection of a read: start and count of every dimension, and the box's extent.
struct Selection {
  std::vector<hsize_t> start, count;
  std::array<int64_t, 3> extent{1, 1, 1};
  int first = 0;  // the index of D
};

Selection select(const ArrayRef& a, const Shape& shape, VolumeBox box, bool channels_last) {
  const int rank = static_cast<int>(shape.size());
  Selection s;
  s.start.assign(rank, 0);
  s.count.assign(shape.begin(), shape.end());
  if (rank < 3) return s;
  if (channels_last && rank != 4)
    fail(a, detail::concat("a channels-last volume must be (D, H, W, C), not ", shape_str(shape)));
  s.first = channels_last ? 0 : rank - 3;
  const bool whole = box.empty();
  for (int d = 0; d < 3; ++d) {
    const int64_t n = shape[s.first + d];
    if (whole) box.end[d] = n;
    if (box.begin[d] < 0 || box.end[d] > n || box.begin[d] >= box.end[d])
      fail(a, detail::concat("box ", box.str(), " is outside its volume ", shape_str(shape)));
    s.start[s.first + d] = static_cast<hsize_t>(box.begin[d]);
    s.count[s.first + d] = static_cast<hsize_t>(box.end[d] - box.begin[d]);
    s.extent[d] = box.end[d] - box.begin[d];
  }
  return s;
}

// (d, h, w, C) values into (C, d, h, w).
Tensor channels_first(const std::vector<float>& v, const std::array<int64_t, 3>& e, int64_t c) {
  Tensor out({c, e[0], e[1], e[2]});
  const int64_t n = e[0] * e[1] * e[2];
  float* o = out.data();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ci = 0; ci < c; ++ci) o[ci * n + i] = v[i * c + ci];
  return out;
}

// The shape of a channels-first read: the selection's counts.
Shape read_shape(const Selection& s) { return Shape(s.count.begin(), s.count.end()); }

// The length of a zlib stream's output, counted up to limit + 1 bytes; -1 when the stream is broken.
int64_t inflated_size(const std::vector<unsigned char>& in, size_t limit) {
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return -1;
  std::vector<unsigned char> out(std::min<size_t>(limit + 1, 1 << 20));
  z.next_in = const_cast<unsigned char*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  int64_t total = 0;
  int rc = Z_OK;
  while (rc == Z_OK && total <= static_cast<int64_t>(limit)) {
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(out.size());
    rc = inflate(&z, Z_NO_FLUSH);
    total += static_cast<int64_t>(out.size() - z.avail_out);
    if (rc == Z_BUF_ERROR && z.avail_in == 0) break;  // the stream ends early
  }
  inflateEnd(&z);
  return rc == Z_STREAM_END || total > static_cast<int64_t>(limit) ? total : -1;
}

// The bytes chunk `offset` yields once its filters are undone, -1 when they cannot be undone.
int64_t decoded_size(hid_t ds, const std::vector<Filter>& filters, const std::vector<hsize_t>& offset, hsize_t stored,
                     size_t expect) {
  uint32_t mask = 0;
  std::vector<unsigned char> bytes(stored);
  if (H5Dread_chunk(ds, H5P_DEFAULT, offset.data(), &mask, bytes.data()) < 0) return -1;
  int64_t size = static_cast<int64_t>(stored);
  bool inflated = false;  // then only the length is known, not the bytes
  for (size_t i = filters.size(); i-- > 0;) {
    if (mask & (1u << i)) continue;                // skipped for this chunk when it was written
    if (filters[i].id == H5Z_FILTER_FLETCHER32) {  // a checksum after the data, which HDF5 checks
      if (size < 4) return -1;
      size -= 4;
      if (!inflated) bytes.resize(static_cast<size_t>(size));
    } else if (filters[i].id == H5Z_FILTER_DEFLATE) {
      if (inflated) return -1;  // compressed twice: not a file any writer makes
      size = inflated_size(bytes, expect + 64);
      if (size < 0) return -1;
      inflated = true;
    }  // shuffle keeps the length
  }
  return size;
}

// Checks every chunk a selection touches and returns their stored bytes.
uint64_t check_chunks(const ArrayRef& a, hid_t ds, hid_t create, const std::vector<hsize_t>& chunk,
                      const Selection& sel, size_t item, hsize_t file_bytes) {
  const int rank = static_cast<int>(sel.start.size());
  std::vector<hsize_t> first(rank), last(rank), at(rank), offset(rank);
  size_t expect = item;
  for (int i = 0; i < rank; ++i) {
    if (chunk[i] == 0) fail(a, "a chunk dimension of 0 (a malformed file?)");
    expect *= chunk[i];
  }
  const std::vector<Filter> filters = filters_of(create);  // followed ones: h5_info checked them
  double touched = 1;
  for (int i = 0; i < rank; ++i) {
    first[i] = sel.start[i] / chunk[i];
    last[i] = (sel.start[i] + sel.count[i] - 1) / chunk[i];
    at[i] = first[i];
    touched *= static_cast<double>(last[i] - first[i] + 1);
  }
  // Every chunk read must have been written: HDF5 would fill the others in, as many as the
  // dataset's declared shape has (a corrupt one, billions).
  hsize_t written = 0;
  H5Handle space(H5Dget_space(ds), H5Sclose);
  if (H5Dget_num_chunks(ds, space, &written) < 0) fail(a, "cannot count its chunks (a corrupt file?)");
  if (touched > static_cast<double>(written))
    fail(a, detail::concat("reading it needs ", touched, " chunks, and the file holds ", written,
                           " (chunks never written: an incomplete or corrupt file?)"));
  uint64_t stored_total = 0;
  for (;;) {  // every chunk index between first and last, like an odometer
    for (int i = 0; i < rank; ++i) offset[i] = at[i] * chunk[i];
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t stored = 0;
    if (H5Dget_chunk_info_by_coord(ds, offset.data(), &mask, &addr, &stored) < 0)
      fail(a, "cannot locate its chunks (a corrupt file?)");
    const std::string where = "the chunk at " + shape_str(Shape(offset.begin(), offset.end()));
    if (addr == HADDR_UNDEF) fail(a, where + " was never written (an incomplete file?)");
    // H5Dread_chunk and H5Dread find a chunk as H5Dget_chunk_storage_size does; a corrupt index
    // can name one offset twice, and then this lookup can disagree with theirs.
    hsize_t read_size = 0;
    if (H5Dget_chunk_storage_size(ds, offset.data(), &read_size) < 0 || read_size != stored)
      fail(a, "its chunk index is inconsistent (a corrupt file?)");
    if (stored > file_bytes)
      fail(a, detail::concat(where, " claims ", stored, " bytes, more than the file's ", file_bytes,
                             " (a corrupt file?)"));
    const int64_t got = decoded_size(ds, filters, offset, stored, expect);
    if (got < 0) fail(a, where + " cannot be decompressed (a corrupt file?)");
    if (got != static_cast<int64_t>(expect))
      fail(a, detail::concat(where, " holds ", got, " bytes, its shape needs ", expect, " (a corrupt file?)"));
    stored_total += stored;
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
  return stored_total;
}

ArrayRead read_h5(const ArrayRef& a, const VolumeBox& box, bool channels_last) {
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Handle file = open_h5(a.path);
  H5Handle ds(H5Dopen2(file, a.key.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail(a, "no such dataset");
  const ArrayInfo info = h5_info(ds);
  if (!info.unreadable.empty()) fail(a, info.unreadable);
  const Selection sel = select(a, info.shape, box, channels_last);
  const int rank = static_cast<int>(info.shape.size());
  H5Handle type(H5Dget_type(ds), H5Tclose);
  const size_t item = H5Tget_size(type);
  // Sizes in doubles until the file is known to hold them: a corrupt shape overflows an int64.
  double data_bytes = static_cast<double>(item), read_elements = 1;
  for (int i = 0; i < rank; ++i) {
    data_bytes *= static_cast<double>(info.shape[i]);
    read_elements *= static_cast<double>(sel.count[i]);
  }
  hsize_t file_bytes = 0;
  H5Fget_filesize(file, &file_bytes);
  H5Handle create(H5Dget_create_plist(ds), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(create);
  uint64_t stored_bytes = static_cast<uint64_t>(read_elements) * item;
  if (layout == H5D_CHUNKED) {
    // HDF5 allocates a whole chunk to read any of it: a chunk far larger than its dataset (a
    // malformed or hostile file) is refused before it is.
    // Chunks of another rank than the dataspace's (a scalar in chunks) send H5Dread round forever.
    std::vector<hsize_t> chunk(std::max(rank, 1));
    if (rank == 0 || H5Pget_chunk(create, rank, chunk.data()) != rank)
      fail(a, detail::concat("its chunks and its shape ", shape_str(info.shape), " differ in rank (a corrupt file?)"));
    double chunk_bytes = static_cast<double>(item);
    for (int i = 0; i < rank; ++i) chunk_bytes *= static_cast<double>(chunk[i]);
    if (chunk_bytes > std::max(64.0 * (1 << 20), 4 * data_bytes))
      fail(a,
           detail::concat("its chunks of ", chunk_bytes, " bytes are far larger than the array (a malformed file?)"));
    // Then what is read is bounded by the chunks the file holds, each checked to decode whole.
    if (read_elements > 0) stored_bytes = check_chunks(a, ds, create, chunk, sel, item, file_bytes);
  } else if (layout == H5D_COMPACT) {
    // The same copy as a chunk's, out of the bytes the dataset's header holds.
    if (static_cast<double>(H5Dget_storage_size(ds)) != data_bytes)
      fail(a, detail::concat("its header holds ", H5Dget_storage_size(ds), " bytes of data, its shape needs ",
                             data_bytes, " (a corrupt file?)"));
  } else if (layout == H5D_CONTIGUOUS) {
    if (data_bytes > static_cast<double>(file_bytes))
      fail(a, detail::concat("its shape needs ", data_bytes, " bytes, and the file holds ", file_bytes,
                             " (a truncated or corrupt file?)"));
  } else {
    fail(a, "is a virtual dataset (it maps other files); samples are read from the datasets themselves");
  }
  const auto numel = static_cast<int64_t>(read_elements);
  H5Handle space(H5Dget_space(ds), H5Sclose);
  if (rank > 0) H5Sselect_hyperslab(space, H5S_SELECT_SET, sel.start.data(), nullptr, sel.count.data(), nullptr);
  H5Handle mem(rank > 0 ? H5Screate_simple(rank, sel.count.data(), nullptr) : H5Screate(H5S_SCALAR), H5Sclose);
  std::vector<float> buf(static_cast<size_t>(numel));
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, buf.data()) < 0)
    fail(a, "cannot read (a corrupt or truncated file?)");
  ArrayRead r;
  if (channels_last && rank == 4) {
    r.values = channels_first(buf, sel.extent, static_cast<int64_t>(sel.count[3]));
  } else {
    r.values = Tensor(read_shape(sel));
    std::memcpy(r.values.data(), buf.data(), buf.size() * sizeof(float));
  }
  r.stored_bytes = stored_bytes;  // for chunks, their stored (compressed) bytes
  return r;
}

// ---- .npy (format versions 1 to 3: magic, version, header length, a Python dict literal)

struct NpyHeader {
  ArrayInfo info;
  char order = '<';  // byte order of the elements: '<', '>' or '|'
  size_t item = 0;   // bytes per element
  char kind = 'f';   // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  uint64_t data_offset = 0;
};

class Fd {
 public:
  explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) fail_file(path, std::string("cannot open: ") + std::strerror(errno));
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  // Reads exactly n bytes at offset, or fails naming the file (a truncated file).
  void read_at(const std::string& path, void* out, size_t n, uint64_t offset) const {
    size_t got = 0;
    while (got < n) {
      const ssize_t k = ::pread(fd_, static_cast<char*>(out) + got, n - got, static_cast<off_t>(offset + got));
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail_file(path, std::string("read failed: ") + std::strerror(errno));
      if (k == 0) fail_file(path, "truncated: the file ends before its array does");
      got += static_cast<size_t>(k);
    }
  }
  uint64_t size() const {
    const off_t end = ::lseek(fd_, 0, SEEK_END);
    return end < 0 ? 0 : static_cast<uint64_t>(end);
  }

 private:
  int fd_;
};

NpyHeader npy_header(const std::string& path, const Fd& fd) {
  char pre[12] = {};
  if (fd.size() < 10) fail_file(path, "not a .npy file (too short)");
  fd.read_at(path, pre, 10, 0);
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) fail_file(path, "not a .npy file (no NUMPY magic)");
  const int major = static_cast<unsigned char>(pre[6]);
  uint64_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(pre[8]) | (static_cast<unsigned char>(pre[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    fd.read_at(path, pre, 12, 0);
    for (int i = 0; i < 4; ++i) header_len |= static_cast<uint64_t>(static_cast<unsigned char>(pre[8 + i])) << (8 * i);
    start = 12;
  } else {
    fail_file(path, detail::concat("unsupported .npy format version ", major));
  }
  if (header_len > (1u << 20)) fail_file(path, "malformed .npy header");
  std::string h(header_len, '\0');
  fd.read_at(path, h.data(), header_len, start);
  static const std::regex kDescr("'descr'\\s*:\\s*'([<>|=])([fiub])([0-9]{1,2})'");
  static const std::regex kFortran("'fortran_order'\\s*:\\s*(True|False)");
  static const std::regex kShape("'shape'\\s*:\\s*\\(([0-9,\\s]*)\\)");
  std::smatch m;
  NpyHeader out;
  if (!std::regex_search(h, m, kDescr))
    fail_file(path, "the .npy array's dtype is not a number type (expected e.g. '<f4', '|u1', '<i2'): " + h);
  out.order = m[1].str()[0] == '=' ? '<' : m[1].str()[0];
  out.kind = m[2].str()[0];
  out.item = std::stoul(m[3].str());
  const bool ok_size = out.kind == 'f' ? (out.item == 4 || out.item == 8)
                                       : (out.item == 1 || out.item == 2 || out.item == 4 || out.item == 8);
  if (!ok_size) fail_file(path, "unsupported .npy dtype " + m[0].str());
  if (out.order == '>' && out.item > 1)
    fail_file(path, "big-endian .npy arrays are not supported (save with dtype '<...')");
  if (!std::regex_search(h, m, kFortran)) fail_file(path, "malformed .npy header (no fortran_order)");
  if (m[1] == "True")
    fail_file(path, "the array is stored in Fortran order; save it with np.save(f, np.ascontiguousarray(a))");
  if (!std::regex_search(h, m, kShape)) fail_file(path, "malformed .npy header (no shape)");
  std::string dims = m[1].str();
  static const std::regex kNumber("[0-9]+");
  uint64_t elements = 1;
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), kNumber); it != std::sregex_iterator(); ++it) {
    if (it->length() > 12) fail_file(path, "malformed .npy header (a dimension of " + it->str() + ")");
    const int64_t d = std::stoll(it->str());
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements) || elements > (uint64_t{1} << 48))
      fail_file(path, "malformed .npy header (its shape has more elements than any file holds)");
    out.info.shape.push_back(d);
  }
  out.info.floating = out.kind == 'f';
  out.info.type = out.kind == 'b' ? "bool" : type_name(out.info.floating, out.kind == 'i', out.item);
  out.data_offset = start + header_len;
  const uint64_t need = out.data_offset + elements * out.item;
  if (fd.size() < need)
    fail_file(path, detail::concat("truncated: ", fd.size(), " bytes, but its header describes ", need));
  return out;
}

void to_float(const NpyHeader& h, const char* in, float* out, size_t n) {
  auto conv = [&](auto zero) {
    using T = decltype(zero);
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, in + i * sizeof(T), sizeof(T));
      out[i] = static_cast<float>(v);
    }
  };
  switch (h.kind) {
    case 'f':
      if (h.item == 4) conv(float{});
      else conv(double{});
      break;
    case 'i':
      if (h.item == 1) conv(int8_t{});
      else if (h.item == 2) conv(int16_t{});
      else if (h.item == 4) conv(int32_t{});
      else conv(int64_t{});
      break;
    default:  // 'u', 'b'
      if (h.item == 1) conv(uint8_t{});
      else if (h.item == 2) conv(uint16_t{});
      else if (h.item == 4) conv(uint32_t{});
      else conv(uint64_t{});
  }
}

ArrayRead read_npy(const ArrayRef& a, const VolumeBox& box, bool channels_last) {
  Fd fd(a.path);
  const NpyHeader h = npy_header(a.path, fd);
  const Shape& shape = h.info.shape;
  const Selection sel = select(a, shape, box, channels_last);
  const int rank = static_cast<int>(shape.size());
  ArrayRead r;
  if (rank < 3) {
    const auto n = static_cast<size_t>(shape_numel(shape));
    std::vector<char> raw(n * h.item);
    fd.read_at(a.path, raw.data(), raw.size(), h.data_offset);
    r.values = Tensor(shape);
    to_float(h, raw.data(), r.values.data(), n);
    r.stored_bytes = raw.size();
    return r;
  }
  // Rows of the last dimension: channels first, W of one (lead, z, y); channels last, W x C of one (z, y).
  const int64_t D = shape[sel.first], H = shape[sel.first + 1], W = shape[sel.first + 2];
  const int64_t C = channels_last ? shape[3] : 1;
  int64_t lead = 1;
  for (int i = 0; i < sel.first; ++i) lead *= shape[i];
  const int64_t x0 = static_cast<int64_t>(sel.start[sel.first + 2]);
  const int64_t w = sel.extent[2], row = w * C;
  std::vector<char> raw(static_cast<size_t>(row) * h.item);
  std::vector<float> vals(static_cast<size_t>(lead * sel.extent[0] * sel.extent[1] * row));
  float* out = vals.data();
  for (int64_t l = 0; l < lead; ++l)
    for (int64_t z = 0; z < sel.extent[0]; ++z)
      for (int64_t y = 0; y < sel.extent[1]; ++y) {
        const int64_t zz = static_cast<int64_t>(sel.start[sel.first]) + z,
                      yy = static_cast<int64_t>(sel.start[sel.first + 1]) + y;
        const int64_t element = (((l * D + zz) * H + yy) * W + x0) * C;
        fd.read_at(a.path, raw.data(), raw.size(), h.data_offset + static_cast<uint64_t>(element) * h.item);
        to_float(h, raw.data(), out, static_cast<size_t>(row));
        out += row;
        r.stored_bytes += raw.size();
      }
  if (channels_last) {
    r.values = channels_first(vals, sel.extent, C);
  } else {
    r.values = Tensor(read_shape(sel));
    std::memcpy(r.values.data(), vals.data(), vals.size() * sizeof(float));
  }
  return r;
}

void write_dataset(hid_t file, const std::string& path, const std::string& name, const Tensor& t, hid_t file_type,
                   const std::vector<hsize_t>& chunk) {
  std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!chunk.empty()) {
    H5Pset_chunk(plist, static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(plist, 1);
  }
  H5Handle ds(H5Dcreate2(file, name.c_str(), file_type, space, H5P_DEFAULT, plist, H5P_DEFAULT), H5Dclose);
  if (ds < 0) fail_file(path, "cannot create dataset " + name);
  if (H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data()) < 0)
    fail_file(path, "cannot write dataset " + name);
}

}  // namespace

std::string VolumeBox::str() const {
  return detail::concat("[", begin[0], ":", end[0], ", ", begin[1], ":", end[1], ", ", begin[2], ":", end[2], "]");
}

std::string ArrayInfo::str() const { return type + " " + shape_str(shape); }

std::string ArrayRef::str() const { return key.empty() ? "'" + path + "'" : "'" + path + "' dataset '" + key + "'"; }

std::map<std::string, ArrayInfo> h5_arrays(const std::string& path) {
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Handle file = open_h5(path);
  std::map<std::string, ArrayInfo> out;
  hsize_t n = 0;
  H5G_info_t gi;
  if (H5Gget_info(file, &gi) < 0) fail_file(path, "cannot list its datasets (corrupt?)");
  n = gi.nlinks;
  for (hsize_t i = 0; i < n; ++i) {
    char name[256] = {};
    if (H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof(name), H5P_DEFAULT) < 0) continue;
    H5O_info_t oi;
    if (H5Oget_info_by_name(file, name, &oi, H5P_DEFAULT) < 0 || oi.type != H5O_TYPE_DATASET) continue;
    H5Handle ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
    if (ds >= 0) out[name] = h5_info(ds);
  }
  return out;
}

ArrayInfo array_info(const ArrayRef& a) {
  if (a.key.empty()) {
    Fd fd(a.path);
    return npy_header(a.path, fd).info;
  }
  const auto arrays = h5_arrays(a.path);
  auto it = arrays.find(a.key);
  if (it == arrays.end()) fail(a, "no such dataset");
  if (!it->second.unreadable.empty()) fail(a, it->second.unreadable);
  return it->second;
}

ArrayRead read_array(const ArrayRef& a, const VolumeBox& box, bool channels_last) {
  return a.key.empty() ? read_npy(a, box, channels_last) : read_h5(a, box, channels_last);
}

void write_h5_sample(const std::string& path, const std::string& input_key, const Tensor& input,
                     const std::string& target_key, const Tensor& target, bool int16_input, bool labels) {
  TESSERA_CHECK(input.rank() == 4, "sample volume ", shape_str(input.shape()));
  std::lock_guard<std::mutex> lock(h5_mutex());
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (file < 0) fail_file(path, "cannot create the file");
  const std::vector<hsize_t> chunk = {
      static_cast<hsize_t>(input.dim(0)), static_cast<hsize_t>(std::min<int64_t>(8, input.dim(1))),
      static_cast<hsize_t>(std::min<int64_t>(32, input.dim(2))), static_cast<hsize_t>(input.dim(3))};
  write_dataset(file, path, input_key, input, int16_input ? H5T_STD_I16LE : H5T_IEEE_F32LE, chunk);
  if (labels) {
    write_dataset(file, path, target_key, target, H5T_STD_I16LE, {chunk[1], chunk[2], chunk[3]});
  } else {
    write_dataset(file, path, target_key, target, H5T_IEEE_F32LE, {});
  }
  if (H5Fflush(file, H5F_SCOPE_LOCAL) < 0) fail_file(path, "cannot flush");
}

void write_npy(const std::string& path, const Tensor& t) {
  std::string dims;  // a Python tuple: (4,) or (4, 8)
  for (size_t i = 0; i < t.shape().size(); ++i) dims += (i ? ", " : "") + std::to_string(t.shape()[i]);
  if (t.rank() == 1) dims += ",";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char*>(t.data()), t.numel() * sizeof(float));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail_file(path, std::string("cannot create: ") + std::strerror(errno));
  const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  if (std::fclose(f) != 0 || !ok) fail_file(path, "write failed");
}

}  // namespace tessera
