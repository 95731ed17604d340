#!/usr/bin/env python3
"""Model quality against PyTorch: the Transformer language model on the same recipe and windows.

Trains PyTorch (bench/torch/torch_transformer.py's model) and Tessera (`tessera run`, 1 worker) on the
token files of `tessera data generate --kind text` with each seed, and prints one JSON line per run
with its validation loss (mean cross-entropy per token, nats), then one summary line: Tessera's mean
over the seeds divided by PyTorch's.

  bench/parity_transformer.py --data data/fortunes --tessera build/bin/tessera --seeds 1,2,3

Both read the same windows: sample i of an epoch is the window at offset
mix64(mix64(seed) ^ i) mod (tokens - context), as worker/data/tokens.cc draws it (validation with
seed + 1000003). Each framework visits them in its own shuffled order every epoch. The recipe:
context 64, width 128, 4 blocks of 4 heads; AdamW 0.003 (betas 0.9, 0.95, weight decay 0.1 on
weights, not on biases and LayerNorm), warm-up over a tenth of an epoch, then cosine decay to
0.0003 per step; gradients clipped to norm 1; batch 16; 3 epochs of 2048 windows; 512 validation
windows.
"""
import json
import math
import os
import tempfile
import time

import numpy as np
import torch

from parity import parity_args, run_tessera  # the flags and the `tessera run` of the CosmoFlow comparison
from torch_transformer import Transformer, loss_of

RECIPE = {"context": 64, "width": 128, "depth": 4, "heads": 4, "lr": 0.003, "min_lr": 0.0003, "weight_decay": 0.1,
          "beta2": 0.95, "warmup_epochs": 0.1, "clip": 1.0, "batch": 16, "epochs": 3, "windows": 2048,
          "val_windows": 512}
MASK = (1 << 64) - 1


def mix64(z):
    """kernels::mix64, splitmix64's finaliser, in 64-bit arithmetic."""
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def windows(tokens, count, seed, context):
    """The inputs and targets of TokenDataset's windows 0 .. count - 1."""
    starts = len(tokens) - context
    base = mix64(seed)
    offsets = np.array([mix64(base ^ i) % starts for i in range(count)], dtype=np.int64)
    idx = offsets[:, None] + np.arange(context)[None, :]
    return torch.from_numpy(tokens[idx]), torch.from_numpy(tokens[idx + 1])


def learning_rate(step, warmup, total):
    """ScheduleConfig's warm-up then cosine decay (worker/nn/optim.cc)."""
    if step < warmup:
        return RECIPE["lr"] * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return RECIPE["min_lr"] + (RECIPE["lr"] - RECIPE["min_lr"]) * 0.5 * (1 + math.cos(math.pi * t))


def evaluate(model, vx, vy):
    with torch.no_grad():
        total = sum(float(loss_of(model(vx[i:i + 64]), vy[i:i + 64])) * len(vx[i:i + 64]) for i in range(0, len(vx), 64))
    return total / len(vx)


def train_torch(train, val, seed, threads):
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    r = RECIPE
    model = Transformer(256, r["context"], r["width"], r["depth"], r["heads"])
    decay = [p for n, p in model.named_parameters() if not n.endswith("bias") and "ln" not in n]
    other = [p for n, p in model.named_parameters() if n.endswith("bias") or "ln" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]}, {"params": other, "weight_decay": 0.0}],
                            lr=r["lr"], betas=(0.9, r["beta2"]))
    x, y = windows(train, r["windows"], seed, r["context"])
    vx, vy = windows(val, r["val_windows"], seed + 1000003, r["context"])
    steps_per_epoch = r["windows"] // r["batch"]
    total, warmup = steps_per_epoch * r["epochs"], round(r["warmup_epochs"] * steps_per_epoch)
    step, t0, curve = 0, time.time(), []
    for _ in range(r["epochs"]):
        order = torch.randperm(len(x))
        for i in range(steps_per_epoch):
            for g in opt.param_groups:
                g["lr"] = learning_rate(step, warmup, total)
            idx = order[i * r["batch"]:(i + 1) * r["batch"]]
            opt.zero_grad()
            loss_of(model(x[idx]), y[idx]).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip"])
            opt.step()
            step += 1
        curve.append(evaluate(model, vx, vy))
    return curve, time.time() - t0


def manifest(name, data, seed):
    r = RECIPE
    return f"""apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{name: transformer, context: {r["context"]}, width: {r["width"]}, depth: {r["depth"]}, heads: {r["heads"]}, seed: {seed}}}
  dataset: {{format: tokens, path: {data}, vocabSize: 256, samples: {r["windows"]}, validationSamples: {r["val_windows"]}, seed: {seed}}}
  training:
    epochs: {r["epochs"]}
    batchSize: {r["batch"]}
    seed: {seed}
    optimizer: {{name: adamw, learningRate: {r["lr"]}, weightDecay: {r["weight_decay"]}, beta2: {r["beta2"]}}}
    schedule: {{warmupEpochs: {r["warmup_epochs"]}, decay: cosine, minLearningRate: {r["min_lr"]}}}
    gradClip: {r["clip"]}
  communication: {{strategy: dense}}
"""


def train_tessera(tessera, data, seed, work):
    name = f"parity-transformer-{seed}"
    return run_tessera(tessera, work, name, manifest(name, os.path.abspath(data), seed))


def main():
    a, seeds = parity_args(__doc__, "data/fortunes", "a directory with train.bin and val.bin (uint16)")
    train = np.fromfile(os.path.join(a.data, "train.bin"), dtype=np.uint16).astype(np.int64)
    val = np.fromfile(os.path.join(a.data, "val.bin"), dtype=np.uint16).astype(np.int64)
    results = {"pytorch": [], "tessera": []}
    for s in seeds:
        curve, secs = train_torch(train, val, s, a.threads)
        results["pytorch"].append(curve[-1])
        print(json.dumps({"framework": "pytorch", "version": torch.__version__, "seed": s, "val_loss": curve[-1],
                          "seconds": round(secs, 1), "epochs": [round(v, 4) for v in curve]}), flush=True)
    with tempfile.TemporaryDirectory(prefix="tessera-parity-") as work:
        for s in seeds:
            loss, secs = train_tessera(a.tessera, a.data, s, work)
            results["tessera"].append(loss)
            print(json.dumps({"framework": "tessera", "seed": s, "val_loss": loss, "seconds": round(secs, 1)}), flush=True)
    t, q = float(np.mean(results["tessera"])), float(np.mean(results["pytorch"]))
    print(json.dumps({"model": "transformer", "seeds": seeds, "tessera_mean": t, "pytorch_mean": q, "ratio": t / q,
                      "pytorch_spread": float(np.ptp(results["pytorch"])), "tessera_spread": float(np.ptp(results["tessera"]))}),
          flush=True)


if __name__ == "__main__":
    main()
