#!/usr/bin/env python3
"""Runs the emulated-cluster benchmarks of docs/benchmarks.md and appends their JSON lines to a file.

  matrix.py OUT.jsonl [--bench PATH] [--only cpu,calibration,exchange,bucket,train,overlap,ddp,target,models,model-steps,auto,auto-target] [--repeat N]

Each line is one `tessera-bench topk`, `cluster` or `cluster-train` run (the last two bring the
emulated cluster up and down themselves); a run that fails is reported on stderr and the others go
on. --repeat N measures the whole list N times over, one pass after another, so the machine's slow
spells fall on every configuration; results.py keeps each configuration's median run. The cost model
takes its calibration from the same file, so measure its groups (cpu, calibration) in the same
sitting as the runs it is checked against: this machine's speed drifts by a quarter from one day to
the next. Needs root (network namespaces). report.py, plot.py and cost_model.py read the file.
"""
import argparse
import json
import subprocess
import sys
import time

import results

SIZE, DENSITY = 25600000, 0.001
RATES = ["1gbit", "10gbit"]
STRATEGIES = ["dense", "torus", "topk", "hitopk"]
GROUPS = ["cpu", "calibration", "exchange", "bucket", "train", "overlap", "ddp", "target", "models", "model-steps", "auto",
          "auto-target"]  # what --only names, in runs()'s order


