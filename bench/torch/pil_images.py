#!/usr/bin/env python3
"""The peer of `tessera-bench images`: torchvision's ImageNet transforms written with Pillow (as
bench/parity_resnet50.py applies them) over the images of an indexed ImageFolder, one thread; prints
one JSON line with the median images/s over --iters passes.

  bench/torch/pil_images.py --data DIR --size 224 --split train|val [--iters 3]
"""
import argparse
import json
import os
import random
import time

from parity_resnet50 import read_index, train_image, val_image


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--split", choices=["train", "val"], default="train")
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args()
    _, train, val = read_index(a.data)
    files = [os.path.join(a.data, f) for f, _ in (train if a.split == "train" else val)]
    rng = random.Random(1)
    rates = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        for f in files:
            train_image(f, a.size, rng) if a.split == "train" else val_image(f, a.size)
        rates.append(len(files) / (time.perf_counter() - t0))
    rates.sort()
    print(json.dumps({"images_per_s": rates[len(rates) // 2], "images": len(files)}))


if __name__ == "__main__":
    main()
