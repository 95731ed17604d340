#include "bench/bench.h"

#include <omp.h>
#include <sys/resource.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/models/model.h"
#include "worker/nn/conv.h"
#include "worker/nn/dnnl_util.h"
#include "worker/nn/optim.h"

namespace tessera::bench {

// Mean seconds of fn over `iters` calls after one warm-up call.
double time_it(const std::function<void()>& fn, int iters) {
  fn();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
}

// The PyTorch baseline of `train`, or null when python3 with torch is not installed.
nlohmann::json torch_baseline(int size, int batch, int threads, int iters, const std::string& hidden,
                              Precision precision, const char* layout) {
  return python_peer(detail::concat("torch_cosmoflow.py --size ", size, " --batch ", batch, " --threads ", threads,
                                    " --iters ", iters, " --hidden ", hidden, " --precision ",
                                    precision_name(precision), " --layout ", layout));
}

// The Transformer's peer (bench/torch/torch_transformer.py), or null without python3-torch.
nlohmann::json torch_transformer(const ModelConfig& m, int batch, int threads, int iters) {
  return python_peer(detail::concat("torch_transformer.py --vocab ", m.vocab_size, " --context ", m.context,
                                    " --width ", m.width, " --depth ", m.depth, " --heads ", m.heads, " --batch ",
                                    batch, " --threads ", threads, " --iters ", iters, " --precision ",
                                    precision_name(m.precision)));
}

// ResNet-50's peer (bench/torch/torch_resnet50.py) in one of PyTorch's layouts (nhwc: channels_last),
// or null without python3-torch.
nlohmann::json torch_resnet50(int size, int batch, int threads, int iters, const char* layout, Precision precision) {
  return python_peer(detail::concat("torch_resnet50.py --size ", size, " --batch ", batch, " --threads ", threads,
                                    " --iters ", iters, " --layout ", layout, " --precision ",
                                    precision_name(precision)));
}

// The peer of a convolutional model: the faster of PyTorch's runs in its two layouts (channels-last
// and its default, `plain`), as a user would pick; both figures go into `out`. Null where either run is.
nlohmann::json faster_layout(nlohmann::json& out, const nlohmann::json& channels_last, const nlohmann::json& plain,
                             const std::string& plain_name) {
  if (channels_last.is_null() || plain.is_null()) return nullptr;
  out["torch_channels_last_samples_per_second"] = channels_last["samples_per_second"];
  out["torch_" + plain_name + "_samples_per_second"] = plain["samples_per_second"];
  return channels_last["samples_per_second"].get<double>() >= plain["samples_per_second"].get<double>() ? channels_last
                                                                                                        : plain;
}

int train(int argc, char** argv) {
  ModelConfig mc;
  mc.name = "cosmoflow";
  mc.input_size = 64;
  mc.vocab_size = 256;
  mc.width = 512;
  mc.depth = 8;
  mc.heads = 8;
  int batch = 4, threads = 2, iters = 5;
  bool json = false, layers = false;
  std::string precision = "fp32";
  Flags flags(
      "tessera-bench train",
      "usage: tessera-bench train --model cosmoflow|unet3d|cnn2d --size W [--batch B --threads T --iters I] [--json]\n"
      "       [--precision fp32|bf16]: bf16 as spec.training.precision, the peer under torch.autocast(bfloat16)\n"
      "       [--layers]: where the step goes, by kind of layer (forward and backward ms a step)\n"
      "       tessera-bench train --model resnet50 --size 224 ...   (PyTorch in both of its layouts)\n"
      "       tessera-bench train --model transformer [--context 256 --width 512 --depth 8 --heads 8 --vocab 256] "
      "...\n");
  flags.text("--model", &mc.name)
      .integer("--size", &mc.input_size, 4, 4096)
      .integer("--context", &mc.context, 1, 1 << 16)
      .integer("--width", &mc.width, 1, 1 << 16)
      .integer("--depth", &mc.depth, 1, 1024)
      .integer("--heads", &mc.heads, 1, 1024)
      .integer("--vocab", &mc.vocab_size, 1, 1 << 24)
      .integer("--batch", &batch, 1, 1 << 20)
      .integer("--threads", &threads, 1, 1024)
      .integer("--iters", &iters, 1, 100000)
      .toggle("--json", &json)
      .toggle("--layers", &layers)
      .text("--precision", &precision);
  if (!flags.parse(argc, argv, 2)) return 0;
  mc.precision = parse_precision(precision, "--precision");
  omp_set_num_threads(threads);
  const bool language = mc.name == "transformer", resnet = mc.name == "resnet50";
  if (resnet) mc.label_smoothing = 0.1;  // as its peer
  auto model = make_model(mc);
  Shape in = {batch};
  for (int64_t d : model->sample_shape()) in.push_back(d);
  Shape tgt = {batch};
  for (int64_t d : model->target_shape()) tgt.push_back(d);
  Tensor x = random_tensor(in, 1), y = random_tensor(tgt, 2);
  const int classes = language ? mc.vocab_size : resnet ? 1000 : 3;
  if (language)
    for (auto& v : x.span()) v = static_cast<float>(static_cast<int>(std::fabs(v) * 1e4) % classes);
  if (model->task() != Task::kRegression)
    for (auto& v : y.span()) v = static_cast<float>(static_cast<int>(std::fabs(v) * 1e4) % classes);
  OptimizerConfig oc;
  if (language) {  // as its peer: AdamW
    oc.name = "adamw";
    oc.weight_decay = 0.1;
  }
  if (resnet) oc.weight_decay = 5e-5;  // as its peer: SGD with momentum and weight decay
  auto opt = make_optimizer(oc);
  auto params = model->params();
  double fwd_s = 0, bwd_s = 0, upd_s = 0;  // the step's parts, summed over the timed steps
  long faults = 0;                         // minor page faults of the timed steps (fresh pages zeroed)
  auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  };
  int timed = -1;  // the warm-up step is not counted
  // --layers: seconds by kind of layer (those without inner layers; a residual block's sum and its
  // layout conversions are what is left of the step), over the timed steps.
  std::map<std::string, std::array<double, 2>> by_kind;
  if (layers)
    set_layer_timer([&](const Layer& l, bool backward, double s) {
      if (timed >= 0 && const_cast<Layer&>(l).sublayers().empty()) by_kind[l.kind()][backward] += s;
    });
  const double step_s = time_it(
      [&] {
        const long f0 = minor_faults();
        auto t0 = Clock::now();
        for (Param* p : params) p->grad.zero();
        Tensor out = model->forward(x, true);
        auto t1 = Clock::now();
        model->backward(model->loss(out, y).grad);
        auto t2 = Clock::now();
        opt->step(params, 1e-4);
        auto t3 = Clock::now();
        if (++timed > 0) {
          fwd_s += std::chrono::duration<double>(t1 - t0).count();
          bwd_s += std::chrono::duration<double>(t2 - t1).count();
          upd_s += std::chrono::duration<double>(t3 - t2).count();
          faults += minor_faults() - f0;
        }
      },
      iters);
  set_layer_timer(nullptr);
  fwd_s /= iters, bwd_s /= iters, upd_s /= iters;
  const double sps = batch / step_s;

