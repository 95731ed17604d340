// tessera-bench: benchmarks that report ratios against a baseline measured in the same run.
//
//   tessera-bench topk     --size D --density R [--repeat N] [--json]
//       one streaming pass (memory-bandwidth floor), exact nth_element top-k, MSTopK, and the
//       scatter-add of 4 ranks' selections into a bucket (random read-modify-writes); single thread.
//   tessera-bench exchange --strategy S --nodes M --local N --size D --density R [--iters I] [--json]
//       M x N worker processes over loopback TCP; per-rank time and bytes per link kind per exchange.
//   tessera-bench train    --model cosmoflow|unet3d|cnn2d|resnet50|transformer --size W [--batch B] [--threads T]
//   [--iters I] [--json]
//       samples/s of forward + backward + update in one process, and conv3d GFLOP/s per layer shape,
//       against PyTorch (bench/torch/torch_cosmoflow.py, same layers, batch and threads) when it is installed.
//   tessera-bench spatial  --model cosmoflow --size W --splits 1,2,4 [--batch B] [--iters I] [--json]
//       one process per spatial rank, one thread each: per-rank peak activation memory, time per
//       sample and halo bytes for each split of D, against the unsplit model in the same run.
//   tessera-bench cache    --remote-mbps R [--size W --samples N --epochs E --batch B --threads T] [--json]
//       trains CosmoFlow from generated HDF5 files with the remote tier throttled to R MB/s, then
//       restarts the worker for one more epoch: per-epoch data-wait fraction, read throughput and
//       hit ratio per cache tier.
//   tessera-bench images   [--size S --images N --width W --iters I] [--json]
//       images/s of one thread turning generated JPEGs into the model's input (the training and the
//       validation transform) against the same transforms in Pillow (bench/torch/pil_images.py).
//   tessera-bench placement --workers W --nodes N [--gpus-per-node G] [--json]
//       gang placement and ring plan of W one-GPU workers on N nodes in 4 zones x 4 racks.
//   tessera-bench controller --nodes N --jobs J [--pods P] [--gpus-per-node G] [--timeout S] [--json]
//       the operator against the test cluster (scripts/test-cluster.sh) with N simulated nodes: J
//       gangs of P pods created at once; time until all are Running, reconcile latency p50/p99, API
//       requests per job, peak RSS (this process: the operator runs in it).
//   tessera-bench cluster --strategy S --nodes M --local N --rate 1gbit [--delay D] --size D --density R [--json]
//       the exchange on an emulated cloud cluster (tessera-netns: a network namespace per
//       node, links rate-limited with tc), brought up and torn down around the measurement.
//   tessera-bench cluster-train --model cosmoflow|cnn25m|resnet50|transformer --strategy S|hybrid [--overlap on|off]
//   [--peer ddp]
//                [--optimizer sgd|adam|lars] [--lr X] ...
//       training on the emulated cluster: step time, samples/s, exposed and total communication; the
//       PyTorch DDP peer on the same model and samples; --epochs E: validation loss over time, of the
//       weights and data order of --seed S.
//   tessera-bench metrics [--size W] [--epochs E] [--block K] [--scrape-ms M] [--json]
//       the cost of the worker's Prometheus metrics: step time with the exporter (and a scraper)
//       against without, alternating every K steps of one training run.
//   tessera-bench cost-layers --model cosmoflow|cnn25m|resnet50|transformer [--size W]
//       the benchmark models' layers as the cost model sees them (bench/cluster/cost_model.py reads them).
//   tessera-bench demo
//       every strategy on 2 nodes x 2 processes, side by side (what `make run` shows).
#include <cstdio>
#include <map>
#include <string>

#include "bench/bench.h"
#include "worker/comm/exchange.h"
#include "worker/core/tensor.h"

namespace tessera::bench {
namespace {

int usage(int code) {
  std::fprintf(
      code ? stderr : stdout,
      "usage: tessera-bench <command> [flags]\n"
      "  topk     --size D --density R [--repeat N] [--json]\n"
      "  exchange --strategy %s --nodes M --local N --size D --density R [--iters I] [--json]\n"
      "  train    --model cosmoflow|unet3d|cnn2d|resnet50|transformer --size W [--batch B --threads T --iters I] "
      "[--json]\n"
      "  spatial  --model cosmoflow --size W --splits 1,2,4 [--batch B --iters I] [--json]\n"
      "  cache    --remote-mbps R [--size W --samples N --epochs E --batch B --threads T] [--json]\n"
      "  images   [--size S --images N --width W --iters I] [--json]\n"
      "  placement --workers W --nodes N [--gpus-per-node G --repeat R] [--json]\n"
      "  controller --nodes N --jobs J [--pods P --gpus-per-node G --timeout S] [--json]\n"
      "  cluster  --strategy S --nodes M --local N --rate R [--delay D] --size D --density R [--iters I] [--json]\n"
      "  cluster-train --model cosmoflow|cnn25m|resnet50|transformer --strategy S|hybrid [--peer ddp] [--overlap "
      "on|off] --nodes M --local N\n"
      "                (cnn25m: the benchmark's cnn2d of 25M parameters, not a spec.model.name)\n"
      "           --rate R [--batch B --steps K --threads T --density R --epochs E --seed S]\n"
      "           [--optimizer sgd|adam|lars --lr X] [--json]\n"
      "  metrics  [--size W --samples N --epochs E --block K --batch B --threads T --scrape-ms M] [--json]\n"
      "  cost-layers --model cosmoflow|cnn25m|resnet50|transformer [--size W]\n"
      "  demo     [--nodes M --local N --size D --density R --iters I]\n",
      tessera::exchange_strategy_names());
  return code;
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera::bench;
  if (argc < 2) return usage(2);
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return usage(0);
  static const std::map<std::string, int (*)(int, char**)> kCommands = {{"topk", topk},
                                                                        {"exchange", exchange},
                                                                        {"demo", demo},
                                                                        {"train", train},
                                                                        {"spatial", spatial},
                                                                        {"cache", cache},
                                                                        {"placement", placement},
                                                                        {"controller", controller},
                                                                        {"metrics", metrics},
                                                                        {"cluster", cluster},
                                                                        {"cluster-train", cluster_train},
                                                                        {"images", images},
                                                                        {"cost-layers", cost_layers}};
  const auto it = kCommands.find(cmd);
  if (it == kCommands.end()) {
    std::fprintf(stderr, "tessera-bench: unknown command '%s'\n", cmd.c_str());
    return usage(2);
  }
  tessera::keep_freed_tensor_memory();  // as the worker does
  return tessera::run_command("tessera-bench", [&] { return it->second(argc, argv); });
}
