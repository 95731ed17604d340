#!/usr/bin/env python3
"""The PyTorch peer of Tessera's ResNet-50 (model.name: resnet50): v1.5 as torchvision builds it, in
plain torch.nn with torchvision's parameter names (conv1, bn1, layer1.0.conv1, ...,
layer2.0.downsample.0, fc), so that no torchvision is needed.

  torch_resnet50.py [--size 224 --batch 8 --threads 2 --iters 3 --layout nhwc|nchw --classes 1000]
      the speed peer of `tessera-bench train --model resnet50`: one JSON line with the samples/s of
      forward + backward + SGD (momentum) update, tuned as a user would tune it on the CPU
      (torch.backends.mkldnn on; --layout nhwc: channels_last, nchw: PyTorch's default layout).
  torch_resnet50.py --dump DIR [--seed 1]
      the reference of tests/parity/torch_parity.sh: a narrow model's weights, a batch, its
      logits, the label-smoothed loss and every parameter's gradient (BatchNorm in training mode, its
      shifts placed so that no ReLU input lies within rounding of zero: clear_gates), as
      float32 .npy files named as Tessera names them (DIR/param/<name>.npy, DIR/grad/<name>.npy)
      with DIR/config.json.
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_reference import step_seconds, write_reference


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (the block's stride, v1.5) -> 1x1 to 4x the width, BatchNorm after each; the
    shortcut a strided 1x1 projection with BatchNorm where the shape changes; ReLU after the sum."""

    def __init__(self, inplanes, width, stride):
        super().__init__()
        out = 4 * width
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
        self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.relu2(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu3(y + (self.downsample(x) if self.downsample is not None else x))

    def gates(self):
        """Each ReLU with the BatchNorm whose shift moves its input."""
        return [(self.relu1, self.bn1), (self.relu2, self.bn2), (self.relu3, self.bn3)]


class ResNet50(nn.Module):
    def __init__(self, classes=1000, base=64, channels=3):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, base, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base)
        self.relu = nn.ReLU()
        inplanes = base
        for stage, blocks in enumerate((3, 4, 6, 3)):
            width = base << stage
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(inplanes, width, 2 if b == 0 and stage > 0 else 1))
                inplanes = 4 * width
            setattr(self, "layer%d" % (stage + 1), nn.Sequential(*layers))
        self.fc = nn.Linear(inplanes, classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.max_pool2d(self.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def tessera_names(self):
        """Parameter -> the name Tessera gives it (worker/models/model.cc): BatchNorm's weight and
        bias are its gamma and beta."""
        bn = {id(m) for m in self.modules() if isinstance(m, nn.BatchNorm2d)}
        owner = {id(p): m for m in self.modules() for p in m.parameters(recurse=False)}
        names = {}
        for name, p in self.named_parameters():
            if id(owner[id(p)]) in bn:
                name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
            names[p] = name
        return names


def gates(model):
    """Every ReLU of the model with the BatchNorm whose shift moves its input."""
    return [(model.relu, model.bn1)] + [g for m in model.modules() if isinstance(m, Bottleneck) for g in m.gates()]


def clear_gates(model, x, window=0.05):
    """Shifts the BatchNorm before each ReLU, channel by channel, by at most `window` of the ReLU input's
    spread, so that zero falls in the widest gap between the channel's entries there; returns the
    smallest distance of any ReLU input from zero, in its channel's spread. A ReLU's gradient jumps
    at zero: an entry within the two frameworks' rounding of zero (their forward passes differ by
    about 1e-5) is gated differently by each, its gradient reaches one side only, and through
    BatchNorm it moved the gradients below it by up to 3%. With the gaps cleared the narrowest is
    about 4.5e-4 of a spread, on the stem's 18k entries a channel."""
    def shift(bn):
        def hook(_, inputs):
            z = inputs[0]
            s = torch.zeros(z.shape[1], dtype=z.dtype)
            for c in range(z.shape[1]):
                v = z[:, c].flatten().double().sort().values
                w = window * v.std().item()
                mid, gap = (v[1:] + v[:-1]) / 2, v[1:] - v[:-1]
                gap[mid.abs() > w] = -1
                if gap.max() > 0:
                    s[c] = -mid[gap.argmax()]
            with torch.no_grad():
                bn.bias.add_(s)
            return (z + s.view(1, -1, 1, 1),)
        return hook

    def margin(_, inputs):
        z = inputs[0].double()
        spread = z.transpose(0, 1).flatten(1).std(dim=1).clamp_min(1e-30)
        closest.append((z.abs().transpose(0, 1).flatten(1).min(dim=1).values / spread).min().item())

    closest, pairs = [], gates(model)
    for hook in ([shift(bn) for _, bn in pairs], [margin] * len(pairs)):
        handles = [relu.register_forward_pre_hook(h) for (relu, _), h in zip(pairs, hook)]
        with torch.no_grad():
            model(x)
        for h in handles:
            h.remove()
    return min(closest)


def dump(out, seed):
    cfg = {"size": 96, "base": 4, "classes": 10, "batch": 8, "label_smoothing": 0.1}
    torch.manual_seed(seed)
    model = ResNet50(cfg["classes"], cfg["base"]).train()
    with torch.no_grad():  # BatchNorm's affine terms away from 1 and 0, so that their gradients matter
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.add_(torch.randn_like(m.weight) * 0.2)
                m.bias.add_(torch.randn_like(m.bias) * 0.2)
    x = torch.randn(cfg["batch"], 3, cfg["size"], cfg["size"])
    y = torch.randint(0, cfg["classes"], (cfg["batch"],))
    cfg["closest_gate"] = clear_gates(model, x)
    logits = model(x)
    loss = F.cross_entropy(logits, y, label_smoothing=cfg["label_smoothing"])
    loss.backward()
    write_reference(out, model.tessera_names(), x, y, logits, loss, cfg)


def speed(a):
    torch.set_num_threads(a.threads)
    torch.backends.mkldnn.enabled = True
    torch.manual_seed(0)
    fmt = torch.channels_last if a.layout == "nhwc" else torch.contiguous_format
    model = ResNet50(a.classes).train().to(memory_format=fmt)
    x = torch.randn(a.batch, 3, a.size, a.size).to(memory_format=fmt)
    y = torch.randint(0, a.classes, (a.batch,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(x)
        F.cross_entropy(logits.float(), y, label_smoothing=0.1).backward()
        opt.step()

    step_s = step_seconds(step, a.iters)
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "layout": a.layout, "precision": a.precision,
                      "samples_per_second": a.batch / step_s, "step_ms": step_s * 1e3,
                      "parameters": sum(p.numel() for p in model.parameters())}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dump", type=str, default="")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--layout", choices=["nhwc", "nchw"], default="nhwc")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: torch.autocast(bfloat16)")
    a = p.parse_args()
    if a.dump:
        dump(a.dump, a.seed)
    else:
        speed(a)


if __name__ == "__main__":
    main()
