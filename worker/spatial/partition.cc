#include "worker/spatial/partition.h"

#include <algorithm>

#include "common/error.h"

namespace tessera {
namespace {
const char* kDimName[3] = {"D", "H", "W"};
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }
}  // namespace

int64_t window_output(int64_t in, const Window& w) {
  if (w.transposed) return (in - 1) * w.stride - w.pad_before - w.pad_after + w.kernel;
  return (in + w.pad_before + w.pad_after - w.kernel) / w.stride + 1;
}

Need needed_input(Range out, int64_t in_extent, const Window& w) {
  Need n;
  if (!w.transposed) {
    const int64_t first = out.begin * w.stride - w.pad_before;                // first input read
    const int64_t last = (out.end - 1) * w.stride - w.pad_before + w.kernel;  // one past the last
    n.input = {std::max<int64_t>(0, first), std::min(in_extent, last)};
    n.pad_before = static_cast<int>(n.input.begin - first);
    n.pad_after = static_cast<int>(last - n.input.end);
    return n;
  }
  // Inputs i with i*s - p + a in [o0, o1) for some a in [0, k).
  const int64_t i0 = std::max<int64_t>(0, ceil_div(out.begin + w.pad_before - w.kernel + 1, w.stride));
  const int64_t i1 = std::min(in_extent, floor_div(out.end - 1 + w.pad_before, w.stride) + 1);
  n.input = {i0, i1};
  // The local transposed convolution crops its output to [o0, o1).
  n.pad_before = static_cast<int>(out.begin - i0 * w.stride + w.pad_before);
  n.pad_after = static_cast<int>((i1 - i0 - 1) * w.stride - n.pad_before + w.kernel - out.size());
  return n;
}

Partition::Partition(std::array<int64_t, 3> extent, SpatialGrid grid, int rank, const std::string& field)
    : extent_(extent), grid_(grid), rank_(rank) {
  if (grid.d < 1 || grid.h < 1 || grid.w < 1)
    throw ConfigError(field,
                      detail::concat("spatial grid ", grid.d, " x ", grid.h, " x ", grid.w, " has an empty dimension"));
  if (rank < 0 || rank >= grid.size())
    throw ConfigError(field, detail::concat("spatial rank ", rank, " is outside the grid of ", grid.size()));
  coord_ = {rank / (grid.h * grid.w), (rank / grid.w) % grid.h, rank % grid.w};
  for (int d = 0; d < 3; ++d)
    if (extent[d] < grid[d])
      throw ConfigError(field, detail::concat("dimension ", kDimName[d], " of size ", extent[d],
                                              " cannot be split into ", grid[d], " parts"));
}

Range Partition::owned_by(int dim, int coord) const {
  const int64_t n = extent_[dim], parts = grid_[dim];
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = coord * base + std::min<int64_t>(coord, extra);
  return {begin, begin + base + (coord < extra ? 1 : 0)};
}

int Partition::neighbor(int dim, int step) const {
  std::array<int, 3> c = coord_;
  c[dim] += step;
  if (c[dim] < 0 || c[dim] >= grid_[dim]) return -1;
  return (c[0] * grid_.h + c[1]) * grid_.w + c[2];
}

Partition output_partition(const Partition& in, const std::array<Window, 3>& w, const std::string& field) {
  std::array<int64_t, 3> out;
  for (int d = 0; d < 3; ++d) out[d] = window_output(in.extent()[d], w[d]);
  return Partition(out, in.grid(), in.rank(), field);
}

void check_halos(const Partition& in, const Partition& out, const std::array<Window, 3>& w, const std::string& field) {
  for (int d = 0; d < 3; ++d) {
    for (int c = 0; c < in.grid()[d]; ++c) {
      const Range own = in.owned_by(d, c);
      const Need need = needed_input(out.owned_by(d, c), in.extent()[d], w[d]);
      const int64_t left = own.begin - need.input.begin, right = need.input.end - own.end;
      const bool ok = (c == 0 || left <= in.owned_by(d, c - 1).size()) &&
                      (c + 1 == in.grid()[d] || right <= in.owned_by(d, c + 1).size());
      if (!ok)
        throw ConfigError(field, detail::concat("dimension ", kDimName[d], ": block ", c, " needs a halo of ",
                                                std::max(left, right), " but its neighbour holds fewer; use fewer ",
                                                "parts in ", kDimName[d], " or a larger volume"));
    }
  }
}

}  // namespace tessera
