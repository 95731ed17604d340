#!/usr/bin/env python3
"""Model quality against PyTorch: the same CosmoFlow recipe, data and seeds in both.

Trains PyTorch (the peer) and Tessera (`tessera run`: 1 worker, 2 data-parallel workers, and the
4-worker spatial 2 x data 2 job of examples/cosmoflow-local.yaml, hybrid hitopk -> torus) on one
dataset with each model seed, and prints one JSON line per run with its validation MSE, then one
summary line per Tessera configuration: its mean over the seeds divided by PyTorch's mean.

  bench/parity.py --data data/cosmoflow-32 --tessera build/bin/tessera --seeds 1,2,3

The recipe is examples/cosmoflow-local.yaml's: conv k3 + LeakyReLU 0.3 + max-pool blocks, FC 128,
64, 4; Adam 0.001 with per-step cosine decay to 0.0002; 6 epochs of batch 4; counts through
log1p, targets as stored; a new shuffle each epoch.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch"))  # the PyTorch peers
from torch_cosmoflow import cosmoflow  # noqa: E402  # the same layers as the speed benchmark's peer

RECIPE = {"epochs": 6, "batch": 4, "lr": 0.001, "min_lr": 0.0002, "hidden": [128, 64], "slope": 0.3}

# Tessera configurations: name -> (replicas, ranks per replica, spatial d parts, communication,
# initialisation). spatial4 is examples/cosmoflow-local.yaml's job: hitopk at density 0.01 for 4
# epochs, then torus, from He-normal weights.
HYBRID = "{strategy: hybrid, sparse: hitopk, dense: torus, density: 0.01, switchAtEpoch: 4}"
HE = ", weightInit: heNormal, biasInit: zero"
CONFIGS = {
    "1": (1, 1, 1, "{strategy: dense}", ""),
    "dp2": (2, 1, 1, "{strategy: dense}", ""),
    "spatial4": (2, 2, 2, HYBRID, HE),
    "spatial4-dense": (2, 2, 2, "{strategy: dense}", ""),
}


def load(directory):
    files = sorted(glob.glob(os.path.join(directory, "*.h5")))
    if not files:
        sys.exit(f"parity: no .h5 files in {directory}")
    xs, ys = [], []
    for f in files:
        with h5py.File(f, "r") as h:
            xs.append(np.log1p(h["full"][...].astype(np.float32)))
            ys.append(h["unitPar"][...].astype(np.float32))
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))


def he_init(net, output_gain):
    """He normal weights (gain sqrt 2; `output_gain` on the output layer) and zero biases."""
    layers = [m for m in net if isinstance(m, (nn.Conv3d, nn.Linear))]
    for i, m in enumerate(layers):
        fan_in = m.weight[0].numel()
        gain = output_gain if i == len(layers) - 1 else math.sqrt(2.0)
        nn.init.normal_(m.weight, 0.0, gain / math.sqrt(fan_in))
        nn.init.zeros_(m.bias)


def train_torch(train, val, seed, threads, init):
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    x, y = train
    net, _ = cosmoflow(x.shape[-1], 16, 256, RECIPE["hidden"], RECIPE["slope"])
    if init == "he":
        he_init(net, 0.5)
    elif init == "he-zero-output":
        he_init(net, 0.0)
    opt = torch.optim.Adam(net.parameters(), lr=RECIPE["lr"])
    steps_per_epoch = len(x) // RECIPE["batch"]
    total = steps_per_epoch * RECIPE["epochs"]
    step, t0 = 0, time.time()
    curve = []  # (mean training loss, validation MSE) of each epoch
    for epoch in range(RECIPE["epochs"]):
        train_loss = 0.0
        order = torch.randperm(len(x))
        for i in range(steps_per_epoch):
            lr = RECIPE["min_lr"] + (RECIPE["lr"] - RECIPE["min_lr"]) * 0.5 * (1 + math.cos(math.pi * step / total))
            for g in opt.param_groups:
                g["lr"] = lr
            idx = order[i * RECIPE["batch"]:(i + 1) * RECIPE["batch"]]
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            train_loss += float(loss) / steps_per_epoch
            step += 1
        curve.append((train_loss, validate(net, val)))
    return curve, time.time() - t0


def validate(net, val):
    vx, vy = val
    with torch.no_grad():
        return float(sum(((net(vx[i:i + 16]) - vy[i:i + 16]) ** 2).sum() for i in range(0, len(vx), 16)) / vy.numel())


def manifest(name, data, seed, config, init):
    replicas, ranks, d, communication, default_init = CONFIGS[config]
    init = init or default_init
    spatial = f"\n  parallelism: {{spatial: {{d: {d}}}}}" if d > 1 else ""
    return f"""apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  replicas: {replicas}
  ranksPerReplica: {ranks}
  model: {{name: cosmoflow, inputSize: 32, hidden: [128, 64], seed: {seed}{init}}}
  dataset: {{format: hdf5, path: {data}/train, validationPath: {data}/val}}
  training:
    epochs: {RECIPE["epochs"]}
    batchSize: {RECIPE["batch"]}
    seed: {seed}
    optimizer: {{name: adam, learningRate: {RECIPE["lr"]}}}
    schedule: {{decay: cosine, minLearningRate: {RECIPE["min_lr"]}}}{spatial}
  communication: {communication}
  local: {{nodes: {replicas}, gpusPerNode: {ranks}}}
