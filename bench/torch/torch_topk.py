#!/usr/bin/env python3
"""The PyTorch peer of `tessera-bench topk`: torch.topk of |x| on the same size and density.

Prints one JSON line with the median milliseconds over --repeat calls, one thread (--device cuda:
on the GPU, as scripts/gpu-check.sh compares it with the CUDA MSTopK).
"""
import argparse
import json
import math
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=25600000)
    p.add_argument("--density", type=float, default=0.001)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(42)
    x = torch.randn(a.size, device=a.device)
    k = max(1, min(a.size, math.ceil(a.density * a.size)))
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    torch.topk(x.abs(), k, sorted=False)  # warm-up (the GPU's kernels load on first use)
    sync()
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        torch.topk(x.abs(), k, sorted=False)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "device": a.device, "density": a.density, "k": k,
                      "torch_topk_ms": statistics.median(times)}))


if __name__ == "__main__":
    main()
