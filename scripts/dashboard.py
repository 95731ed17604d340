#!/usr/bin/env python3
"""Reads Tessera's Grafana dashboard (charts/tessera/dashboards/tessera.json) and runs its queries
against a Prometheus, as Grafana would: the template variables and $__interval / $__rate_interval
substituted, each query a range query over the job's time.

  dashboard.py render --prometheus URL --namespace NS --job NAME --start T0 --end T1 --out DIR
      draws every panel to DIR/NN-<title>.png and all of them to DIR/dashboard.png (matplotlib)

The end-to-end test (tests/e2e/dashboard_test.py) imports it to check that every query returns data.
"""
import argparse
import json
import math
import os
import re
import sys
import urllib.parse
import urllib.request

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "charts", "tessera", "dashboards", "tessera.json")


def load(path=DASHBOARD):
    with open(path) as f:
        return json.load(f)


def panels(dashboard):
    """The panels that query (rows left out), in order."""
    return [p for p in dashboard["panels"] if p.get("type") != "row" and p.get("targets")]


def substitute(expr, variables):
    # Longest names first: $__rate_interval before $__interval.
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    left = re.findall(r"\$\{?\w+", expr)
    if left:
        raise ValueError(f"unknown variable(s) {left} in {expr}")
    return expr


def variables(namespace, job, scrape_seconds, rank=".*"):
    # Grafana: $__rate_interval = max($__interval + scrape interval, 4 x scrape interval).
    interval = 2 * scrape_seconds
    return {"namespace": namespace, "job": job, "rank": rank, "datasource": "prometheus",
            "__interval": f"{interval}s", "__rate_interval": f"{max(interval + scrape_seconds, 4 * scrape_seconds)}s"}


def query_range(prometheus, expr, start, end, step):
    url = prometheus.rstrip("/") + "/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}s"})
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {expr}: {body}")
    return body["data"]["result"]


def finite_points(series):
    return [(float(t), float(v)) for t, v in series["values"] if math.isfinite(float(v))]


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) if fmt else json.dumps(labels)


def render(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = load(args.dashboard)
    v = variables(args.namespace, args.job, args.scrape_seconds)
    step = args.scrape_seconds
    os.makedirs(args.out, exist_ok=True)
    ps = panels(d)
    cols = 3
    rows = (len(ps) + cols - 1) // cols
    overview, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    for i, p in enumerate(ps):
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for target_ax in (ax, axes[i // cols][i % cols]):
            drawn = 0
            for t in p["targets"]:
                for s in query_range(args.prometheus, substitute(t["expr"], v), args.start, args.end, step):
                    pts = finite_points(s)
                    if not pts:
                        continue
                    target_ax.plot([t0 - args.start for t0, _ in pts], [y for _, y in pts],
                                   label=legend(substitute(t.get("legendFormat", ""), v), s["metric"]), linewidth=1.2)
                    drawn += 1
            target_ax.set_title(p["title"], fontsize=10)
            target_ax.set_xlabel("seconds since the job started", fontsize=8)
            target_ax.set_ylabel(p.get("fieldConfig", {}).get("defaults", {}).get("unit", ""), fontsize=8)
            target_ax.tick_params(labelsize=7)
            if drawn:
                target_ax.legend(fontsize=7, loc="best")
            else:
                target_ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=target_ax.transAxes)
        fig.tight_layout()
        slug = re.sub(r"[^a-z0-9]+", "-", p["title"].lower()).strip("-")
        fig.savefig(os.path.join(args.out, f"{i + 1:02d}-{slug}.png"), dpi=90)
        plt.close(fig)
    for j in range(len(ps), rows * cols):
        axes[j // cols][j % cols].axis("off")
    overview.suptitle(f"{d['title']}: {args.namespace}/{args.job}", y=0.995)
    overview.tight_layout(rect=(0, 0, 1, 0.985))
    overview.savefig(os.path.join(args.out, "dashboard.png"), dpi=70)
    print(f"dashboard.py: {len(ps)} panels drawn to {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="draw every panel to PNG")
    r.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    r.add_argument("--dashboard", default=DASHBOARD)
    r.add_argument("--namespace", default="default")
    r.add_argument("--job", required=True)
    r.add_argument("--start", type=float, required=True, help="unix seconds")
    r.add_argument("--end", type=float, required=True, help="unix seconds")
    r.add_argument("--scrape-seconds", type=int, default=2, help="the scrape interval (tessera run: 2)")
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        render(args)
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"dashboard.py: {e}")


if __name__ == "__main__":
    main()
