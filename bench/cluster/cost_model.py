#!/usr/bin/env python3
"""The alpha-beta cost model of Tessera's gradient exchanges and training steps, calibrated on the
emulated cluster's measurements (matrix.py's JSON lines), checked against every measured exchange and
step time, and applied to the seed paper's setting.

  cost_model.py RESULTS.jsonl [--json OUT] [--cores C]

The model is common/cost_model.cc, the one the operator uses; this file loads it with ctypes from
libtessera_cost_c.so ($TESSERA_COST_LIB, else build/lib/ beside this checkout) and keeps the
calibration and the reports; the benchmark models' layers come from the C++ models too
(`tessera-bench cost-layers`, $TESSERA_BENCH, else build/bin/). The model itself (rings of steps
bounded by the wire and the shared cores, phases one after another, the step's compute, rest and
exposed exchange) is described in common/cost_model.h.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
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


def fit_ring(pts):
    """alpha and seconds per byte of a link from dense all-reduces of 2 ranks (2 steps of 2S bytes:
    t = 2 alpha + 4S beta): alpha from the fit over all sizes, beta from the largest, where alpha is
    negligible (the fit's slope leans on the small sizes, which alpha dominates)."""
    a, _ = fit_line([4.0 * r["size"] for r in pts], [r["exchange_ms"] / 1e3 for r in pts])
    big = max(pts, key=lambda r: r["size"])
    return a / 2, max(big["exchange_ms"] / 1e3 - a, 0.0) / (4.0 * big["size"])


def solve(f, target, lo, hi):
    """The x in [lo, hi] where the monotonic f(x) meets `target`, by bisection (the nearer end where it
    does not)."""
    rising = f(hi) > f(lo)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if (f(mid) > target) == rising else (mid, hi)
    return (lo + hi) / 2


def rate_bits(rate):
    """A tc rate ("200mbit", "1gbit", "10gbit") in bits per second."""
    for unit, scale in [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)]:
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r}")


class Links:
    """Per byte sent: the seconds of each inter-node link rate (its wire), and the CPU seconds of a byte
    sent through loopback inside a node (intra) and through the virtual NICs between nodes (inter).

    Calibrated from dense all-reduces of 2 processes (one per core): between 2 ranks of one node the
    time is loopback copying, CPU work; between 2 nodes at the slowest rate it is the wire; at the
    fastest it is the CPU again (the two processes cannot fill a 10 Gbit/s link here), so the wire
    time of the faster rates scales from the slowest by their rates."""

    def __init__(self, rows):
        cal = [r for r in rows if r["bench"] == "cluster" and r["strategy"] == "dense" and r["density"] == 1]
        fits = {}
        for rate in sorted({r["rate"] for r in cal if r["nodes"] == 2 and r["local"] == 1}, key=rate_bits):
            pts = [r for r in cal if r["nodes"] == 2 and r["local"] == 1 and r["rate"] == rate]
            # dense over 2 ranks: 2 steps of 2S bytes: t = 2a + 4S b
            fits[rate] = fit_ring(pts)
        pts = [r for r in cal if r["nodes"] == 1 and r["local"] == 2]
        if len(fits) < 2 or not pts:
            sys.exit("cost_model.py: the results lack calibration runs at two rates (matrix.py --only calibration)")
        self.intra = fit_ring(pts)  # alpha, CPU seconds per byte
        slowest, fastest = min(fits, key=rate_bits), max(fits, key=rate_bits)
        self.cpu_inter = fits[fastest][1]
        self.inter = {rate: (fits[rate][0], fits[slowest][1] * rate_bits(slowest) / rate_bits(rate)) for rate in fits}


