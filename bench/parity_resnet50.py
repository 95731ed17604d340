#!/usr/bin/env python3
"""Model quality against PyTorch: ResNet-50 on the same ImageFolder of JPEGs and the same recipe.

Trains PyTorch (bench/torch/torch_resnet50.py's model, torchvision's initialisation) and Tessera
(`tessera run`, 1 worker) on an ImageFolder indexed by `tessera data index` (by default the one of
`tessera data generate --kind images --samples 1536 --size 80 --out data/shapes`) with each seed, and
prints one JSON line per run with its validation top-1 accuracy, then one summary line: Tessera's
mean over the seeds minus PyTorch's, in points.

  bench/parity_resnet50.py --data data/shapes --tessera build/bin/tessera --seeds 1,2,3

Both read the images the manifest lists, with torchvision's ImageNet augmentation written here with
Pillow (Debian has no torchvision): RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) to 64 x 64 and
a horizontal flip for training, Resize(int(64 / 0.875)) and CenterCrop(64) for validation, Pillow's
bilinear filter, ImageNet's mean and standard deviation. Each framework draws its own crops and its
own order. The recipe (examples/resnet50-local.yaml's on one worker): batch 16, 3 epochs, AdamW
0.001 with weight decay 0.05 on weights (not BatchNorm or biases), warm-up over half an epoch then
cosine decay to 1e-5 per step, label smoothing 0.1.
"""
import json
import math
import os
import random
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from parity import parity_args, run_tessera  # the flags and the `tessera run` of the CosmoFlow comparison
from torch_resnet50 import ResNet50

RECIPE = {"size": 64, "batch": 16, "epochs": 3, "lr": 0.001, "min_lr": 1e-5, "weight_decay": 0.05, "warmup_epochs": 0.5,
          "smoothing": 0.1}
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def read_index(data):
    """The classes and the (file, label) lists of train/ and val/ from the manifest."""
    with open(os.path.join(data, "manifest.tsv")) as f:
        lines = f.read().splitlines()
    if lines[0] != "# tessera-imagefolder v1":
        raise SystemExit("%s is not an ImageFolder indexed by `tessera data index`" % data)
    classes = int(lines[1].split("=")[1])
    entries = [(l.split("\t")[0], int(l.split("\t")[1])) for l in lines[4 + classes:]]
    return classes, [e for e in entries if e[0].startswith("train/")], [e for e in entries if e[0].startswith("val/")]


def random_resized_crop(w, h, rng):
    """torchvision's RandomResizedCrop.get_params."""
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return rng.randint(0, w - cw), rng.randint(0, h - ch), cw, ch
    ratio = w / h
    cw, ch = (w, int(round(w / (3 / 4)))) if ratio < 3 / 4 else (int(round(h * 4 / 3)), h) if ratio > 4 / 3 else (w, h)
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def to_tensor(img):
    return (np.asarray(img, dtype=np.float32) / 255.0 - MEAN) / STD


