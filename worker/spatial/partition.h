// Partition: how a 3D volume (N, C, D, H, W) is split in space over a spatial group of ranks, as a
// checked value type. The grid is d x h x w; member r sits at coordinates
// (r / (h w), (r / w) % h, r % w) and owns an even split of each dimension (the first extent % parts
// blocks one longer). A layer's window (kernel, stride, padding) maps an output block to the input
// range it needs; the part outside the rank's own block is its halo, taken from the neighbours.
// Construction fails with ConfigError naming the layer and the dimension when a split is impossible
// (a block empty, or a halo wider than the neighbouring block).
#pragma once

#include <array>
#include <string>

namespace tessera {

struct SpatialGrid {
  int d = 1, h = 1, w = 1;
  int size() const { return d * h * w; }
  int operator[](int i) const { return i == 0 ? d : i == 1 ? h : w; }
};

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// Along one dimension: output index o reads inputs o*stride - pad_before + [0, kernel) (convolution,
// pooling); transposed (deconvolution): input i writes outputs i*stride - pad_before + [0, kernel).
struct Window {
  int kernel = 1, stride = 1, pad_before = 0, pad_after = 0;
  bool transposed = false;
};

int64_t window_output(int64_t in, const Window& w);

// The input range an output block needs, clipped to [0, in_extent), and the padding the local
// computation adds on each side (non-zero only at the volume's edges).
struct Need {
  Range input;
  int pad_before = 0, pad_after = 0;
};
Need needed_input(Range out, int64_t in_extent, const Window& w);

class Partition {
 public:
  // Throws ConfigError(field, ...) when some block would be empty.
  Partition(std::array<int64_t, 3> extent, SpatialGrid grid, int rank, const std::string& field);

  const std::array<int64_t, 3>& extent() const { return extent_; }
  const SpatialGrid& grid() const { return grid_; }
  int rank() const { return rank_; }
  int coord(int dim) const { return coord_[dim]; }
  Range owned(int dim) const { return owned_by(dim, coord_[dim]); }
  Range owned_by(int dim, int coord) const;
  // The spatial rank of the neighbour at coord + step along dim, or -1 outside the grid.
  int neighbor(int dim, int step) const;

 private:
  std::array<int64_t, 3> extent_;
  SpatialGrid grid_;
  int rank_;
  std::array<int, 3> coord_;
};

// The partition of a layer's output with the same grid.
Partition output_partition(const Partition& in, const std::array<Window, 3>& w, const std::string& field);

// Throws ConfigError(field + " ...dimension X") when a halo of this layer is wider than the
// neighbouring input block it must come from (the split is too fine for the kernel).
void check_halos(const Partition& in, const Partition& out, const std::array<Window, 3>& w, const std::string& field);

}  // namespace tessera
