#!/usr/bin/env python3
"""Prints matrix.py's results as the markdown tables of docs/benchmarks.md.

  report.py RESULTS.jsonl
"""
import sys

import results

STRATEGIES = ["dense", "torus", "topk", "hitopk"]


def main():
    rows = results.load(sys.argv[1])
    ex = [r for r in rows if r["bench"] == "cluster" and r["density"] != 1]
    if ex:
        print("| nodes x ranks | link | " + " | ".join(STRATEGIES) + " | hitopk / dense | inter-node MB per rank (dense / hitopk) |")
        print("|---|---|" + "---|" * (len(STRATEGIES) + 2))
        for topo in sorted({(r["nodes"], r["local"]) for r in ex}):
            for rate in ["1gbit", "10gbit"]:
                got = {r["strategy"]: r for r in ex if (r["nodes"], r["local"]) == topo and r["rate"] == rate}
                if not got:
                    continue
                cells = [f"{got[s]['exchange_ms']:.0f} ms" if s in got else "" for s in STRATEGIES]
                ratio = got["hitopk"]["exchange_ms"] / got["dense"]["exchange_ms"] if "hitopk" in got and "dense" in got else float("nan")
                mb = f"{got['dense']['bytes_inter'] / 1e6:.1f} / {got['hitopk']['bytes_inter'] / 1e6:.2f}" if "hitopk" in got and "dense" in got else ""
                print(f"| {topo[0]} x {topo[1]} | {rate} | " + " | ".join(cells) + f" | {ratio:.3f} | {mb} |")
        print()
    tr = [r for r in rows if r["bench"] == "cluster-train" and not r["epochs"]]
    ddp = {(r["model"], r["rate"]): r for r in tr if r["peer"] == "ddp"}
    for model in ["cosmoflow", "cnn25m"]:
        sub = [r for r in tr if r["model"] == model and r["peer"] == "tessera"]
        if not sub:
            continue
        print(f"**{model}** ({sub[0]['params'] / 1e6:.1f}M parameters), {sub[0]['nodes']} nodes x {sub[0]['local']} ranks, "
              f"global batch {sub[0]['batch']}, density {sub[0]['density']}:\n")
        print("| link | strategy | overlap | step ms | samples/s | over DDP | compute ms | comm exposed / total ms | exposed share |")
        print("|---|---|---|---|---|---|---|---|---|")
        for rate in ["1gbit", "10gbit"]:
            d = ddp.get((model, rate))
            if d:
                print(f"| {rate} | PyTorch DDP | (its own) | {d['step_ms']:.0f} | {d['samples_per_second']:.1f} | 1 | {d['compute_ms']:.0f} | | |")
            for s in STRATEGIES + ["hybrid"]:
                for ov in [True, False]:
                    r = next((r for r in sub if r["rate"] == rate and r["strategy"] == s and r["overlap"] == ov), None)
                    if not r:
                        continue
                    over = f"{r['samples_per_second'] / d['samples_per_second']:.2f}" if d else ""
                    print(f"| {rate} | {s} | {'on' if ov else 'off'} | {r['step_ms']:.0f} | {r['samples_per_second']:.1f} | {over} | "
                          f"{r['compute_ms']:.0f} | {r['comm_exposed_ms']:.0f} / {r['comm_total_ms']:.0f} | "
                          f"{r['comm_exposed_ms'] / r['step_ms']:.0%} |")
        print()
    tg = [r for r in rows if r["bench"] == "cluster-train" and r["epochs"]]
    if tg:
        first = min(r["seed"] for r in tg)
        print("| strategy | epoch | seconds | validation loss | validation MAE |")
        print("|---|---|---|---|---|")
        for r in tg:
            if r["seed"] == first:
                for e in r["epochs"]:
                    print(f"| {r['strategy']} | {e['epoch']} | {e['seconds']:.1f} | {e['val_loss']:.4f} | {e['val_metric']:.4f} |")
        print()
        print("| seed | strategy | seconds | final loss | final MAE | best loss |")
        print("|---|---|---|---|---|---|")
        for r in sorted(tg, key=lambda r: (r["seed"], r["strategy"])):
            last = r["epochs"][-1]
            print(f"| {r['seed']} | {r['strategy']} | {last['seconds']:.1f} | {last['val_loss']:.4f} | {last['val_metric']:.4f} | "
                  f"{min(e['val_loss'] for e in r['epochs']):.4f} |")
        print()

if __name__ == "__main__":
    main()