"""


def parity_args(doc, data, data_help):
    """The flags of the comparisons with PyTorch (--data, --tessera, --seeds, --threads): the parsed
    arguments and the seeds as integers."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--data", default=data, help=data_help)
    p.add_argument("--tessera", default="build/bin/tessera")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    a = p.parse_args()
    return a, [int(s) for s in a.seeds.split(",")]


def run_tessera(tessera, work, name, text, full=False):
    """Runs the manifest `text` with `tessera run` in work/name; returns its validation loss (with
    full, its whole final status) and seconds."""
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    wd = os.path.join(work, name)
    t0 = time.time()
    run = subprocess.run([tessera, "run", path, "--fresh", "--work-dir", wd, "--progress", "60"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"parity: {name} failed ({run.returncode}):\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    with open(os.path.join(wd, "status.json")) as f:
        status = json.load(f)
    return status["status"] if full else status["status"]["validation"]["loss"], time.time() - t0


def train_tessera(tessera, data, seed, config, work, init):
    name = f"parity-{config}-{seed}"
    return run_tessera(tessera, work, name, manifest(name, os.path.abspath(data), seed, config, init))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/cosmoflow-32", help="a directory with train/ and val/")
    p.add_argument("--tessera", default="build/bin/tessera")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--configs", default="1,dp2,spatial4", help="Tessera configurations: " + ", ".join(CONFIGS))
    p.add_argument("--threads", type=int, default=1, help="PyTorch's threads")
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--weight-init", help="Tessera's model.weightInit (default: the configuration's)")
    p.add_argument("--bias-init", help="Tessera's model.biasInit (default: the configuration's)")
    p.add_argument("--torch-init", choices=["default", "he", "he-zero-output"], default="default",
                   help="PyTorch's own initialisation, or He normal with zero biases")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    configs = [c for c in a.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"parity: --configs: unknown '{c}' (expected {', '.join(CONFIGS)})")
    results = {}
    if not a.skip_torch:
        train, val = load(os.path.join(a.data, "train")), load(os.path.join(a.data, "val"))
        for s in seeds:
            curve, secs = train_torch(train, val, s, a.threads, a.torch_init)
            results.setdefault("pytorch", []).append(curve[-1][1])
            print(json.dumps({"framework": "pytorch", "version": torch.__version__, "init": a.torch_init, "seed": s,
                              "val_mse": curve[-1][1], "seconds": round(secs, 1),
                              "epochs": [{"train_loss": round(t, 4), "val_mse": round(v, 4)} for t, v in curve]}),
                  flush=True)
    init = "".join(f", {k}: {v}" for k, v in (("weightInit", a.weight_init), ("biasInit", a.bias_init)) if v)
    with tempfile.TemporaryDirectory(prefix="tessera-parity-") as work:
        for c in configs:
            for s in seeds:
                mse, secs = train_tessera(a.tessera, a.data, s, c, work, init)
                results.setdefault(c, []).append(mse)
                print(json.dumps({"framework": "tessera", "config": c, "init": (init or CONFIGS[c][4]).lstrip(", "), "seed": s, "val_mse": mse,
                                  "seconds": round(secs, 1)}), flush=True)
    torch_mean = np.mean(results["pytorch"]) if "pytorch" in results else None
    for c in configs:
        mean = float(np.mean(results[c]))
        line = {"config": c, "seeds": seeds, "tessera_mean": mean}
        if torch_mean is not None:
            line.update({"pytorch_mean": float(torch_mean), "ratio": mean / torch_mean})
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
