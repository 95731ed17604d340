#!/usr/bin/env python3
"""Prints matrix.py's results as the markdown tables of docs/benchmarks.md.

  report.py RESULTS.jsonl
"""
import statistics
import sys

import results

STRATEGIES = ["dense", "torus", "topk", "hitopk"]


def main():
    rows = results.load(sys.argv[1])
    ex = results.exchanges(rows)
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
    big = results.exchanges(rows, bucket=True)
    if big:
        # the training runs' large bucket alone, and the selection of a training step (error feedback
        # and top-k of every bucket) in cnn25m's runs without overlap
        steps = {(r["strategy"], r["rate"]): r for r in rows if r["bench"] == "cluster-train" and r["peer"] == "tessera"
                 and r["model"] == "cnn25m" and not r["overlap"] and not r["epochs"]}
        print("| link | strategy | exchange alone ms | of which selection ms | selection in a training step ms |")
        print("|---|---|---|---|---|")
        for rate in ["1gbit", "10gbit"]:
            for s in STRATEGIES:
                r = next((x for x in big if x["rate"] == rate and x["strategy"] == s), None)
                if r:
                    step = steps.get((s, rate))
                    inside = f"{step['select_ms']:.1f}" if step and step.get("select_ms") else ""
                    alone = f"{r['select_ms']:.1f}" if r.get("select_ms") else ""
                    print(f"| {rate} | {s} | {r['exchange_ms']:.0f} | {alone} | {inside} |")
        print()
    tr = [r for r in rows if r["bench"] == "cluster-train" and not r["epochs"]]
    ddp = {(results.placement(r), r["rate"]): r for r in tr if r["peer"] == "ddp"}
    # a table per model and placement, the models in this order, the most ranks first
    for place in sorted({results.placement(r) for r in tr}, key=results.placement_order):
        sub = [r for r in tr if results.placement(r) == place and r["peer"] == "tessera"]
        if not sub:
            continue
        print(f"**{place[0]}** ({sub[0]['params'] / 1e6:.1f}M parameters), {sub[0]['nodes']} nodes x {sub[0]['local']} ranks, "
              f"global batch {sub[0]['batch']}, density {sub[0]['density']}:\n")
        peer = any(p == place for p, _ in ddp)  # the "over DDP" column only where the peer ran
        print("| link | strategy | overlap | step ms | samples/s | " + ("over DDP | " if peer else "") +
              "compute ms | comm exposed / total ms | exposed share |")
        print("|---|---|---|---|---|" + ("---|" if peer else "") + "---|---|---|")
        for rate in ["1gbit", "10gbit"]:
            d = ddp.get((place, rate))
            if d:
                print(f"| {rate} | PyTorch DDP | (its own) | {d['step_ms']:.0f} | {d['samples_per_second']:.1f} | 1 | {d['compute_ms']:.0f} | | |")
            for s in STRATEGIES + ["hybrid", "auto"]:
                for ov in [True, False]:
                    r = next((r for r in sub if r["rate"] == rate and r["strategy"] == s and r["overlap"] == ov), None)
                    if not r:
                        continue
                    over = (f"{r['samples_per_second'] / d['samples_per_second']:.2f} | " if d else " | ") if peer else ""
                    print(f"| {rate} | {s} | {'on' if ov else 'off'} | {r['step_ms']:.0f} | {r['samples_per_second']:.1f} | {over}"
                          f"{r['compute_ms']:.0f} | {r['comm_exposed_ms']:.0f} / {r['comm_total_ms']:.0f} | "
                          f"{r['comm_exposed_ms'] / r['step_ms']:.0%} |")
        print()
    groups = results.time_to_loss(rows)
    if groups:
        print("Each cell: the seconds, the final validation loss and (in brackets) the best.\n")
        print("| seed | " + " | ".join(groups) + " |")
        print("|---|" + "---|" * len(groups))
        for seed in sorted({r["seed"] for g in groups.values() for r in g}):
            cells = []
            for g in groups.values():
                r = next((r for r in g if r["seed"] == seed), None)
                cells.append(f"{r['epochs'][-1]['seconds']:.1f} s, {r['epochs'][-1]['val_loss']:.4f} "
                             f"({min(e['val_loss'] for e in r['epochs']):.4f})" if r else "")
            print(f"| {seed} | " + " | ".join(cells) + " |")
        print()
        print(f"| run | seeds | seconds | final loss | final MAE | seconds to {TARGET} (seeds reaching it) |")
        print("|---|---|---|---|---|---|")
        for name, g in groups.items():
            secs = [r["epochs"][-1]["seconds"] for r in g]
            loss = [r["epochs"][-1]["val_loss"] for r in g]
            mae = [r["epochs"][-1]["val_metric"] for r in g]
            hit = [t for t in (results.reached(r, TARGET) for r in g) if t is not None]
            to = f"{statistics.mean(hit):.1f} ({len(hit)})" if hit else "- (0)"
            print(f"| {name} | {len(g)} | {statistics.mean(secs):.1f} | {statistics.mean(loss):.4f} +- {sd(loss):.4f} | {statistics.mean(mae):.4f} +- {sd(mae):.4f} | {to} |")
        print()


TARGET = 0.25  # the validation loss of the time-to-a-loss comparison


def sd(v):
    """The sample standard deviation (0 for one value)."""
    return statistics.stdev(v) if len(v) > 1 else 0.0


if __name__ == "__main__":
    main()