def runs(groups):
    if "cpu" in groups:
        # the CPU costs the cost model takes: selection at both densities of the runs, a streaming pass
        for density in ["0.001", "0.01"]:
            yield ["topk", "--size", str(SIZE), "--density", density]
    if "calibration" in groups:
        # alpha and beta of each link kind: dense all-reduce of growing size between two nodes (inter)
        # and between two ranks of one node (intra, loopback). Three passes (results.py keeps each
        # size's median run): a few seconds each, and one stalled run (a 2,500-float exchange at 8 ms
        # instead of 0.3, a 25.6M-float loopback one at 98 ms instead of 49) would set a link's alpha
        # or a byte's CPU cost for every exchange the model predicts.
        for _ in range(3):
            for rate in RATES:
                for size in [2500, 250000, 2500000, 25600000]:
                    yield ["cluster", "--strategy", "dense", "--nodes", "2", "--local", "1", "--rate", rate,
                           "--size", str(size), "--density", "1", "--iters", "5"]
            for size in [2500, 250000, 2500000, 25600000]:
                yield ["cluster", "--strategy", "dense", "--nodes", "1", "--local", "2", "--rate", "1gbit",
                       "--size", str(size), "--density", "1", "--iters", "5"]
    if "exchange" in groups:
        for rate in RATES:
            for nodes, local in [(2, 2), (4, 1), (4, 2)]:
                for s in STRATEGIES:
                    yield ["cluster", "--strategy", s, "--nodes", str(nodes), "--local", str(local), "--rate", rate,
                           "--size", str(SIZE), "--density", str(DENSITY), "--iters", "5"]
    if "bucket" in groups:
        # the training runs' large bucket alone: cnn25m's 25.2M floats at their density, on their placement,
        # to set against the same exchange inside a step (the runs' select_ms and the debug log)
        for rate in RATES:
            for s in STRATEGIES:
                yield ["cluster", "--strategy", s, "--nodes", "2", "--local", "2", "--rate", rate,
                       "--size", str(results.BUCKET), "--density", "0.01", "--iters", "5"]
    train = ["--nodes", "2", "--local", "2", "--batch", "16", "--steps", "8", "--threads", "1", "--density", "0.01"]
    if "train" in groups:
        for model in ["cosmoflow", "cnn25m"]:
            for rate in RATES:
                for s in STRATEGIES + ["hybrid"]:
                    for overlap in ["on", "off"]:
                        yield ["cluster-train", "--model", model, "--strategy", s, "--overlap", overlap, "--rate", rate] + train
    if "overlap" in groups:
        # overlap where the compute allows it: a rank per node, each with a core, and 32 samples per rank,
        # so that the backward pass is about as long as the exchange
        for rate in RATES:
            for overlap in ["on", "off"]:
                yield ["cluster-train", "--model", "cosmoflow", "--strategy", "dense", "--overlap", overlap, "--rate", rate,
                       "--nodes", "2", "--local", "1", "--batch", "64", "--steps", "8", "--threads", "1", "--density", "0.01"]
    if "ddp" in groups:
        for model in ["cosmoflow", "cnn25m"]:
            for rate in RATES:
                yield ["cluster-train", "--peer", "ddp", "--model", model, "--rate", rate] + train
    if "target" in groups:
        # five seeds (weights and data order): one trajectory of 64 steps says little about accuracy.
        # hybrid runs 8 epochs (the same steps as dense) and 12 (about dense's 8 epochs' time).
        for seed in ["1", "2", "3", "4", "5"]:
            for s, epochs in [("dense", "8"), ("hybrid", "8"), ("hybrid", "12")]:
                yield ["cluster-train", "--model", "cosmoflow", "--strategy", s, "--rate", "1gbit", "--nodes", "2", "--local", "2",
                       "--batch", "16", "--steps", "8", "--epochs", epochs, "--threads", "1", "--density", "0.01", "--seed", seed]
    if "auto" in groups:
        # strategy auto beside the fixed strategies, in one sitting: 2 x 2, CosmoFlow and cnn25m, at 100
        # Mbit/s, 1 and 10 Gbit/s. dense, torus and hybrid keep the accuracy rule auto keeps (at least
        # the last half of the epochs dense); hitopk throughout does not, and is there for reference.
        for model in ["cosmoflow", "cnn25m"]:
            for rate in ["100mbit"] + RATES:
                for s in ["dense", "torus", "hitopk", "hybrid", "auto"]:
                    yield ["cluster-train", "--model", model, "--strategy", s, "--overlap", "on", "--rate", rate] + train
    if "auto-target" in groups:
        # auto's accuracy: its final validation loss against dense's seed-to-seed spread, 3 seeds at 1 Gbit/s
        for seed in ["1", "2", "3"]:
            for s in ["dense", "auto"]:
                yield ["cluster-train", "--model", "cosmoflow", "--strategy", s, "--rate", "1gbit", "--nodes", "2", "--local", "2",
                       "--batch", "16", "--steps", "8", "--epochs", "8", "--threads", "1", "--density", "0.01", "--seed", seed]
    if "models" in groups or "model-steps" in groups:
        # the seed paper's workloads, each with ImageNet's or the speed benchmark's gradient (25.6M and
        # 25.5M parameters), on both placements of 4 ranks: every strategy overlapped and the DDP peer;
        # dense without overlap calibrates the cost model's compute and rest of each model on 4 ranks.
        # model-steps: the Tessera runs alone, what the cost model's step check needs, in two thirds
        # of the time, so that --repeat 3 (each row the median of three runs) fits one sitting.
        peer = "models" in groups
        for model, batch in [("resnet50", "16"), ("transformer", "4")]:
            for rate in RATES:
                for nodes, local in [("2", "2"), ("4", "1")]:
                    place = ["--model", model, "--rate", rate, "--nodes", nodes, "--local", local, "--batch", batch,
                             "--steps", "8", "--threads", "1"]
                    for s in ["dense", "torus", "hitopk", "hybrid"]:
                        yield ["cluster-train", "--strategy", s, "--overlap", "on", "--density", "0.01"] + place
                    yield ["cluster-train", "--strategy", "dense", "--overlap", "off", "--density", "0.01"] + place
                    if peer:
                        yield ["cluster-train", "--peer", "ddp"] + place


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--bench", default="build/bin/tessera-bench")
    p.add_argument("--only", default="cpu,calibration,exchange,bucket,train,overlap,ddp,target,models")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    groups = set(a.only.split(","))
    if groups - set(GROUPS):
        p.error(f"--only: no group {', '.join(sorted(groups - set(GROUPS)))} (the groups: {', '.join(GROUPS)})")
    todo = list(runs(groups)) * a.repeat
    failed = 0
    with open(a.out, "a") as out:
        for i, args in enumerate(todo, 1):
            t0 = time.time()
            r = subprocess.run([a.bench] + args + ["--json"], capture_output=True, text=True, timeout=1200)
            line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            if r.returncode != 0 or not line.startswith("{"):
                failed += 1
                print(f"[{i}/{len(todo)}] FAILED {' '.join(args)}: {r.stderr.strip()[-400:]}", file=sys.stderr)
                continue
            row = json.loads(line)
            out.write(json.dumps(row, sort_keys=True) + "\n")
            out.flush()
            shown = row.get("exchange_ms") or row.get("step_ms") or row.get("mstopk_ms")
            print(f"[{i}/{len(todo)}] {' '.join(args)}: {shown:.1f} ms ({time.time() - t0:.0f} s)", file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
