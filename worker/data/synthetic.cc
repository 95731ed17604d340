#include "worker/data/synthetic.h"

#include <cmath>
#include <random>

#include "common/error.h"

namespace tessera {
namespace {

std::mt19937_64 rng_for(uint64_t seed, uint64_t index) {
  std::seed_seq s{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(index),
                  static_cast<uint32_t>(index >> 32)};
  return std::mt19937_64(s);
}

void fft1d(double* re, double* im, int n, int stride, bool inverse) {
  // Bit reversal.
  for (int i = 1, j = 0; i < n; ++i) {
    int bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) {
      std::swap(re[i * stride], re[j * stride]);
      std::swap(im[i * stride], im[j * stride]);
    }
  }
  for (int len = 2; len <= n; len <<= 1) {
    const double ang = 2 * M_PI / len * (inverse ? 1 : -1);
    const double wr = std::cos(ang), wi = std::sin(ang);
    for (int i = 0; i < n; i += len) {
      double cr = 1, ci = 0;
      for (int j = 0; j < len / 2; ++j) {
        const int a = (i + j) * stride, b = (i + j + len / 2) * stride;
        const double tr = re[b] * cr - im[b] * ci, ti = re[b] * ci + im[b] * cr;
        re[b] = re[a] - tr;
        im[b] = im[a] - ti;
        re[a] += tr;
        im[a] += ti;
        const double nr = cr * wr - ci * wi;
        ci = cr * wi + ci * wr;
        cr = nr;
      }
    }
  }
}

}  // namespace

void fft3d(std::vector<double>& re, std::vector<double>& im, int n, bool inverse) {
  TESSERA_CHECK(n > 0 && (n & (n - 1)) == 0, "fft size ", n, " is not a power of two");
  const int64_t n2 = int64_t(n) * n;
  for (int64_t a = 0; a < n2; ++a) fft1d(re.data() + a * n, im.data() + a * n, n, 1, inverse);  // along W
  for (int64_t d = 0; d < n; ++d)
    for (int w = 0; w < n; ++w) fft1d(re.data() + d * n2 + w, im.data() + d * n2 + w, n, n, inverse);  // along H
  for (int64_t hw = 0; hw < n2; ++hw) fft1d(re.data() + hw, im.data() + hw, n, static_cast<int>(n2), inverse);  // D
  if (inverse) {
    const double s = 1.0 / (double(n2) * n);
    for (size_t i = 0; i < re.size(); ++i) {
      re[i] *= s;
      im[i] *= s;
    }
  }
}

void log1p_inplace(Tensor& t) {
  for (float& v : t.span()) v = std::log1p(v);
}

Sample cosmo_sample(int W, uint64_t seed, uint64_t index, bool raw) {
  TESSERA_CHECK(W >= 4 && (W & (W - 1)) == 0, "cosmo field size ", W, " is not a power of two");
  auto rng = rng_for(seed, index);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // Physical parameters, and the targets: each mapped linearly to [-1, 1].
  const double log_amp = -1.0 + 2.0 * u(rng);                       // A = e^log_amp in [0.37, 2.7]
  const double slope = 1.0 + 2.0 * u(rng);                          // n in [1, 3]
  const double smooth = 0.2 + 0.6 * u(rng);                         // r in [0.2, 0.8] voxels
  const double log_nbar = std::log(3.0) + std::log(10.0) * u(rng);  // mean density in [3, 30]
  const double amp = std::exp(log_amp);
  Tensor target({4});
  target[0] = static_cast<float>(log_amp);
  target[1] = static_cast<float>(slope - 2.0);
  target[2] = static_cast<float>((smooth - 0.5) / 0.3);
  target[3] = static_cast<float>((log_nbar - std::log(3.0)) / std::log(10.0) * 2 - 1);

  const int64_t n3 = int64_t(W) * W * W;
  std::vector<double> re(n3), im(n3, 0.0);
  std::normal_distribution<double> g(0.0, 1.0);
  for (auto& v : re) v = g(rng);
  fft3d(re, im, W, false);
  double var = 0;
  for (int d = 0; d < W; ++d)
    for (int h = 0; h < W; ++h)
      for (int w = 0; w < W; ++w) {
        auto freq = [W](int i) { return double(i <= W / 2 ? i : i - W); };
        const double k = std::sqrt(freq(d) * freq(d) + freq(h) * freq(h) + freq(w) * freq(w));
        const int64_t i = (int64_t(d) * W + h) * W + w;
        double f = 0;
        if (k > 0) {
          const double kk = k * 2 * M_PI / W;  // radians per voxel: statistics per voxel do not depend on W
          f = std::sqrt(amp * std::pow(kk / 0.8, -slope) * std::exp(-(kk * smooth) * (kk * smooth)));
        }
        re[i] *= f;
        im[i] *= f;
      }
  fft3d(re, im, W, true);
  for (double v : re) var += v * v;
  var /= n3;
  // One fixed scale for all samples (so the amplitude stays visible in the contrast), chosen so the
  // contrast has a standard deviation of about 0.5 at the middle of the parameter ranges.
  const double norm = 3.0;
  Tensor input({4, W, W, W});
  const double growth[4] = {1.0, 0.75, 0.5, 0.3};
  const double nbar = std::exp(log_nbar);
  for (int c = 0; c < 4; ++c) {
    const double g = growth[c];
    const double s2 = var * norm * norm;
    for (int64_t i = 0; i < n3; ++i) {
      const double delta = re[i] * norm;
      input[c * n3 + i] = static_cast<float>(nbar * std::exp(g * delta - g * g * s2 / 2));
    }
  }
  if (!raw) log1p_inplace(input);
  return Sample{input, target};
}

Sample shapes_sample(int W, int classes, uint64_t seed, uint64_t index) {
  TESSERA_CHECK(classes >= 3, "shapes need 3 classes, got ", classes);
  auto rng = rng_for(seed, index);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  Tensor input({1, W, W, W}), label = Tensor::zeros({W, W, W});
  for (int64_t i = 0; i < input.numel(); ++i) input[i] = noise(rng);
  const int objects = 2 + static_cast<int>(u(rng) * 3);
  for (int o = 0; o < objects; ++o) {
    const bool sphere = u(rng) < 0.5;
    const double r = W * (0.1 + 0.12 * u(rng));
    const double cz = r + u(rng) * (W - 2 * r), cy = r + u(rng) * (W - 2 * r), cx = r + u(rng) * (W - 2 * r);
    const float value = sphere ? 1.0f : -1.0f;
    for (int d = 0; d < W; ++d)
      for (int h = 0; h < W; ++h)
        for (int w = 0; w < W; ++w) {
          const double dz = d + 0.5 - cz, dy = h + 0.5 - cy, dx = w + 0.5 - cx;
          const bool in = sphere ? dz * dz + dy * dy + dx * dx <= r * r
                                 : std::fabs(dz) <= r && std::fabs(dy) <= r && std::fabs(dx) <= r;
          if (!in) continue;
          const int64_t i = (int64_t(d) * W + h) * W + w;
          input[i] = value + noise(rng);
          label[i] = sphere ? 1.0f : 2.0f;
        }
  }
  return Sample{input, label};
}

Sample image_sample(int W, int classes, uint64_t seed, uint64_t index, int channels) {
  auto rng = rng_for(seed, index);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  const int label = static_cast<int>(u(rng) * classes) % classes;
  const double theta = M_PI * (label + 0.2 + 0.6 * u(rng)) / classes;
  const double freq = 2 * M_PI / (3.0 + 2.0 * u(rng)), phase = 2 * M_PI * u(rng);
  Tensor input({channels, W, W}), target(Shape{});
  for (int c = 0; c < channels; ++c) {
    const double shift = c ? 2 * M_PI * u(rng) : 0.0;  // channel 0 is the one-channel image
    for (int h = 0; h < W; ++h)
      for (int w = 0; w < W; ++w)
        input[(c * W + h) * W + w] =
            static_cast<float>(std::sin(freq * (w * std::cos(theta) + h * std::sin(theta)) + phase + shift)) +
            noise(rng);
  }
  target[0] = static_cast<float>(label);
  return Sample{input, target};
}

}  // namespace tessera
