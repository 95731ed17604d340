// tessera-gpu-bench: the GPU figures of scripts/gpu-check.sh, one JSON line each.
//   mstopk      CUDA MSTopK at 25.6M floats, densities 0.001 and 0.01, against one pass over the
//               same floats in device memory (a sum of squares: each float read once)
//   conv3d      TFLOP/s of CosmoFlow's 3D convolutions at 128^3 (forward, backward-data,
//               backward-weights; TF32 allowed, as PyTorch's default), in cuDNN's NCDHW and NDHWC
//   cosmoflow   samples/s of a CosmoFlow training step at 128^3 on the GPU, and each layer's
//               forward and backward milliseconds
//   curves      50 steps of CosmoFlow at 64^3 on the GPU and on the CPU from the same weights and
//               batches (TF32 off): the largest relative difference of the two loss curves
// Built where CUDA is; it needs a GPU to run (it says so and exits 2 without one).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/flags.h"
#include "testing/tensors.h"
#include "worker/compress/cuda/topk_cuda.h"
#include "worker/core/device.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"
#include "worker/nn/conv.h"
#include "worker/nn/gpu/ops.h"
#include "worker/nn/optim.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of `repeat` calls of fn after one warm-up call (each ends with the stream idle).
double median_seconds(int repeat, const std::function<void()>& fn) {
  fn();
  gpu::synchronize();
  std::vector<double> t;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = Clock::now();
    fn();
    gpu::synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

using testing::random_tensor;

void print(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

void mstopk(int repeat) {
  const size_t d = 25600000;
  const Tensor x = random_tensor({static_cast<int64_t>(d)}, 1).to(Device::kCuda);
  const double pass = median_seconds(repeat, [&] { gpu::sum_squares(x.data(), static_cast<int64_t>(d)); });
  for (double density : {0.001, 0.01}) {
    const size_t k = static_cast<size_t>(std::ceil(density * d));
    Tensor idx({static_cast<int64_t>(k)}, Layout::kPlain, Device::kCuda),
        val({static_cast<int64_t>(k)}, Layout::kPlain, Device::kCuda);
    const double s = median_seconds(repeat, [&] {
      cuda::mstopk(x.data(), d, k, reinterpret_cast<uint32_t*>(idx.data()), val.data(), "bench", gpu::stream());
    });
    print({{"figure", "mstopk"},
           {"floats", d},
           {"density", density},
           {"k", k},
           {"ms", s * 1e3},
           {"memory_pass_ms", pass * 1e3},
           {"x_memory_pass", s / pass}});
  }
}

void conv3d(int repeat, int batch) {
  gpu::set_conv_tf32(true);
  // CosmoFlow's convolutions at 128^3: 4 -> 16 channels at 128^3, then doubling as the volume halves,
  // each in cuDNN's two layouts (the tensors' contents do not matter to the timing).
  std::vector<std::array<int, 3>> shapes = {{4, 16, 128}, {16, 32, 64}, {32, 64, 32}, {64, 128, 16}};
  for (auto [ci, co, s] : shapes) {
    for (bool channels_last : {false, true}) {
      gpu::ConvShape cs;
      cs.in = {batch, ci, s, s, s};
      cs.out = {batch, co, s, s, s};
      cs.in_channels = ci;
      cs.out_channels = co;
      cs.kernel = 3;
      cs.pad = {1, 1, 1};
      cs.channels_last = channels_last;
      gpu::Conv conv(cs);
      const Tensor x = random_tensor(cs.in, 2).to(Device::kCuda),
                   w = random_tensor({co, ci, 3, 3, 3}, 3).to(Device::kCuda);
      Tensor y(cs.out, Layout::kPlain, Device::kCuda), dx(cs.in, Layout::kPlain, Device::kCuda),
          dw({co, ci, 3, 3, 3}, Layout::kPlain, Device::kCuda);
      const double flops = 2.0 * batch * s * s * s * ci * co * 27;
      const double fwd = median_seconds(repeat, [&] { conv.forward(x.data(), w.data(), y.data()); });
      const double bwd_data = median_seconds(repeat, [&] { conv.backward_data(y.data(), w.data(), dx.data()); });
      const double bwd_filter = median_seconds(repeat, [&] { conv.backward_weights(x.data(), y.data(), dw.data()); });
      print({{"figure", "conv3d"},
             {"layout", channels_last ? "ndhwc" : "ncdhw"},
             {"batch", batch},
             {"in", ci},
             {"out", co},
             {"size", s},
             {"fwd_tflops", flops / fwd / 1e12},
             {"bwd_data_tflops", flops / bwd_data / 1e12},
             {"bwd_filter_tflops", flops / bwd_filter / 1e12},
             {"fwd_ms", fwd * 1e3},
             {"bwd_data_ms", bwd_data * 1e3},
             {"bwd_filter_ms", bwd_filter * 1e3}});
    }
  }
}

ModelConfig cosmoflow(int size) {
  ModelConfig mc;
  mc.name = "cosmoflow";
  mc.input_size = size;
  return mc;
}

void cosmoflow_step(int repeat, int batch) {
  gpu::set_conv_tf32(true);
  auto model = make_model(cosmoflow(128));
  model->to(Device::kCuda);
  auto opt = make_optimizer(OptimizerConfig{});
  const Tensor x = random_tensor({batch, 4, 128, 128, 128}, 4).to(Device::kCuda);
  const Tensor t = random_tensor({batch, 4}, 5).to(Device::kCuda);
  auto params = model->params();
  const double s = median_seconds(repeat, [&] {
    for (Param* p : params) p->grad.zero();
    const Tensor out = model->forward(x, true);
    const LossResult l = model->loss(out, t);
    model->backward(l.grad);
    opt->step(params, 1e-4);
  });
  print({{"figure", "cosmoflow"},
         {"framework", "tessera"},
         {"size", 128},
         {"batch", batch},
         {"step_ms", s * 1e3},
         {"samples_per_second", batch / s}});
  // Where the step goes: each layer's forward and backward alone (the layer timer idles the stream
  // at both ends), medians over `repeat` steps; the loss and the optimizer's update are the rest.
  const std::vector<Layer*> layers = model->layers();
  std::map<const Layer*, std::array<std::vector<double>, 2>> times;
  set_layer_timer([&](const Layer& l, bool backward, double s) { times[&l][backward].push_back(s); });
  for (int r = 0; r < repeat; ++r) {
    for (Param* p : params) p->grad.zero();
    const Tensor out = model->forward(x, true);
    model->backward(model->loss(out, t).grad);
  }
  set_layer_timer(nullptr);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] * 1e3;
  };
  nlohmann::json rows = nlohmann::json::array();
  for (const Layer* l : layers)
    rows.push_back({{"layer", l->name()}, {"fwd_ms", median(times[l][0])}, {"bwd_ms", median(times[l][1])}});
  print({{"figure", "cosmoflow_layers"}, {"size", 128}, {"batch", batch}, {"layers", rows}});
}

