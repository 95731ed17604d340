"""What the PyTorch peers (bench/torch/torch_<model>.py) share: the parity reference they write for
tests/parity and the timing of their training steps."""
import json
import os
import time

import numpy as np
import torch


def write_reference(out, names, inputs, targets, logits, loss, cfg):
    """Writes a model's parameters and their gradients as DIR/param/<name>.npy and DIR/grad/<name>.npy
    (`names`: parameter -> the name Tessera gives it), the batch (input.npy, target.npy), the logits
    (logits.npy, one row per sample or position) and DIR/config.json: `cfg` with the loss, the
    number of parameters and PyTorch's version. Every array is float32."""
    for sub in ("param", "grad"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    for p, name in names.items():
        np.save(os.path.join(out, "param", name + ".npy"), p.detach().numpy().astype(np.float32))
        np.save(os.path.join(out, "grad", name + ".npy"), p.grad.numpy().astype(np.float32))
    np.save(os.path.join(out, "input.npy"), inputs.numpy().astype(np.float32))
    np.save(os.path.join(out, "target.npy"), targets.numpy().astype(np.float32))
    np.save(os.path.join(out, "logits.npy"), logits.detach().reshape(-1, logits.shape[-1]).numpy().astype(np.float32))
    cfg = dict(cfg, loss=loss.item(), parameters=len(names), torch=torch.__version__)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)


def step_seconds(step, iters):
    """Mean seconds of step() over `iters` calls after one warm-up call."""
    step()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters
