#!/usr/bin/env python3
"""An alpha-beta cost model of Tessera's gradient exchanges and training steps, calibrated on the
emulated cluster's measurements (matrix.py's JSON lines), checked against every measured exchange and
step time, and applied to the seed paper's setting.

  cost_model.py RESULTS.jsonl [--json OUT] [--cores C]

The model. A message of b bytes on a link costs alpha + b * beta. Every collective is a ring (as in
worker/comm/gloo): p members, p - 1 steps each way; in a ring over ranks ordered node by node every
step crosses each node's link once, so a world ring runs at the pace of the inter-node link when
there are several nodes, and of the intra-node link otherwise. Rings running side by side (torus,
hitopk: one per local rank) share their node's link. With n ranks on each of m nodes (N = nm), a
bucket of S floats, density d, k = dS entries of 8 bytes (index, value):

  dense   2(N-1) (a_x + 4S/N b_x)                          x = inter if m > 1 else intra
  torus   2(n-1) (a_l + 4S/n b_l) + 2(m-1) (a_i + 4S/m b_i), the two overlapped in C chunks
          (C = S / 2^20, 1 to 8): L/C + max(X, L (C-1)/C) for the intra part L and the inter part X
          when the link is the bottleneck (when the CPU is, both parts share it and add up)
  topk    sel(S) + (N-1) (a_x + 8k b_x) + add(N k)
  hitopk  (n-1) (a_l + 4S/n b_l) + sel(S/n) + (m-1) (a_i + 8dS b_i) + (n-1) (a_l + 8mdS/n b_l) + add(m d S)

CPU work (top-k selection, scatter-add, and loopback copies, which are CPU copies) is slowed by the
number of processes sharing the machine's cores. A training step is its compute (per model,
calibrated from one run), the fixed rest of the step (data, loss all-reduce) and the exposed part of
its communication: without overlap all of it; with overlap, the buckets (reverse parameter order)
are sent one after the other as the backward pass finishes them, the backward pass's time spread over
the layers by their FLOPs, and what runs past its end is exposed; while the pass holds the cores,
communication runs at a calibrated pace (its thread waits for a core, its link idles meanwhile).
Each bucket also costs its fuse and unfuse: the gradients copied in and scaled back out.
"""
import argparse
import json
import math
import statistics
import sys

import results

def fit_line(xs, ys):
    """Least squares y = a + b x, with relative weights (each point's error counts in proportion)."""
    w = [1.0 / max(y, 1e-9) ** 2 for y in ys]
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs))
    sy = sum(wi * y for wi, y in zip(w, ys))
    sxx = sum(wi * x * x for wi, x in zip(w, xs))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys))
    b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
    return max((sy - b * sx) / sw, 0.0), b


class Links:
    """alpha (s), beta (s/byte) of the inter-node link at each rate, and of the intra-node link."""

    def __init__(self, rows):
        self.inter, self.intra = {}, None
        cal = [r for r in rows if r["bench"] == "cluster" and r["strategy"] == "dense" and r["density"] == 1]
        for rate in sorted({r["rate"] for r in cal if r["nodes"] == 2 and r["local"] == 1}):
            pts = [r for r in cal if r["nodes"] == 2 and r["local"] == 1 and r["rate"] == rate]
            # dense over 2 ranks: 2 steps of 2S bytes: t = 2a + 4S b
            a, b = fit_line([4.0 * r["size"] for r in pts], [r["exchange_ms"] / 1e3 for r in pts])
            self.inter[rate] = (a / 2, b)
        pts = [r for r in cal if r["nodes"] == 1 and r["local"] == 2]
        if pts:
            a, b = fit_line([4.0 * r["size"] for r in pts], [r["exchange_ms"] / 1e3 for r in pts])
            self.intra = (a / 2, b)
        if not self.inter or not self.intra:
            sys.exit("cost_model.py: the results have no calibration runs (matrix.py --only calibration)")


class Machine:
    """One link rate's alphas and betas, and the CPU costs per float: top-k selection (sel, by density), a
    streaming pass over a buffer (pass_), a scatter-add of one pair (add). cpu_b: the per-byte CPU
    cost of moving a byte between nodes (the fastest calibrated link's beta), which the processes
    sharing the cores slow down. cores: the machine's cores that every rank shares, or None where
    nothing is shared (a GPU per rank)."""

    def __init__(self, links, rate, cores, sel, pass_, add, gamma=1.0):
        if isinstance(links, Links):
            self.a_i, self.b_i = links.inter[rate]
            self.cpu_b = min(b for _, b in links.inter.values())
            self.a_l, self.b_l = links.intra
        else:
            (self.a_i, self.b_i), (self.a_l, self.b_l), self.cpu_b = links["inter"], links["intra"], 0.0
        self.cores, self.sel, self.pass_, self.add, self.gamma = cores, sel, pass_, add, gamma
        self.overlap_pace = 1.0  # the speed of communication during the backward pass (calibrated)

    def slow(self, procs):
        """How much slower CPU work runs with `procs` processes on the shared cores."""
        return max(1.0, procs / self.cores) if self.cores else 1.0

    def sel_at(self, d):
        """Selection cost per float at density d: the calibrated density nearest to d."""
        return self.sel[min(self.sel, key=lambda x: abs(math.log(x / d)))]


