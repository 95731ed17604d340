"""Reads matrix.py's JSON lines. A configuration measured several times (matrix.py --repeat) is
one row: the run with the median time (the lower median of an even count), so its parts (compute,
exposed and total communication) stay those of one run; or, where asked, its fastest run."""
import json

MEASURED = {"exchange_ms", "bytes_intra", "bytes_inter", "step_ms", "samples_per_second", "compute_ms",
            "slowest_compute_ms", "comm_exposed_ms", "comm_total_ms", "select_ms", "params", "epochs", "repeats",
            # strategy auto: what each run chose, and why
            "chosen", "reason",
            # tessera-bench topk
            "pass_ms", "nth_element_ms", "mstopk_ms", "mstopk_over_pass", "mstopk_over_nth_element", "passes",
            "candidates", "exact", "torch_topk_ms", "mstopk_over_torch_topk", "scatter_pairs", "scatter_ms"}
TIME = ["exchange_ms", "step_ms", "mstopk_ms"]  # what orders a configuration's runs


def runs(path):
    """Every run in the file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load(path, fastest=False):
    """One row per configuration: its median run, or with fastest=True its fastest."""
    groups, order = {}, []
    for r in runs(path):
        config = {k: v for k, v in r.items() if k not in MEASURED}
        config["epoch_count"] = len(r.get("epochs") or [])  # a run with validation is not a throughput run
        key = json.dumps(config, sort_keys=True)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out = []
    for key in order:
        group = groups[key]
        t = next((k for k in TIME if k in group[0]), None)
        if t:
            group = sorted(group, key=lambda r: r[t])
        row = dict(group[0 if fastest else (len(group) - 1) // 2])
        row["repeats"] = len(group)
        out.append(row)
    return out


BUCKET = 25165824  # cnn25m's large bucket (matrix.py's group bucket)


def exchanges(rows, bucket=False):
    """The exchange runs of the comparison (matrix.py's group exchange), or with bucket=True those of
    cnn25m's large bucket at the training runs' density (group bucket); calibration runs are neither."""
    return [r for r in rows if r["bench"] == "cluster" and r["density"] != 1 and (r["size"] == BUCKET) == bucket]


def placement(r):
    """A training run's model and placement (nodes, ranks per node, global batch)."""
    return (r["model"], r["nodes"], r["local"], r["batch"])


def workload(r):
    """What a training run's compute depends on on the emulated cluster: its model, global batch and
    number of ranks (every placement of them runs the same processes on the machine's cores)."""
    return (r["model"], r["nodes"] * r["local"], r["batch"])


MODELS = ["cosmoflow", "cnn25m", "resnet50", "transformer"]  # cluster-train's --model, in the tables' order


def placement_order(p):
    """Sort key of placements for tables and plots: CosmoFlow first, then the most ranks, then the
    fewest nodes (2 x 2 before 4 x 1)."""
    return (MODELS.index(p[0]), -p[1] * p[2], p[3], p[1])


def time_to_loss(rows):
    """The time-to-a-loss runs (those with validation epochs), grouped by schedule: a dict from
    "strategy, N epochs" to its runs, one a seed, in seed order."""
    groups = {}
    for r in sorted((r for r in rows if r["bench"] == "cluster-train" and r.get("epochs")),
                    key=lambda r: (r["strategy"] != "dense", len(r["epochs"]), r["seed"])):
        groups.setdefault(f"{r['strategy']}, {len(r['epochs'])} epochs", []).append(r)
    return groups


def reached(run, loss):
    """Seconds until the run's validation loss first reached `loss`, or None."""
    return next((e["seconds"] for e in run["epochs"] if e["val_loss"] <= loss), None)


def phases(r):
    """The strategies of a training run's steps, one per phase of equal length: hybrid's (hitopk, then
    torus); auto's as it chose them ("hitopk at density 0.01, then torus", or one dense strategy)."""
    if r["strategy"] == "hybrid":
        return ["hitopk", "torus"]
    if r["strategy"] == "auto":
        chosen = r.get("chosen") or "dense"
        return [chosen.split(" ")[0], chosen.split(" ")[-1]] if ", then " in chosen else [chosen]
    return [r["strategy"]]
