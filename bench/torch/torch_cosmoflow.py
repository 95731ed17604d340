#!/usr/bin/env python3
"""The PyTorch baseline of `tessera-bench train`: the same CosmoFlow layers, batch and threads.

Prints one JSON line: samples/s of forward + backward + SGD update, and forward / backward GFLOP/s
of each conv3d layer shape. --device cuda runs it on the GPU as a user would tune it there
(channels_last_3d, torch.backends.cudnn.benchmark, TF32 for convolutions as PyTorch's default);
--layout ncdhw keeps PyTorch's default contiguous layout instead (on either device).
--precision bf16 runs the step under torch.autocast(bfloat16).
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def cosmoflow(size, base, max_channels, hidden, slope):
    layers, ch, s, block = [], 4, size, 0
    shapes = []
    while s > 4:
        out = min(base << block, max_channels)
        shapes.append((ch, out, s))
        layers += [nn.Conv3d(ch, out, 3, padding=1), nn.LeakyReLU(slope), nn.MaxPool3d(2)]
        ch, s, block = out, s // 2, block + 1
    layers.append(nn.Flatten())
    features = ch * s ** 3
    for h in hidden:
        layers += [nn.Linear(features, h), nn.LeakyReLU(slope)]
        features = h
    layers.append(nn.Linear(features, 4))
    return nn.Sequential(*layers), shapes


def timed(fn, iters, sync=lambda: None):
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--hidden", type=str, default="2048,256")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: torch.autocast(bfloat16)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--layout", choices=["ndhwc", "ncdhw"], default="ndhwc", help="channels_last_3d or not")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    hidden = [int(h) for h in a.hidden.split(",") if h]
    net, shapes = cosmoflow(a.size, 16, 256, hidden, 0.3)
    sync = lambda: None
    x = torch.randn(a.batch, 4, a.size, a.size, a.size)
    y = torch.randn(a.batch, 4)
    layout = torch.channels_last_3d if a.layout == "ndhwc" else torch.contiguous_format
    if a.device == "cpu":
        net = net.to(memory_format=layout)
        x = x.to(memory_format=layout)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
        net = net.to("cuda", memory_format=layout)
        x = x.to("cuda", memory_format=layout)
        y = y.to("cuda")
        sync = torch.cuda.synchronize
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)

    def step():
        opt.zero_grad()
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = nn.functional.mse_loss(net(x).float(), y)
        loss.backward()
        opt.step()

    step_s = timed(step, a.iters, sync)
    if a.device == "cuda":  # the figure gpu-check compares; the per-layer table is the CPU benchmark's
        print(json.dumps({"figure": "cosmoflow", "framework": "pytorch", "version": torch.__version__, "device": "cuda",
                          "layout": a.layout, "size": a.size, "batch": a.batch, "step_ms": step_s * 1e3,
                          "samples_per_second": a.batch / step_s}))
        return
    convs = []
    for ci, co, s in shapes:
        conv = nn.Conv3d(ci, co, 3, padding=1)
        xi = torch.randn(a.batch, ci, s, s, s, requires_grad=True)
        flops = 2.0 * a.batch * s ** 3 * ci * co * 27
        # The forward that training runs (with autograd on: PyTorch may take another algorithm without),
        # and the backward as what a forward and backward take beyond it.
        fwd = timed(lambda: conv(xi), a.iters)
        out = conv(xi)
        g = torch.randn_like(out)
        bwd = timed(lambda: torch.autograd.grad(conv(xi), [xi, conv.weight], g), a.iters) - fwd
        convs.append({"in": ci, "out": co, "size": s, "fwd_gflops": flops / fwd / 1e9,
                      "bwd_gflops": 2 * flops / bwd / 1e9 if bwd > 0 else None})  # None: within the noise
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "precision": a.precision, "layout": a.layout,
                      "samples_per_second": a.batch / step_s, "step_ms": step_s * 1e3, "convs": convs}))


if __name__ == "__main__":
    main()
