#!/usr/bin/env python3
"""The PyTorch peer of Tessera's Transformer language model (model.name: transformer): the same
layers, initialisation and parameter names.

  torch_transformer.py [--context 256 --width 512 --depth 8 --heads 8 --vocab 256 --batch 8
                        --threads 2 --iters 5]
      the speed peer of `tessera-bench train --model transformer`: one JSON line with the samples/s of
      forward + backward + AdamW update.
  torch_transformer.py --dump DIR [--seed 1]
      the reference of tests/parity/torch_parity.sh: a small model's weights, a batch, its logits,
      loss and every parameter's gradient, as float32 .npy files named as Tessera names them
      (DIR/param/<name>.npy, DIR/grad/<name>.npy) with DIR/config.json.

The model: token and position embeddings; pre-norm blocks x + proj(attention(qkv(ln1(x)))) and
x + proj(gelu(fc(ln2(x)))) (GELU exact, MLP 4x wide); a final LayerNorm; logits from the token
embedding (tied); mean cross-entropy over every position. Weights start N(0, 0.02), the two
projections back into the residual stream N(0, 0.02 / sqrt(2 depth)), biases 0.
"""
import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_reference import step_seconds, write_reference


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        p = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.attn_proj((p @ v).transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab, context, width, depth, heads):
        super().__init__()
        self.token = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln" not in name:
                std = 0.02 / math.sqrt(2 * depth) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        x = self.token(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.token.weight.t()

    def tessera_names(self):
        """Parameter -> the name Tessera gives it (worker/models/model.cc)."""
        names = {self.token.weight: "embed.token", self.position.weight: "embed.position",
                 self.ln_f.weight: "ln_f.weight", self.ln_f.bias: "ln_f.bias"}
        for i, b in enumerate(self.blocks, 1):
            for part in ("ln1", "qkv", "attn_proj", "ln2", "fc", "mlp_proj"):
                layer = getattr(b, part)
                names[layer.weight] = "block%d.%s.weight" % (i, part)
                names[layer.bias] = "block%d.%s.bias" % (i, part)
        return names


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def dump(out, seed):
    cfg = {"vocab": 37, "context": 12, "width": 24, "depth": 2, "heads": 3, "batch": 3}
    torch.manual_seed(seed)
    model = Transformer(cfg["vocab"], cfg["context"], cfg["width"], cfg["depth"], cfg["heads"])
    with torch.no_grad():  # spread the weights so that every gradient is well above rounding
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["context"]))
    targets = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["context"]))
    logits = model(ids)
    loss = loss_of(logits, targets)
    loss.backward()
    write_reference(out, model.tessera_names(), ids, targets, logits, loss, cfg)


def speed(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Transformer(a.vocab, a.context, a.width, a.depth, a.heads)
    ids = torch.randint(0, a.vocab, (a.batch, a.context))
    targets = torch.randint(0, a.vocab, (a.batch, a.context))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            logits = model(ids)
        loss_of(logits.float(), targets).backward()
        opt.step()

    step_s = step_seconds(step, a.iters)
    print(json.dumps({"framework": "pytorch", "version": torch.__version__, "precision": a.precision,
                      "samples_per_second": a.batch / step_s,
                      "step_ms": step_s * 1e3, "parameters": sum(p.numel() for p in model.parameters())}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dump", type=str, default="")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: torch.autocast(bfloat16)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    a = p.parse_args()
    if a.dump:
        dump(a.dump, a.seed)
    else:
        speed(a)


if __name__ == "__main__":
    main()