def train_image(path, size, rng):
    img = Image.open(path).convert("RGB")
    x, y, w, h = random_resized_crop(img.width, img.height, rng)
    img = img.resize((size, size), Image.BILINEAR, box=(x, y, x + w, y + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return to_tensor(img)


def val_image(path, size):
    img = Image.open(path).convert("RGB")
    short = int(size / 0.875)
    w, h = img.size
    ow, oh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = img.resize((ow, oh), Image.BILINEAR)
    top, left = int(round((oh - size) / 2.0)), int(round((ow - size) / 2.0))
    return to_tensor(img.crop((left, top, left + size, top + size)))


def learning_rate(step, warmup, total):
    """ScheduleConfig's warm-up then cosine decay (worker/nn/optim.cc)."""
    r = RECIPE
    if step < warmup:
        return r["lr"] * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return r["min_lr"] + (r["lr"] - r["min_lr"]) * 0.5 * (1 + math.cos(math.pi * t))


def batch(images):
    return torch.from_numpy(np.stack(images).transpose(0, 3, 1, 2).copy())


def accuracy(model, data, val):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(val), 64):
            part = val[i:i + 64]
            x = batch([val_image(os.path.join(data, f), RECIPE["size"]) for f, _ in part])
            correct += int((model(x).argmax(1) == torch.tensor([l for _, l in part])).sum())
    model.train()
    return correct / len(val)


def train_torch(data, classes, train, val, seed, threads):
    r = RECIPE
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    model = ResNet50(classes=classes).to(memory_format=torch.channels_last)
    bn = {id(p) for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d) for p in m.parameters()}
    decay = [p for n, p in model.named_parameters() if id(p) not in bn and not n.endswith("bias")]
    other = [p for n, p in model.named_parameters() if id(p) in bn or n.endswith("bias")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]}, {"params": other, "weight_decay": 0.0}], lr=r["lr"])
    steps_per_epoch = len(train) // r["batch"]
    total, warmup = steps_per_epoch * r["epochs"], round(r["warmup_epochs"] * steps_per_epoch)
    step, t0, curve = 0, time.time(), []
    for _ in range(r["epochs"]):
        order = list(range(len(train)))
        rng.shuffle(order)
        for i in range(steps_per_epoch):
            for g in opt.param_groups:
                g["lr"] = learning_rate(step, warmup, total)
            part = [train[j] for j in order[i * r["batch"]:(i + 1) * r["batch"]]]
            x = batch([train_image(os.path.join(data, f), r["size"], rng) for f, _ in part]).to(memory_format=torch.channels_last)
            y = torch.tensor([l for _, l in part])
            opt.zero_grad()
            F.cross_entropy(model(x), y, label_smoothing=r["smoothing"]).backward()
            opt.step()
            step += 1
        curve.append(accuracy(model, data, val))
    return curve, time.time() - t0


def manifest(name, data, classes, seed):
    r = RECIPE
    return f"""apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  model: {{name: resnet50, inputSize: {r["size"]}, outputs: {classes}, seed: {seed}}}
  dataset: {{format: imagefolder, path: {data}}}
  training:
    epochs: {r["epochs"]}
    batchSize: {r["batch"]}
    seed: {seed}
    labelSmoothing: {r["smoothing"]}
    optimizer: {{name: adamw, learningRate: {r["lr"]}, weightDecay: {r["weight_decay"]}}}
    schedule: {{warmupEpochs: {r["warmup_epochs"]}, decay: cosine, minLearningRate: {r["min_lr"]}}}
  communication: {{strategy: dense}}
"""


def main():
    a, seeds = parity_args(__doc__, "data/shapes", "an ImageFolder indexed by `tessera data index`")
    classes, train, val = read_index(a.data)
    results = {"pytorch": [], "tessera": []}
    for s in seeds:
        curve, secs = train_torch(a.data, classes, train, val, s, a.threads)
        results["pytorch"].append(curve[-1])
        print(json.dumps({"framework": "pytorch", "version": torch.__version__, "seed": s, "val_top1": curve[-1],
                          "seconds": round(secs, 1), "epochs": [round(v, 4) for v in curve]}), flush=True)
    with tempfile.TemporaryDirectory(prefix="tessera-parity-") as work:
        for s in seeds:
            name = f"parity-resnet50-{s}"
            status, secs = run_tessera(a.tessera, work, name, manifest(name, os.path.abspath(a.data), classes, s), full=True)
            results["tessera"].append(status["validation"]["metric"])
            print(json.dumps({"framework": "tessera", "seed": s, "val_top1": status["validation"]["metric"],
                              "val_top5": status["validation"].get("top5"), "seconds": round(secs, 1)}), flush=True)
    t, q = float(np.mean(results["tessera"])), float(np.mean(results["pytorch"]))
    print(json.dumps({"model": "resnet50", "seeds": seeds, "tessera_mean_top1": t, "pytorch_mean_top1": q,
                      "difference_points": round(100 * (t - q), 2), "pytorch_spread": float(np.ptp(results["pytorch"])),
                      "tessera_spread": float(np.ptp(results["tessera"]))}), flush=True)


if __name__ == "__main__":
    main()