void curves(int steps, int batch) {
  gpu::set_conv_tf32(false);
  auto cpu = make_model(cosmoflow(64)), dev = make_model(cosmoflow(64));
  dev->to(Device::kCuda);
  OptimizerConfig oc;
  auto ocpu = make_optimizer(oc), odev = make_optimizer(oc);
  SyntheticConfig sc;
  sc.size = 64;
  sc.samples = static_cast<uint64_t>(steps * batch);
  const auto data = make_synthetic(sc);
  std::vector<double> lc, ld;
  double worst = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<uint64_t> idx;
    for (int i = 0; i < batch; ++i) idx.push_back(static_cast<uint64_t>(s * batch + i));
    const Batch b = stack(*data, idx);
    for (auto* m : {cpu.get(), dev.get()}) {
      const bool on_gpu = m == dev.get();
      const Device where = on_gpu ? Device::kCuda : Device::kCpu;
      auto params = m->params();
      for (Param* p : params) p->grad.zero();
      const Tensor out = m->forward(b.inputs.to(where), true);
      const LossResult l = m->loss(out, b.targets.to(where));
      m->backward(l.grad);
      (on_gpu ? odev : ocpu)->step(params, 1e-3);
      (on_gpu ? ld : lc).push_back(l.loss);
    }
    worst = std::max(worst, std::fabs(ld.back() - lc.back()) / std::max(1e-12, std::fabs(lc.back())));
  }
  print({{"figure", "curves"},
         {"size", 64},
         {"batch", batch},
         {"steps", steps},
         {"max_relative_difference", worst},
         {"cpu_loss", lc},
         {"gpu_loss", ld}});
}

int run(int argc, char** argv) {
  std::string only;
  int repeat = 10, batch = 8, steps = 50;
  Flags flags("tessera-gpu-bench",
              "usage: tessera-gpu-bench [--only mstopk|conv3d|cosmoflow|curves] [--repeat N] [--batch B] [--steps S]\n"
              "The GPU figures of scripts/gpu-check.sh, one JSON line each.");
  flags.text("--only", &only)
      .integer("--repeat", &repeat, 1, 1000)
      .integer("--batch", &batch, 1, 256)
      .integer("--steps", &steps, 1, 10000);
  if (!flags.parse(argc, argv)) return 0;
  if (!only.empty() && only != "mstopk" && only != "conv3d" && only != "cosmoflow" && only != "curves")
    throw ConfigError("--only", "'" + only + "' is not one of mstopk, conv3d, cosmoflow, curves");
  std::string why;
  if (gpu::device_count(&why) == 0) {
    print({{"figure", "none"}, {"status", "skipped"}, {"reason", "no usable CUDA device: " + why}});
    return 2;
  }
  gpu::set_device(0);
  if (only.empty() || only == "mstopk") mstopk(repeat);
  if (only.empty() || only == "conv3d") conv3d(repeat, batch);
  if (only.empty() || only == "cosmoflow") cosmoflow_step(repeat, batch);
  if (only.empty() || only == "curves") curves(steps, 4);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::keep_freed_tensor_memory();
  return tessera::run_command("tessera-gpu-bench", [&] { return tessera::run(argc, argv); });
}
