// Synthetic datasets that are learnable, generated deterministically from (seed, index) so every
// rank sees the same sample without storage:
//   cosmo   4 x W^3 matter-like fields: a Gaussian random field with power spectrum
//           P(k) = A (k/0.8)^-n exp(-(k r)^2) (k in radians per voxel), turned into positive densities
//           rho = nbar exp(g delta - g^2 s^2 / 2) at four growth factors g (the channels); targets are
//           (log A, n, r, log nbar), each scaled to [-1, 1].
//   shapes  1 x W^3 volumes with a few solid spheres and boxes in noise; voxel labels 0 (background),
//           1 (sphere), 2 (box).
//   images  C x W^2 noisy oriented gratings (each channel its own phase and noise); the label is the
//           orientation bin (classes bins).
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "worker/core/tensor.h"

namespace tessera {

struct Sample {
  Tensor input;   // (C, spatial...)
  Tensor target;  // regression targets, or labels as floats
};

// Transforms applied to cosmo inputs by the loader: log1p of the density.
void log1p_inplace(Tensor& t);

// raw: the densities themselves (as stored in files); otherwise log1p-transformed (as trained on).
Sample cosmo_sample(int W, uint64_t seed, uint64_t index, bool raw = false);
Sample shapes_sample(int W, int classes, uint64_t seed, uint64_t index);
Sample image_sample(int W, int classes, uint64_t seed, uint64_t index, int channels = 1);

// In-place 3D FFT of an n^3 complex array (n a power of two); inverse scales by 1/n^3.
void fft3d(std::vector<double>& re, std::vector<double>& im, int n, bool inverse);

}  // namespace tessera