  // The 3D models' conv layer shapes, each timed alone (their layers run one after another).
  nlohmann::json convs = nlohmann::json::array();
  Shape shape = in;
  for (Layer* l : in.size() == 5 ? model->layers() : std::vector<Layer*>{}) {
    if (auto* c = dynamic_cast<Conv*>(l); c && c->options().spatial_dims == 3) {
      Conv conv("bench", c->options());
      conv.set_precision(mc.precision);
      // In the layout the model's convolutions see (channels-last), so no reorder is timed.
      Tensor xi = dnnl_util::to_layout(random_tensor(shape, 3), Layout::kChannelsLast);
      const double flops = conv.forward_flops(shape);
      const double fwd = time_it([&] { conv.forward(xi, true); }, iters);
      Tensor g = dnnl_util::to_layout(random_tensor(conv.output_shape(shape), 4), Layout::kChannelsLast);
      conv.forward(xi, true);
      const double bwd = time_it([&] { conv.backward(g); }, iters);
      convs.push_back({{"in", c->options().in_channels},
                       {"out", c->options().out_channels},
                       {"size", shape[2]},
                       {"fwd_gflops", flops / fwd / 1e9},
                       {"bwd_gflops", 2 * flops / bwd / 1e9}});
    }
    shape = l->output_shape(shape);
  }

