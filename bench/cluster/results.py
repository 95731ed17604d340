"""Reads matrix.py's JSON lines. A configuration measured several times (matrix.py --repeat) is
one row: the run with the median time (the lower median of an even count), so its parts (compute,
exposed and total communication) stay those of one run."""
import json

MEASURED = {"exchange_ms", "bytes_intra", "bytes_inter", "step_ms", "samples_per_second", "compute_ms",
            "comm_exposed_ms", "comm_total_ms", "params", "epochs", "repeats"}


def load(path):
    groups, order = {}, []
    for line in open(path):
        if not line.strip():
            continue
        r = json.loads(line)
        if r.get("bench") == "cluster-train":
            r.setdefault("seed", 1)  # runs from before --seed had the first
        config = {k: v for k, v in r.items() if k not in MEASURED}
        config["time_to_loss"] = bool(r.get("epochs"))  # a run with validation is not a throughput run
        key = json.dumps(config, sort_keys=True)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out = []
    for key in order:
        runs = groups[key]
        t = "exchange_ms" if "exchange_ms" in runs[0] else "step_ms" if "step_ms" in runs[0] else None
        if t:
            runs = sorted(runs, key=lambda r: r[t])
        row = dict(runs[(len(runs) - 1) // 2])
        row["repeats"] = len(runs)
        out.append(row)
    return out
