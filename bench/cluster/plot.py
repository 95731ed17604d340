#!/usr/bin/env python3
"""Draws the emulated-cluster benchmarks (matrix.py's JSON lines) as PNG plots with matplotlib.

  plot.py RESULTS.jsonl OUTDIR [--model MODEL.json]

Writes exchange.png (exchange time by strategy, topology and link rate), throughput.png (samples/s
per strategy over PyTorch DDP's), overlap.png (exposed communication with and without overlap),
target.png (validation loss over time, dense vs hybrid) and, with cost_model.py's --json output,
model.png (model vs measured).
"""
import argparse
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import results  # noqa: E402

STRATEGIES = ["dense", "torus", "topk", "hitopk"]


def rate_gbit(rate):
    """A link rate such as "10gbit" in Gbit/s, for ordering."""
    return float(rate.rstrip("gbit"))


def bars(ax, groups, series, values, ylabel, log=False):
    width = 0.8 / len(series)
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [values.get((grp, s), 0) for grp in groups], width, label=s)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("outdir")
    p.add_argument("--model")
    a = p.parse_args()
    rows = results.load(a.results)
    os.makedirs(a.outdir, exist_ok=True)

    ex = results.exchanges(rows)
    if ex:
        topologies = sorted({(r["nodes"], r["local"]) for r in ex})
        fig, axes = plt.subplots(1, len(topologies), figsize=(5 * len(topologies), 4), squeeze=False)
        for ax, (m, n) in zip(axes[0], topologies):
            sub = [r for r in ex if (r["nodes"], r["local"]) == (m, n)]
            rates = sorted({r["rate"] for r in sub}, key=rate_gbit)
            bars(ax, rates, STRATEGIES, {(r["rate"], r["strategy"]): r["exchange_ms"] for r in sub}, "ms per exchange", log=True)
            ax.set_title(f"{m} nodes x {n} ranks, 25.6M floats, density 0.001")
        axes[0][0].legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.outdir, "exchange.png"), dpi=90)

    tr = [r for r in rows if r["bench"] == "cluster-train" and not r["epochs"]]
    ddp = {(results.placement(r), r["rate"]): r for r in tr if r["peer"] == "ddp"}
    if ddp:
        keys = sorted(ddp)
        fig, ax = plt.subplots(figsize=(9, 4))
        series = STRATEGIES + ["hybrid"]
        vals = {(f"{r['model']}\n{r['rate']}", r["strategy"]): r["samples_per_second"] / ddp[k]["samples_per_second"]
                for r in tr for k in [(results.placement(r), r["rate"])]
                if r["peer"] == "tessera" and r["overlap"] and k in ddp}
        bars(ax, [f"{p[0]}\n{rate}" for p, rate in keys], series, vals, "samples/s over PyTorch DDP")
        ax.axhline(1.0, color="black", lw=0.8)
        first = ddp[keys[0]]
        ax.set_title(f"Training throughput on {first['nodes']} emulated nodes x {first['local']} ranks (overlap on)")
        ax.legend(ncol=5, fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.outdir, "throughput.png"), dpi=90)

    tt = [r for r in tr if r["peer"] == "tessera"]
    if tt:
        # a row per placement (the order of report.py's tables), a column per link rate
        places = sorted({results.placement(r) for r in tt}, key=results.placement_order)
        rates = sorted({r["rate"] for r in tt}, key=rate_gbit)
        fig, axes = plt.subplots(len(places), len(rates), figsize=(4.5 * len(rates), 3.5 * len(places)), squeeze=False)
        for row, place in zip(axes, places):
            for ax, rate in zip(row, rates):
                sub = [r for r in tt if (results.placement(r), r["rate"]) == (place, rate)]
                vals = {(r["strategy"], "on" if r["overlap"] else "off"): r["comm_exposed_ms"] for r in sub}
                names = [s for s in STRATEGIES + ["hybrid"] if any(r["strategy"] == s for r in sub)]
                bars(ax, names, ["off", "on"], vals, "exposed communication, ms/step")
                ax.set_title(f"{place[0]}, {place[1]} x {place[2]}, batch {place[3]}, {rate}", fontsize=9)
                ax.tick_params(axis="x", labelsize=8)
        axes[0][0].legend(title="overlap")
        fig.tight_layout()
        fig.savefig(os.path.join(a.outdir, "overlap.png"), dpi=90)

    groups = results.time_to_loss(rows)
    if groups:
        # each schedule's mean over its seeds per epoch, with the seeds' range shaded
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, g in groups.items():
            n = min(len(r["epochs"]) for r in g)
            t = [statistics.mean(r["epochs"][i]["seconds"] for r in g) for i in range(n)]
            losses = [[r["epochs"][i]["val_loss"] for r in g] for i in range(n)]
            line, = ax.plot(t, [statistics.mean(x) for x in losses], marker="o", markersize=3,
                            label=f"{name} ({len(g)} seed{'s' if len(g) > 1 else ''})")
            ax.fill_between(t, [min(x) for x in losses], [max(x) for x in losses], color=line.get_color(), alpha=0.15)
        first = next(iter(groups.values()))[0]
        ax.set_xlabel("seconds")
        ax.set_ylabel("validation loss (MSE)")
        ax.set_title(f"{first['model']}, {first['nodes']} x {first['local']} ranks, {first['rate']} (mean and range of the seeds)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.outdir, "target.png"), dpi=90)

    if a.model:
        pred = json.load(open(a.model))["predictions"]
        fig, ax = plt.subplots(figsize=(5, 5))
        for kind, marker in [("exchange", "o"), ("step", "s")]:
            pts = [q for q in pred if q["kind"] == kind]
            ax.scatter([q["measured_ms"] for q in pts], [q["model_ms"] for q in pts], marker=marker, label=kind)
        lo = min(q["measured_ms"] for q in pred) * 0.8
        hi = max(q["measured_ms"] for q in pred) * 1.2
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.plot([lo, hi], [lo * 1.15, hi * 1.15], color="gray", lw=0.5, ls="--")
        ax.plot([lo, hi], [lo * 0.85, hi * 0.85], color="gray", lw=0.5, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured, ms")
        ax.set_ylabel("model, ms")
        ax.set_title("alpha-beta model vs measurement (dashed: 15%)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.outdir, "model.png"), dpi=90)


if __name__ == "__main__":
    main()