  nlohmann::json out = {{"bench", "train"},
                        {"model", mc.name},
                        {"batch", batch},
                        {"threads", threads},
                        {"precision", precision_name(mc.precision)},
                        {"parameters", model->num_params()},
                        {"samples_per_second", sps},
                        {"step_ms", step_s * 1e3},
                        {"forward_ms", fwd_s * 1e3},
                        {"backward_ms", bwd_s * 1e3},
                        {"update_ms", upd_s * 1e3},
                        {"page_faults_per_step", faults / iters}};
  if (language) {
    out["context"] = mc.context;
    out["tokens_per_second"] = sps * mc.context;
  } else {
    out["size"] = mc.input_size;
  }
  nlohmann::json torch = nullptr;
  if (language) {
    torch = torch_transformer(mc, batch, threads, iters);
  } else if (resnet) {
    torch = faster_layout(out, torch_resnet50(mc.input_size, batch, threads, iters, "nhwc", mc.precision),
                          torch_resnet50(mc.input_size, batch, threads, iters, "nchw", mc.precision), "nchw");
  } else if (mc.name == "cosmoflow") {
    std::string hidden;
    for (int h : hidden_widths(mc)) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
    torch = faster_layout(out, torch_baseline(mc.input_size, batch, threads, iters, hidden, mc.precision, "ndhwc"),
                          torch_baseline(mc.input_size, batch, threads, iters, hidden, mc.precision, "ncdhw"), "ncdhw");
  }
  out["torch_samples_per_second"] = torch.is_null() ? nlohmann::json(nullptr) : torch["samples_per_second"];
  out["ratio_vs_torch"] =
      torch.is_null() ? nlohmann::json(nullptr) : nlohmann::json(sps / torch["samples_per_second"].get<double>());
  for (size_t i = 0; i < convs.size(); ++i) {
    if (!torch.is_null() && i < torch["convs"].size()) {
      convs[i]["torch_fwd_gflops"] = torch["convs"][i]["fwd_gflops"];
      convs[i]["torch_bwd_gflops"] = torch["convs"][i]["bwd_gflops"];
    }
  }
  out["convs"] = convs;
  if (layers) {
    nlohmann::json kinds = nlohmann::json::object();
    double f = 0, b = 0;
    for (const auto& [kind, t] : by_kind) {
      kinds[kind] = {{"forward_ms", t[0] / iters * 1e3}, {"backward_ms", t[1] / iters * 1e3}};
      f += t[0] / iters;
      b += t[1] / iters;
    }
    kinds["(between layers)"] = {{"forward_ms", (fwd_s - f) * 1e3}, {"backward_ms", (bwd_s - b) * 1e3}};
    out["layers"] = kinds;
  }
  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  if (language)
    std::printf(
        "transformer of %.1fM parameters at context %d, batch %d, %d threads: %.2f samples/s (%.1f ms per step)",
        model->num_params() / 1e6, mc.context, batch, threads, sps, step_s * 1e3);
  else
    std::printf("%s at %d^%d, batch %d, %d threads: %.2f samples/s (%.1f ms per step)", mc.name.c_str(), mc.input_size,
                static_cast<int>(model->sample_shape().size()) - 1, batch, threads, sps, step_s * 1e3);
  if (!torch.is_null())
    std::printf("; PyTorch %s: %.2f samples/s; ratio %.2fx", torch["version"].get<std::string>().c_str(),
                torch["samples_per_second"].get<double>(), out["ratio_vs_torch"].get<double>());
  else std::printf("; PyTorch baseline not available (install python3-torch)");
  if (out.contains("torch_nchw_samples_per_second"))
    std::printf("\n  PyTorch channels_last %.2f, NCHW %.2f samples/s",
                out["torch_channels_last_samples_per_second"].get<double>(),
                out["torch_nchw_samples_per_second"].get<double>());
  std::printf("\n  step: forward %.1f ms, backward %.1f ms, update %.1f ms; %ld page faults\n", fwd_s * 1e3,
              bwd_s * 1e3, upd_s * 1e3, faults / iters);
  if (layers)
    for (const auto& [kind, t] : out["layers"].items())
      std::printf("  %-18s forward %7.1f ms, backward %7.1f ms\n", kind.c_str(), t["forward_ms"].get<double>(),
                  t["backward_ms"].get<double>());
  for (const auto& c : convs) {
    std::printf("  conv3d %3d -> %3d at %3d^3: forward %6.1f GFLOP/s, backward %6.1f GFLOP/s", c["in"].get<int>(),
                c["out"].get<int>(), c["size"].get<int>(), c["fwd_gflops"].get<double>(),
                c["bwd_gflops"].get<double>());
    if (c.contains("torch_fwd_gflops")) {
      const nlohmann::json& tb = c["torch_bwd_gflops"];  // null: its backward was within the timing noise
      std::printf("   (PyTorch %6.1f / %s)", c["torch_fwd_gflops"].get<double>(),
                  tb.is_number() ? detail::concat(std::round(tb.get<double>() * 10) / 10).c_str() : "n/a");
    }
    std::printf("\n");
  }
  return 0;
}

// ---- spatial ----

}  // namespace tessera::bench
