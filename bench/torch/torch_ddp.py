#!/usr/bin/env python3
"""The PyTorch DDP peer of `tessera-bench cluster-train`: one rank of DistributedDataParallel (Gloo
backend, default 25 MB buckets, its overlap of all-reduce with backward) training the same model on
the same samples, written by the benchmark as raw float32 files.

Prints one JSON line: the median step time after two warm-up steps, the same step's compute alone
(the model without DDP, timed after the run) and the parameter count.
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from torch_cosmoflow import cosmoflow
from torch_resnet50 import ResNet50
from torch_transformer import Transformer, loss_of


def cnn25m():
    """tessera's cnn2d at 64^2 with baseChannels 32 and hidden [1536]: 25.2M parameters."""
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64 * 16 * 16, 1536), nn.ReLU(), nn.Linear(1536, 10))


def labels(y):
    return y.long().view(-1)


MODELS = {
    # model, input shape, target floats per sample, (inputs, targets) as the model takes them, loss, optimiser
    "cosmoflow": (lambda: cosmoflow(32, 16, 256, [2048, 256], 0.3)[0], (4, 32, 32, 32), 4, lambda x, y: (x, y),
                  nn.functional.mse_loss, lambda p: torch.optim.Adam(p, lr=2e-4)),
    "cnn25m": (cnn25m, (1, 64, 64), 1, lambda x, y: (x, labels(y)), nn.functional.cross_entropy,
               lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
    # channels-last, as a user tunes ResNet-50 on CPUs (the faster of PyTorch's layouts more often)
    "resnet50": (lambda: ResNet50(1000).to(memory_format=torch.channels_last), (3, 64, 64), 1,
                 lambda x, y: (x.contiguous(memory_format=torch.channels_last), labels(y)),
                 lambda out, y: nn.functional.cross_entropy(out, y, label_smoothing=0.1),
                 lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=5e-5)),
    "transformer": (lambda: Transformer(256, 256, 512, 8, 8), (256,), 256, lambda x, y: (x.long(), y.long()), loss_of,
                    lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.1)),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), default="cosmoflow")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="HOST:PORT of rank 0")
    p.add_argument("--data", required=True, help="directory with inputs.f32 and targets.f32")
    p.add_argument("--batch", type=int, required=True, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    build, shape, targets, convert, loss_fn, optimiser = MODELS[a.model]
    host, port = a.master.rsplit(":", 1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, port
    dist.init_process_group("gloo", rank=a.rank, world_size=a.world)

    per = math.prod(shape)
    x_all = torch.from_file(os.path.join(a.data, "inputs.f32"), size=os.path.getsize(os.path.join(a.data, "inputs.f32")) // 4)
    y_all = torch.from_file(os.path.join(a.data, "targets.f32"), size=os.path.getsize(os.path.join(a.data, "targets.f32")) // 4)
    n = x_all.numel() // per
    x_all, y_all = x_all.view(n, *shape), y_all.view(n, targets)
    net = build()
    model = DistributedDataParallel(net)
    opt = optimiser(model.parameters())

    def batch(step):
        first = (step * a.world + a.rank) * a.batch % n
        idx = [(first + i) % n for i in range(a.batch)]
        return convert(x_all[idx], y_all[idx])

    def train_step(m, o, step):
        x, y = batch(step)
        o.zero_grad()
        loss_fn(m(x), y).backward()
        o.step()

    times, last = [], time.perf_counter()
    for step in range(a.steps):
        train_step(model, opt, step)
        now = time.perf_counter()
        if step >= 2:
            times.append((now - last) * 1e3)
        last = now
    dist.barrier()
    # The compute of the same step without DDP's communication, on this rank alone.
    local = build()
    local_opt = optimiser(local.parameters())
    compute = []
    for step in range(4):
        t0 = time.perf_counter()
        train_step(local, local_opt, step)
        if step >= 1:
            compute.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"peer": "ddp", "version": torch.__version__, "step_ms": statistics.median(times),
                      "compute_ms": statistics.median(compute), "params": sum(q.numel() for q in net.parameters())}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