class Machine:
    """One link rate's alpha and wire seconds per byte between nodes (a_i, b_i), the CPU seconds per
    byte sent inside a node (loopback: alpha a_l, c_l) and between nodes (c_i), and the CPU costs per
    float: top-k selection (sel, by density), a streaming pass over a buffer (pass_), a random access
    (add: a scatter-add of one pair, packing or zeroing one selected entry). cores: the machine's
    cores that every rank shares, or None where nothing is shared (a GPU per rank, NICs moving the
    bytes). hidden: the share of an exchange's CPU work that a
    link-bound exchange hides behind the wire (calibrated)."""

    def __init__(self, links, rate, cores, sel, pass_, add, hidden):
        if isinstance(links, Links):
            self.a_i, self.b_i = links.inter[rate]
            self.c_i = links.cpu_inter
            self.a_l, self.c_l = links.intra
        else:
            (self.a_i, self.b_i), (self.a_l, self.c_l), self.c_i = links["inter"], links["intra"], 0.0
        self.cores, self.sel, self.pass_, self.add, self.hidden = cores, sel, pass_, add, hidden
        self.overlap_pace = 1.0  # the speed of communication during the backward pass (calibrated)
        self.sel_share = 1.0  # the selection's share of the processes' P/C (calibrated)
        self.busy_share = 1.0  # the share of an exchange's modelled CPU work that holds the cores (calibrated)
        self.link_sharing = 1.0  # each of several rings on a node's link: its wire time per byte, in one ring's (calibrated)
        self.sparse_work = 1.0  # a sparse exchange's CPU work besides its selection, in the model's count (calibrated)


class _CMachine(ctypes.Structure):
    _fields_ = [("alpha_inter", ctypes.c_double), ("wire_inter", ctypes.c_double), ("cpu_inter", ctypes.c_double),
                ("alpha_intra", ctypes.c_double), ("cpu_intra", ctypes.c_double), ("cores", ctypes.c_int),
                ("selections", ctypes.c_int), ("selection_density", ctypes.POINTER(ctypes.c_double)),
                ("selection_seconds", ctypes.POINTER(ctypes.c_double)), ("pass_", ctypes.c_double), ("add", ctypes.c_double),
                ("hidden", ctypes.c_double), ("overlap_pace", ctypes.c_double), ("sel_share", ctypes.c_double),
                ("busy_share", ctypes.c_double), ("link_sharing", ctypes.c_double),
                ("sparse_work", ctypes.c_double)]


def _library():
    path = os.environ.get("TESSERA_COST_LIB") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                                                              "lib", "libtessera_cost_c.so")
    if not os.path.exists(path):
        sys.exit(f"cost_model.py: {path} does not exist: build it (make build) or set TESSERA_COST_LIB")
    lib = ctypes.CDLL(path)
    lib.tessera_cost_error.restype = ctypes.c_char_p
    return lib


_lib = None


def _call(name, *args):
    global _lib
    if _lib is None:
        _lib = _library()
    rc = getattr(_lib, name)(*args)
    if rc < 0:
        raise ValueError(_lib.tessera_cost_error().decode())
    return rc


def _c_machine(mc):
    """The C struct of a Machine, and the arrays it points to (kept alive by the caller)."""
    dens = sorted(mc.sel)
    d_arr = (ctypes.c_double * len(dens))(*dens)
    s_arr = (ctypes.c_double * len(dens))(*[mc.sel[d] for d in dens])
    c = _CMachine(mc.a_i, mc.b_i, mc.c_i, mc.a_l, mc.c_l, mc.cores or 0, len(dens), d_arr, s_arr, mc.pass_, mc.add, mc.hidden,
                  mc.overlap_pace, mc.sel_share, mc.busy_share, mc.link_sharing, mc.sparse_work)
    return c, (d_arr, s_arr)


def _c_layers(model, size=None):
    flat = [float(x) for layer in layers(model, size) for x in layer]
    return (ctypes.c_double * len(flat))(*flat), len(flat) // 2


def exchange_cost(strategy, S, d, m, n, mc):
    """(seconds, busy seconds, selection seconds) of one exchange of S floats on m nodes x n ranks:
    its time; how long its CPU work holds this rank's share of the cores, which overlapped compute
    has to share too; and the part of its time spent on error feedback and selection (sparse
    strategies). common/cost_model.h says how."""
    c, keep = _c_machine(mc)
    out = (ctypes.c_double * 3)()
    _call("tessera_cost_exchange", strategy.encode(), ctypes.c_double(S), ctypes.c_double(d), m, n, ctypes.byref(c), out)
    return out[0], out[1], out[2]


def exchange_s(strategy, S, d, m, n, mc):
    return exchange_cost(strategy, S, d, m, n, mc)[0]


# ---- the benchmark models' layers, from the C++ models themselves (`tessera-bench cost-layers`) ----

_layer_tables = {}


def layers(model, size=None):
    """[(params, forward FLOPs per sample)] of the benchmark model `model` (cluster-train's names) in
    forward order, as Model::cost_layers gives them: `tessera-bench cost-layers` ($TESSERA_BENCH, else
    build/bin/ beside this checkout). size: an input size other than the benchmark's."""
    key = (model, size)
    if key not in _layer_tables:
        path = os.environ.get("TESSERA_BENCH") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                                                               "bin", "tessera-bench")
        if not os.path.exists(path):
            sys.exit(f"cost_model.py: {path} does not exist: build it (make build) or set TESSERA_BENCH")
        cmd = [path, "cost-layers", "--model", model] + (["--size", str(size)] if size else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        _layer_tables[key] = [tuple(layer) for layer in json.loads(done.stdout)["layers"]]
    return _layer_tables[key]


def forward_flops(model, size=None):
    """Forward FLOPs per sample (two per multiply-add)."""
    return sum(f for _, f in layers(model, size))


def buckets(model, bucket_bytes=25 << 20, size=None):
    """Bucket sizes (floats) in send order, and for each the fraction of the backward pass done when
    it is complete (its last layer's backward finished)."""
    arr, count = _c_layers(model, size)
    cap = 64
    while True:
        out = (ctypes.c_double * (2 * cap))()
        got = _call("tessera_cost_buckets", arr, count, ctypes.c_double(bucket_bytes), out, cap)
        if got <= cap:
            return [[out[2 * i], out[2 * i + 1]] for i in range(got)]
        cap = got


def step_time(model, strategy, d, m, n, mc, compute_s, rest_s, overlap, momentum_correction=False, size=None):
    """(step, exposed, total) seconds of one training step: `compute_s` is forward + backward +
    update as measured with every rank computing at once (the cores shared `slow` ways), `rest_s`
    the step's fixed remainder. Without overlap the exchange follows the backward pass. With it,
    buckets start as the pass finishes them (its time spread over the layers by FLOPs) and run one
    after another; what runs past the pass's end is exposed. And the cores are shared: the step also
    takes at least the machine's CPU work, the rank's compute plus the exchange's CPU work, spread
    over its share of the cores. momentum_correction: the run kept SGD's velocity before the
    exchange (its passes over every bucket). size: the model's input size, where not the benchmark's."""
    return step_cost(model, strategy, d, m, n, mc, compute_s, rest_s, overlap, momentum_correction, size)[:3]


def step_cost(model, strategy, d, m, n, mc, compute_s, rest_s, overlap, momentum_correction=False, size=None):
    """step_time's (step, exposed, total) and the selection of every bucket, each as alone."""
    arr, count = _c_layers(model, size)
    c, keep = _c_machine(mc)
    out = (ctypes.c_double * 4)()
    _call("tessera_cost_step", arr, count, ctypes.c_double(25 << 20), strategy.encode(), ctypes.c_double(d), m, n, ctypes.byref(c),
          ctypes.c_double(compute_s), ctypes.c_double(rest_s), int(bool(overlap)), int(bool(momentum_correction)), out)
    return out[0], out[1], out[2], out[3]


def fit_rests(points):
    """The rest of each workload g from points (g, step beyond the compute, the modelled exchange,
    weight): the weighted mean of what the steps took beyond their modelled exchange, never below
    zero (a rest is time waited). Returns {g: (rest, that mean)}."""
    out = {}
    for g in {g for g, *_ in points}:
        pts = [(y - x, w) for h, y, x, w in points if h == g]
        mean = sum(v * w for v, w in pts) / sum(w for _, w in pts)
        out[g] = (max(mean, 0.0), mean)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("results")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--json", help="write the predictions here")
    a = p.parse_args()
    rows = results.load(a.results)
    # The links from each calibration configuration's fastest run: a wait from anything but the link
    # (a process waiting for a core, the shaper's timer) only adds, and at 2,500 floats it can be 40
    # times the exchange (2026-12-06c: 0.14, 5.8 and 6.3 ms at 1 Gbit/s, which as the median made a
    # ring step's latency 2.2 ms); the large exchanges' runs agree within 1%.
    links = Links(results.load(a.results, fastest=True))
    # The CPU costs: medians over every `tessera-bench topk` run (the cpu group, repeated).
    topk_runs = [r for r in results.runs(a.results) if r["bench"] == "topk"]
    scatter_runs = [r for r in topk_runs if "scatter_ms" in r]
    if not topk_runs or not scatter_runs:
        sys.exit("cost_model.py: the results have no `tessera-bench topk --json` run with scatter_ms (the CPU costs: "
                 "matrix.py --only cpu)")
    sel = {d: statistics.median(r["mstopk_ms"] / 1e3 / r["size"] for r in topk_runs if r["density"] == d)
           for d in sorted({r["density"] for r in topk_runs})}
    pass_ = statistics.median(r["pass_ms"] / 1e3 / r["size"] for r in topk_runs)
    add = statistics.median(r["scatter_ms"] / 1e3 / r["scatter_pairs"] for r in scatter_runs)
    print(f"links: intra alpha {links.intra[0] * 1e6:.1f} us")
    for rate, (al, be) in links.inter.items():
        print(f"links: inter {rate}: alpha {al * 1e6:.1f} us, the wire {1 / be / 1e9:.3f} GB/s")
    print("CPU: top-k selection " + ", ".join(f"{v * 1e9:.2f} ns per float at density {d:g}" for d, v in sorted(sel.items())) +
          f"; a pass {pass_ * 1e9:.2f} ns per float; scatter-add {add * 1e9:.1f} ns per pair")

    def exchange_row(strategy, nodes, local, rate):  # the exchange group's run of that configuration
        return next((r for r in rows if r["bench"] == "cluster" and r["strategy"] == strategy and r["density"] != 1
                     and r["nodes"] == nodes and r["local"] == local and r["rate"] == rate), None)

    # hidden: from the dense exchange of 4 nodes x 1 rank on the slowest link (link-bound, with 4
    # processes' copies on the cores), which is calibration and not checked below.
    slowest = max(links.inter, key=lambda k: links.inter[k][1])
    h_row = exchange_row("dense", 4, 1, slowest)
    # Every machine below has the calibrated values found so far (the defaults before they are).
    calibrated = {}

    def machine(rate):
        mc = Machine(links, rate, a.cores, sel, pass_, add, 0.0)
        for name, value in calibrated.items():
            setattr(mc, name, value)
        return mc

    hidden = 1.0
    if h_row:
        mc = machine(slowest)
        exposed = exchange_s("dense", h_row["size"], 1, 4, 1, mc)  # nothing hidden
        mc.hidden = 1.0
        hidden_all = exchange_s("dense", h_row["size"], 1, 4, 1, mc)
        busy = exposed - hidden_all
        hidden = min(1.0, max(0.0, 1 - (h_row["exchange_ms"] / 1e3 - hidden_all) / busy)) if busy > 0 else 1.0
    calibrated["hidden"] = hidden
    print(f"CPU: loopback {links.intra[1] * 1e9:.2f} ns per byte, between nodes {links.cpu_inter * 1e9:.2f} ns per byte; "
          f"a link-bound exchange hides {hidden:.0%} of its CPU work behind the wire")
    # The selection's share of the cores: its measured time in the exchanges (select_ms) against the
    # model's with every process on the cores at once.
    pts = []
    for r in rows:
        if r["bench"] == "cluster" and r.get("select_ms"):
            mc = machine(r["rate"])
            pts.append(r["select_ms"] / 1e3 / exchange_cost(r["strategy"], r["size"], r["density"], r["nodes"], r["local"], mc)[2])
    if not pts:
        sys.exit("cost_model.py: the results have no sparse exchange with select_ms (matrix.py --only exchange)")
    calibrated["sel_share"] = statistics.median(pts)
    print(f"CPU: selection runs at {calibrated['sel_share']:.2f} of the processes' share of the cores")
    # busy_share: from the dense exchange of 4 nodes x 1 rank on the fastest link, CPU-bound in the
    # model (4 processes' copies on the cores), which is calibration and not checked below. The model
    # counts a byte's CPU work as 2 processes on 2 cores took it, part of which a process waits on
    # its socket; with 4 processes the others fill those waits, and the exchange alone takes less
    # than the model's count. What the backward pass of an overlapped step shares the cores with is
    # that measured time; the exchange inside a step keeps the full count (the rests are fitted to it).
    fastest = min(links.inter, key=lambda k: links.inter[k][1])
    b_row = exchange_row("dense", 4, 1, fastest)
    busy_share = 1.0
    if b_row and fastest != slowest:
        seconds, busy, _ = exchange_cost("dense", b_row["size"], 1, 4, 1, machine(fastest))
        if busy >= seconds:  # CPU-bound
            busy_share = min(1.0, b_row["exchange_ms"] / 1e3 / busy)
    calibrated["busy_share"] = busy_share
    print(f"CPU: a CPU-bound exchange holds the cores for {busy_share:.2f} of its modelled CPU work")

    def fit_to_exchange(row, name, lo, hi):
        """The value in [lo, hi] of the machine's `name` at which the model's exchange of `row` takes as
        long as measured (by bisection); 1 without the row."""
        if not row:
            return 1.0
        mc = machine(row["rate"])

        def seconds(x):
            setattr(mc, name, x)
            return exchange_s(row["strategy"], row["size"], row["density"], row["nodes"], row["local"], mc)
        return solve(seconds, row["exchange_ms"] / 1e3, lo, hi)

    # link_sharing: from the torus exchange of 2 nodes x 2 ranks on the slowest link (two rings side
    # by side on each node's link, link-bound), which is calibration and not checked below. The wire's
    # time per byte comes from one ring of 2 ranks, which leaves the link idle between its steps; a
    # second ring beside it fills part of those gaps, and two rings took 0.87-0.92 of twice one ring's
    # time in every sitting before this factor (docs/benchmarks/journal/notebook.md), the one bias of the model's that
    # kept its sign in all of them. By bisection between 0.5 (two rings as fast as one) and 1.5.
    s_row = exchange_row("torus", 2, 2, slowest)
    link_sharing = fit_to_exchange(s_row, "link_sharing", 0.5, 1.5)
    calibrated["link_sharing"] = link_sharing
    print(f"links: two rings side by side on a node's link each take {link_sharing:.2f} of one ring's wire time per byte")
    # sparse_work: from the hitopk exchange of 2 nodes x 2 ranks on the slowest link (CPU-bound: its
    # pairs are few), which is calibration and not checked below. The model's count of the sparse
    # strategies' CPU work besides the selection (whose own share is calibrated above) prices the
    # reduce-scatter's bytes at a dense ring's cost, half of whose steps only copy where every step of
    # a reduce-scatter also sums, and each pass as a read-only stream where zeroing and the scatter
    # write; with it at 1, hitopk's exchanges came out a median 15% short of the measured over eight
    # sittings and topk's 20% (docs/benchmarks/journal/notebook.md). By bisection between 0.5 and 3.
    x_row = exchange_row("hitopk", 2, 2, slowest)
    sparse_work = fit_to_exchange(x_row, "sparse_work", 0.5, 3.0)
    calibrated["sparse_work"] = sparse_work
    print(f"CPU: a sparse exchange's work besides its selection takes {sparse_work:.2f} of the model's count")
    out, worst = [], 0.0
    print("\nexchange (floats, density): measured vs model; of which error feedback and selection (sparse strategies)")
    for r in rows:
        if r["bench"] != "cluster" or r["density"] == 1 or r is h_row or r is b_row or r is s_row or r is x_row:
            continue
        mc = machine(r["rate"])
        pred, _, pred_sel = exchange_cost(r["strategy"], r["size"], r["density"], r["nodes"], r["local"], mc)
        pred, pred_sel = pred * 1e3, pred_sel * 1e3
        err = pred / r["exchange_ms"] - 1
        worst = max(worst, abs(err))
        out.append({"kind": "exchange", **{k: r[k] for k in ["strategy", "nodes", "local", "rate", "size", "density"]},
                    "measured_ms": r["exchange_ms"], "model_ms": pred, "error": err,
                    "measured_select_ms": r.get("select_ms"), "model_select_ms": pred_sel})
        shown = f"   selection {r['select_ms']:6.1f} {pred_sel:6.1f} ms" if r.get("select_ms") else ""
        print(f"  {r['strategy']:7s} {r['nodes']}x{r['local']} {r['rate']:7s} {r['size']:9d} {r['density']:<6g}"
              f"{r['exchange_ms']:8.1f} {pred:8.1f} ms  {err:+6.1%}{shown}")

    train = [r for r in rows if r["bench"] == "cluster-train" and r["peer"] == "tessera" and not r["epochs"]]
    # Calibration from the runs without overlap (which differ only in their communication), per
    # workload (results.workload: a model, its global batch and its number of ranks; every placement
    # of those ranks runs the same processes on the same cores): its compute (forward, backward,
    # update, all ranks computing at once), the median of the measured; and the rest of its step,
    # what the step took beyond its compute and its modelled exchange (a mean over the runs, each
    # counting in proportion to its step). The rest is what a step's collectives wait for that the
    # exchange itself does not: the slowest rank's compute (4 processes on 2 cores finish it at
    # different times), the loss all-reduce, stalls. Both are the processes' and not the
    # placement's: taken per placement, from its two runs, they differed between the placements of
    # one model by as much as the day-to-day noise (ResNet-50's compute plus rest 471 ms on 2 x 2
    # and 411 ms on 4 x 1 in one sitting, 294 and 374 ms in another), and that difference, not the
    # exchange, set the placements' sparse steps apart in the model. An exchange takes as long inside
    # a step as alone: a factor for its excess, fitted with the rests by least squares over the two
    # link rates, came out between 1.04 and 1.21 from sitting to sitting with rests down to -110 ms,
    # taking in the links' calibration error rather than the exchanges' (docs/benchmarks/journal/notebook.md).
    seq = [r for r in train if not r["overlap"]]
    compute = {g: statistics.median(r["compute_ms"] for r in seq if results.workload(r) == g) / 1e3
               for g in sorted({results.workload(r) for r in seq})}
    points = []  # (workload, step beyond the compute, the model's exposed exchange, weight)
    for r in seq:
        g = results.workload(r)
        model, m, n = r["model"], r["nodes"], r["local"]
        mc = machine(r["rate"])
        exposed = statistics.mean(step_time(model, s, r["density"], m, n, mc, compute[g], 0.0, False)[1] for s in results.phases(r))
        points.append((g, r["step_ms"] / 1e3 - compute[g], exposed, (1e3 / r["step_ms"]) ** 2))
    rests = fit_rests(points)
    cal = {g: (compute[g], rests[g][0]) for g in compute}
    for (model, N, batch), (c, rest) in cal.items():
        mean = rests[(model, N, batch)][1]
        below = f" (the runs were {-mean * 1e3:.0f} ms below the model)" if mean < 0 else ""
        print(f"{model} on {N} ranks, batch {batch}: compute {c * 1e3:.0f} ms per step, the rest {rest * 1e3:.0f} ms{below}")
    # The pace of communication during the backward pass: from the dense, overlapped step at the
    # slowest link in the placement with the most runs (the first such, CosmoFlow's where it ran;
    # calibration, not checked below), by bisection.
    main_placement = statistics.mode(results.placement(r) for r in train) if train else None
    p_row = next((r for r in train if results.placement(r) == main_placement and r["strategy"] == "dense"
                  and r["overlap"] and r["rate"] == slowest and results.workload(r) in cal), None)
    pace = 1.0
    if p_row:
        mc = machine(slowest)

        def step_s(x):
            mc.overlap_pace = x
            return step_time(p_row["model"], "dense", p_row["density"], p_row["nodes"], p_row["local"], mc, *cal[results.workload(p_row)], True)[0]
        pace = solve(step_s, p_row["step_ms"] / 1e3, 0.05, 1.0)
    calibrated["overlap_pace"] = pace
    print(f"communication during the backward pass runs at {pace:.2f} of its speed")
    print("\ntraining step: measured vs model")
    for r in train:
        if results.workload(r) not in cal or r is p_row:
            continue
        compute, rest = cal[results.workload(r)]
        mc = machine(r["rate"])
        m, n, d = r["nodes"], r["local"], r["density"]

        def step(strategy):
            return step_time(r["model"], strategy, d, m, n, mc, compute, rest, r["overlap"], r.get("momentum_correction"))[0]
        # hybrid and auto: their phases' steps, each phase half the steps measured
        pred = statistics.mean(step(s) for s in results.phases(r))
        err = pred * 1e3 / r["step_ms"] - 1
        worst = max(worst, abs(err))
        # the selection of a step (every bucket's), as alone: set beside the runs' own select_ms
        pred_sel = 1e3 * statistics.mean(step_cost(r["model"], s, d, m, n, mc, compute, rest, r["overlap"], r.get("momentum_correction"))[3]
                                         for s in results.phases(r))
        out.append({"kind": "step", **{k: r[k] for k in ["model", "nodes", "local", "batch", "strategy", "overlap", "rate"]},
                    "measured_ms": r["step_ms"], "model_ms": pred * 1e3, "error": err,
                    "measured_select_ms": r.get("select_ms"), "model_select_ms": pred_sel})
        shown = f"   selection {r['select_ms']:6.1f} {pred_sel:6.1f} ms" if r.get("select_ms") else ""
        print(f"  {r['model']:9s} {r['nodes']}x{r['local']} batch {r['batch']:3d} {r['strategy']:7s} overlap {'on ' if r['overlap'] else 'off'} {r['rate']:7s} "
              f"{r['step_ms']:8.1f} {pred * 1e3:8.1f} ms  {err:+6.1%}{shown}")
    print(f"\nlargest error: {worst:.1%}")

    # The seed's setting: 16 nodes x 8 V100, 25 Gbit/s between nodes, NVLink inside.
    seed = {"inter": (10e-6, 1 / (25e9 / 8 * 0.9)), "intra": (5e-6, 1 / 130e9)}
    # GPU kernels (900 GB/s), nothing shared; NVLink copies and the NICs run beside each other (hidden 1)
    mc = Machine(seed, None, None, {0.001: 0.02e-9}, 0.005e-9, 0.02e-9, hidden=1.0)
    m, n = 16, 8
    # A GPU's training rate: ResNet-50 at about 360 images/s (224 x 224), and the Transformer at the
    # same FLOPs a second (forward + backward: 3 x the forward's).
    flop_rate = 360.0 * 3 * forward_flops("resnet50", 224)
    seed_out = {}
    for model, size, unit, batches in [("resnet50", 224, "images", [32, 64]), ("transformer", None, "sequences of 256 tokens", [8, 16])]:
        rate = flop_rate / (3 * forward_flops(model, size))
        print(f"\nseed setting (16 x 8 V100, 25 Gbit/s, NVLink), {model} at {rate:.0f} {unit}/s per GPU: step ms")
        print("  batch/GPU overlap   dense   torus  hitopk  hybrid(3/4 sparse)  hybrid over dense")
        for batch in batches:
            compute = batch / rate
            for overlap in [True, False]:
                t = {s: step_time(model, s, 0.001, m, n, mc, compute, 0.0, overlap, size=size)[0] for s in ["dense", "torus", "hitopk"]}
                t["hybrid"] = 0.75 * t["hitopk"] + 0.25 * t["torus"]
                seed_out[f"{model}-batch{batch}-{'overlap' if overlap else 'sequential'}"] = t
                print(f"  {batch:9d} {'on ' if overlap else 'off'}    {t['dense'] * 1e3:6.1f}  {t['torus'] * 1e3:6.1f}  "
                      f"{t['hitopk'] * 1e3:6.1f}  {t['hybrid'] * 1e3:18.1f}  {t['dense'] / t['hybrid'] - 1:+.0%}")
    if a.json:
        json.dump({"links": {"intra": links.intra, "inter": links.inter}, "selection_s_per_float": sel, "calibrated": calibrated,
                   "predictions": out, "largest_error": worst, "seed": seed_out}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