def exchange_cost(strategy, S, d, m, n, mc):
    """(seconds, CPU seconds) of one exchange of S floats on m nodes x n ranks: its time, and the
    work it gives this rank's cores (single-core seconds), which overlapped compute has to share."""
    N = m * n
    slow = mc.slow(N)  # CPU shared by the processes on this machine
    cost = [0.0, 0.0]

    # Moving bytes is CPU work too, but a process waiting on its peer leaves the core to another:
    # transfers slow down less than pure computation, by (P / cores)^gamma (gamma calibrated).
    xslow = slow ** mc.gamma

    def inter(steps, nbytes):  # the link's rate, or the CPU moving the bytes, whichever is slower
        cost[0] += steps * (mc.a_i + nbytes * max(mc.b_i, mc.cpu_b * xslow))
        cost[1] += steps * nbytes * mc.cpu_b

    def intra(steps, nbytes):  # loopback: CPU copies
        cost[0] += steps * (mc.a_l + nbytes * mc.b_l * xslow)
        cost[1] += steps * nbytes * mc.b_l

    def cpu(floats_sel, passes, pairs):
        work = mc.sel_at(d) * floats_sel + mc.pass_ * passes + mc.add * pairs
        cost[0] += slow * work
        cost[1] += work

    ring = inter if m > 1 else intra
    k = math.ceil(d * S)
    if strategy == "dense":
        ring(2 * (N - 1), 4.0 * S / N)
    elif strategy == "torus":
        if n > 1 and m > 1:
            # Pipelined in C chunks (worker/comm/exchange.cc): the inter-node all-reduce of chunk c
            # runs beside the intra-node reduce-scatter of c + 1 and all-gather of c - 1.
            chunks = min(8, max(1, S // (1 << 20)))
            t0 = cost[0]
            intra(2 * (n - 1), 4.0 * S / n)
            local_s = cost[0] - t0
            inter(2 * (m - 1), 4.0 * S / m)
            cross_s = cost[0] - t0 - local_s
            if mc.b_i > mc.cpu_b * xslow:  # the link is the bottleneck: the copies hide behind it
                cost[0] = t0 + local_s / chunks + max(cross_s, local_s * (chunks - 1) / chunks)
            # else both parts are CPU work on the same shared cores, and add up
        elif n > 1:
            intra(2 * (n - 1), 4.0 * S / n)
        else:  # a reduce-scatter and an all-gather of one member are copies (two streams each)
            cpu(0, 4 * S, 0)
            if m > 1:
                inter(2 * (m - 1), 4.0 * S / m)
    elif strategy == "topk":
        # error feedback (residual += gradient: three streams), selection, zeroing the bucket, scatter-add
        cpu(S, 4 * S, N * k)
        ring(N - 1, 8.0 * k)
    elif strategy == "hitopk":
        ks = math.ceil(d * S / n)
        if n > 1:
            intra(n - 1, 4.0 * S / n)
            intra(n - 1, 8.0 * m * ks)
        if m > 1:
            inter(m - 1, 8.0 * ks * n)
        # a reduce-scatter of one member is a copy (two streams); error feedback on the shard (three),
        # its selection, zeroing the bucket, scatter-add
        cpu(S / n, (2 * S if n == 1 else 0) + 3 * S / n + S, m * n * ks)
    else:
        raise ValueError(strategy)
    return cost[0], cost[1]


def exchange_s(strategy, S, d, m, n, mc):
    return exchange_cost(strategy, S, d, m, n, mc)[0]


# ---- the benchmark models: parameters per layer (backward order: last layer first) and FLOPs ----

def layers(model):
    """[(name, params, forward FLOPs per sample)] in forward order."""
    if model == "cosmoflow":
        out, ch, s = [], 4, 32
        for i, co in enumerate([16, 32, 64]):
            out.append((f"conv{i + 1}", ch * co * 27 + co, 2.0 * ch * co * 27 * s ** 3))
            ch, s = co, s // 2
        f = ch * s ** 3
        for i, h in enumerate([2048, 256, 4]):
            out.append((f"fc{i + 1}", f * h + h, 2.0 * f * h))
            f = h
        return out
    if model == "cnn25m":
        return [("conv1", 1 * 32 * 9 + 32, 2.0 * 32 * 9 * 64 * 64), ("conv2", 32 * 64 * 9 + 64, 2.0 * 32 * 64 * 9 * 32 * 32),
                ("fc1", 16384 * 1536 + 1536, 2.0 * 16384 * 1536), ("output", 1536 * 10 + 10, 2.0 * 1536 * 10)]
    if model == "resnet50":
        # 25.6M parameters; spread over its 54 weight layers roughly evenly in FLOPs (4.1 GFLOP forward)
        # and with most parameters in the last stages: 4 stages of (params, FLOPs) then the FC layer.
        stages = [(0.2e6, 0.9e9), (1.2e6, 1.0e9), (7.1e6, 1.1e9), (15.0e6, 0.8e9)]
        return [(f"stage{i + 1}", p, f) for i, (p, f) in enumerate(stages)] + [("fc", 2.05e6, 0.004e9)]
    raise ValueError(model)


def buckets(model, bucket_bytes=25 << 20):
    """Bucket sizes (floats) in send order, and for each the fraction of the backward pass done when
    it is complete (its last layer's backward finished)."""
    ls = layers(model)
    bwd = [2 * f for _, _, f in ls]
    bwd[0] = ls[0][2]  # the first layer computes no input gradient
    total = sum(bwd)
    out, cap, used, done = [], bucket_bytes // 4, None, 0.0
    for (name, p, _), b in zip(reversed(ls), reversed(bwd)):
        done += b / total
        if used is None or (used + p > cap and used > 0):
            out.append([0, 0.0])
            used = 0
        out[-1][0] += p
        out[-1][1] = done
        used += p
    return out


def step_time(model, strategy, d, m, n, mc, compute_s, rest_s, overlap):
    """(step, exposed, total) seconds of one training step: `compute_s` is forward + backward +
    update as measured with every rank computing at once (the cores shared `slow` ways), `rest_s`
    the step's fixed remainder. Without overlap the exchange follows the backward pass. With it,
    buckets start as the pass finishes them (its time spread over the layers by FLOPs) and run one
    after another; what runs past the pass's end is exposed. And the cores are shared: the step also
    takes at least the machine's CPU work, the rank's compute plus the exchange's CPU work, spread
    over its share of the cores."""
    slow = mc.slow(m * n)
    backward = compute_s * 2 / 3
    t, total, cpu = 0.0, 0.0, 0.0
    for size, ready in buckets(model):
        c, w = exchange_cost(strategy, size, d, m, n, mc)
        fuse = mc.pass_ * 4 * size  # gradients copied into the bucket and scaled back out: four streams
        c, w = c + slow * fuse, w + fuse
        total += c
        cpu += w
        start = max(t, ready * backward if overlap else backward)
        # While the backward pass runs, the communication thread waits for a core now and then and
        # its link idles meanwhile: it gets `mc.overlap_pace` of its speed until the pass ends.
        during = min(max(backward - start, 0.0), c / mc.overlap_pace)
        t = start + during + (c - during * mc.overlap_pace)
    exposed = max(0.0, t - backward)
    step = compute_s + exposed
    if overlap and mc.cores:
        step = max(step, compute_s + slow * cpu)
    return rest_s + step, exposed, total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--json", help="write the predictions here")
    a = p.parse_args()
    rows = results.load(a.results)
    links = Links(rows)
    topk_rows = [r for r in rows if r["bench"] == "topk"]
    if not topk_rows:
        sys.exit("cost_model.py: the results have no `tessera-bench topk --json` row (the CPU costs)")
    sel = {r["density"]: r["mstopk_ms"] / 1e3 / r["size"] for r in topk_rows}
    pass_ = min(r["pass_ms"] / 1e3 / r["size"] for r in topk_rows)
    add = 4 * pass_  # scatter-add of one (index, value) pair: a random read-modify-write
    print(f"links: intra alpha {links.intra[0] * 1e6:.1f} us, {1 / links.intra[1] / 1e9:.2f} GB/s")
    for rate, (al, be) in links.inter.items():
        print(f"links: inter {rate}: alpha {al * 1e6:.1f} us, {1 / be / 1e9:.3f} GB/s")
    print("CPU: top-k selection " + ", ".join(f"{v * 1e9:.2f} ns per float at density {d:g}" for d, v in sorted(sel.items())) +
          f"; a pass {pass_ * 1e9:.2f} ns per float; scatter-add {add * 1e9:.1f} ns per pair")

    # gamma: from the dense exchange of 4 nodes x 1 rank on the fastest link (4 processes on the
    # cores, the transfer CPU-bound), which is calibration and not checked below.
    fastest = min(links.inter, key=lambda k: links.inter[k][1])
    g_row = next((r for r in rows if r["bench"] == "cluster" and r["strategy"] == "dense" and r["density"] != 1
                  and r["nodes"] == 4 and r["local"] == 1 and r["rate"] == fastest), None)
    gamma = 1.0
    if g_row:
        N = 4
        base = exchange_s("dense", g_row["size"], 1, 4, 1, Machine(links, fastest, N, sel, pass_, add))  # unshared
        gamma = max(0.0, math.log(max(g_row["exchange_ms"] / 1e3 / base, 1.0)) / math.log(N / a.cores))
    print(f"transfers under CPU sharing slow down by (processes / cores)^{gamma:.2f}")
    out, worst = [], 0.0
    print("\nexchange (25.6M floats unless noted): measured vs model")
    for r in rows:
        if r["bench"] != "cluster" or r["density"] == 1 or r is g_row:
            continue
        mc = Machine(links, r["rate"], a.cores, sel, pass_, add, gamma)
        pred = exchange_s(r["strategy"], r["size"], r["density"], r["nodes"], r["local"], mc) * 1e3
        err = pred / r["exchange_ms"] - 1
        worst = max(worst, abs(err))
        out.append({"kind": "exchange", **{k: r[k] for k in ["strategy", "nodes", "local", "rate"]},
                    "measured_ms": r["exchange_ms"], "model_ms": pred, "error": err})
        print(f"  {r['strategy']:7s} {r['nodes']}x{r['local']} {r['rate']:7s} {r['exchange_ms']:8.1f} {pred:8.1f} ms  {err:+.1%}")

    train = [r for r in rows if r["bench"] == "cluster-train" and r["peer"] == "tessera" and not r["epochs"]]
    # Calibration per model: its compute (forward, backward, update, all ranks computing at once) and
    # the rest of a step (data, loss all-reduce): medians over its runs without overlap, which differ
    # only in their communication.
    cal = {}
    for model in sorted({r["model"] for r in train}):
        seq = [r for r in train if r["model"] == model and not r["overlap"]]
        if seq:
            cal[model] = (statistics.median(r["compute_ms"] for r in seq) / 1e3,
                          statistics.median(r["step_ms"] - r["compute_ms"] - r["comm_exposed_ms"] for r in seq) / 1e3)
            print(f"{model}: compute {cal[model][0] * 1e3:.0f} ms per step, the rest {cal[model][1] * 1e3:.0f} ms")
    # The pace of communication during the backward pass: from CosmoFlow's dense, overlapped step at
    # the slowest link (calibration, not checked below), by bisection.
    slowest = max(links.inter, key=lambda k: links.inter[k][1])
    p_row = next((r for r in train if r["model"] == "cosmoflow" and r["strategy"] == "dense" and r["overlap"]
                  and r["rate"] == slowest and r["model"] in cal), None)
    pace = 1.0
    if p_row:
        mc = Machine(links, slowest, a.cores, sel, pass_, add, gamma)
        lo, hi = 0.05, 1.0
        for _ in range(40):
            mc.overlap_pace = (lo + hi) / 2
            got = step_time("cosmoflow", "dense", p_row["density"], p_row["nodes"], p_row["local"], mc, *cal["cosmoflow"], True)[0]
            lo, hi = (mc.overlap_pace, hi) if got * 1e3 > p_row["step_ms"] else (lo, mc.overlap_pace)
        pace = (lo + hi) / 2
    print(f"communication during the backward pass runs at {pace:.2f} of its speed")
    print("\ntraining step (2 nodes x 2 ranks): measured vs model")
    for r in train:
        if r["model"] not in cal or r is p_row:
            continue
        compute, rest = cal[r["model"]]
        mc = Machine(links, r["rate"], a.cores, sel, pass_, add, gamma)
        mc.overlap_pace = pace
        m, n, d = r["nodes"], r["local"], r["density"]

        def step(strategy):
            return step_time(r["model"], strategy, d, m, n, mc, compute, rest, r["overlap"])[0]
        pred = (step("hitopk") + step("torus")) / 2 if r["strategy"] == "hybrid" else step(r["strategy"])
        err = pred * 1e3 / r["step_ms"] - 1
        worst = max(worst, abs(err))
        out.append({"kind": "step", **{k: r[k] for k in ["model", "strategy", "overlap", "rate"]},
                    "measured_ms": r["step_ms"], "model_ms": pred * 1e3, "error": err})
        print(f"  {r['model']:9s} {r['strategy']:7s} overlap {'on ' if r['overlap'] else 'off'} {r['rate']:7s} "
              f"{r['step_ms']:8.1f} {pred * 1e3:8.1f} ms  {err:+.1%}")
    print(f"\nlargest error: {worst:.1%}")

    # The seed's setting: 16 nodes x 8 V100, 25 Gbit/s between nodes, NVLink inside, ResNet-50.
    seed = {"inter": (10e-6, 1 / (25e9 / 8 * 0.9)), "intra": (5e-6, 1 / 130e9)}
    mc = Machine(seed, None, None, {0.001: 0.02e-9}, 0.005e-9, 0.02e-9)  # GPU kernels (900 GB/s), nothing shared
    m, n = 16, 8
    seed_out = {}
    print("\nseed setting (16 x 8 V100, 25 Gbit/s, NVLink, ResNet-50 at about 360 images/s per GPU): step ms")
    print("  batch/GPU overlap   dense   torus  hitopk  hybrid(3/4 sparse)  hybrid over dense")
    for batch in [32, 64]:
        compute = batch / 360.0
        for overlap in [True, False]:
            t = {s: step_time("resnet50", s, 0.001, m, n, mc, compute, 0.0, overlap)[0] for s in ["dense", "torus", "hitopk"]}
            t["hybrid"] = 0.75 * t["hitopk"] + 0.25 * t["torus"]
            seed_out[f"batch{batch}-{'overlap' if overlap else 'sequential'}"] = t
            print(f"  {batch:9d} {'on ' if overlap else 'off'}    {t['dense'] * 1e3:6.1f}  {t['torus'] * 1e3:6.1f}  "
                  f"{t['hitopk'] * 1e3:6.1f}  {t['hybrid'] * 1e3:18.1f}  {t['dense'] / t['hybrid'] - 1:+.0%}")
    if a.json:
        json.dump({"links": {"intra": links.intra, "inter": links.inter}, "selection_s_per_float": sel,
                   "predictions": out, "largest_error": worst, "seed": seed_out}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
