#!/usr/bin/env python3
"""End to end: a real Prometheus (Debian's) scrapes a running `tessera run` job's workers and its
controller; then every query of every panel of the Grafana dashboard, read from the dashboard's
JSON, must return data for that job, and the switch annotation must find the sparse-to-dense switch.

  dashboard_test.py --bin BUILD/bin [--pictures DIR]

The only query allowed to be empty is the one reading dcgm-exporter's GPU metric: there is no GPU
and no dcgm-exporter here. --pictures also draws the panels to PNG (scripts/dashboard.py render).
Everything it starts is stopped and its temporary directory removed, pass or fail.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import dashboard  # noqa: E402

SCRAPE = 2  # tessera run's scrape interval
# The job switches to dense about 15 s after it starts: Prometheus 2.42 applies new scrape targets
# every 5 s, so the workers' first samples come 5-7 s after they start, and the annotation's test
# needs samples of the sparse phase before the switch.

JOB = """apiVersion: tessera.dev/v1alpha1
kind: TrainingJob
metadata:
  name: dash
spec:
  replicas: 2
  ranksPerReplica: 2
  model: {name: cosmoflow, inputSize: 16, hidden: [32, 16]}
  dataset: {format: hdf5, path: data/train, validationPath: data/val}
  training:
    epochs: 60
    batchSize: 4
    optimizer: {name: adam, learningRate: 0.001}
    schedule: {decay: cosine, minLearningRate: 0.0002}
  parallelism: {spatial: {d: 2}}
  communication: {strategy: hybrid, sparse: hitopk, dense: torus, density: 0.01, switchAtEpoch: 36}
  cache:
    memory: 64Mi
    localSSD: {path: work/ssd, sizeLimit: 1Gi}
  checkpoint: {path: work/checkpoints, everySteps: 8}
  local: {nodes: 2, gpusPerNode: 2, workDir: work}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"Prometheus at {url} not ready after {seconds} s")


def instant(url, expr, at):
    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=30) as r:
        res = json.load(r)["data"]["result"]
    return float(res[0]["value"][1]) if res else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--pictures")
    args = ap.parse_args()
    if not shutil.which("prometheus"):
        sys.exit("dashboard_test: no prometheus on PATH (scripts/deps.sh installs Debian's)")
    tmp = tempfile.mkdtemp(prefix="tessera-dashboard-")
    procs, groups = [], []
    try:
        tessera = os.path.join(os.path.abspath(args.bin), "tessera")
        for kind, n, seed in (("train", 64, 1), ("val", 16, 2)):
            subprocess.run([tessera, "data", "generate", "--kind", "cosmoflow", "--samples", str(n), "--size", "16",
                            "--seed", str(seed), "--out", f"data/{kind}"], cwd=tmp, check=True, capture_output=True)
        with open(os.path.join(tmp, "job.yaml"), "w") as f:
            f.write(JOB)
        controller, prom = free_port(), free_port()
        start = time.time()
        # Its own session: on a timeout the whole group (workers, Prometheus) is killed.
        run = subprocess.Popen([tessera, "run", "job.yaml", "--metrics-addr", f"127.0.0.1:{controller}",
                                f"--prometheus=127.0.0.1:{prom}", "--progress", "10"],
                               cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        groups.append(run.pid)
        try:
            stdout, stderr = run.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            sys.exit("dashboard_test: tessera run did not finish in 300 s")
        end = time.time()
        print(stdout, end="")
        if run.returncode != 0:
            sys.exit(f"dashboard_test: tessera run failed ({run.returncode}):\n{stderr}")
        if "Prometheus at" not in stdout or "Prometheus stopped" not in stdout:
            sys.exit("dashboard_test: tessera run did not say where Prometheus ran and that it stopped")
        with open(os.path.join(tmp, "work", "status.json")) as f:
            status = json.load(f)["status"]
        if status.get("restarts", 0) != 0:
            sys.exit(f"dashboard_test: the job restarted: {status.get('restartHistory')}")
        switch_step = status["switchStep"]

        # Prometheus again, on the data the job's run left, as tessera run's last line says.
        url = f"http://127.0.0.1:{free_port()}"
        p = subprocess.Popen(["prometheus", "--config.file=work/prometheus/prometheus.yml",
                              "--storage.tsdb.path=work/prometheus/data", "--web.listen-address=" + url[7:]],
                             cwd=tmp, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus-2.log"), "w"))
        procs.append(p)
        wait_ready(url)

        scraped = dashboard.query_range(url, 'count by (job) (up == 1)', start, end, SCRAPE)
        jobs = {s["metric"].get("job") for s in scraped}
        if not {"dash", "tessera-controller"} <= jobs:
            sys.exit(f"dashboard_test: Prometheus scraped {sorted(jobs)}, not the workers (dash) and the controller")

        d = dashboard.load()
        v = dashboard.variables("default", "dash", SCRAPE)
        failures, checked = [], 0
        for panel in dashboard.panels(d):
            for t in panel["targets"]:
                expr = dashboard.substitute(t["expr"], v)
                series = dashboard.query_range(url, expr, start, end, SCRAPE)
                points = sum(len(dashboard.finite_points(s)) for s in series)
                if "DCGM_FI_DEV_GPU_UTIL" in t["expr"]:
                    print(f"  (no dcgm-exporter here) {panel['title']}: {len(series)} series")
                    continue
                checked += 1
                print(f"  {panel['title']} [{t['refId']}]: {len(series)} series, {points} points")
                if points == 0:
                    failures.append(f"{panel['title']} [{t['refId']}]: no data for {expr}")
        # The switch annotation: its first point is where the phase turned dense.
        ann = [a for a in d["annotations"]["list"] if "expr" in a]
        if len(ann) != 1:
            failures.append(f"expected one query annotation (the switch), found {len(ann)}")
        else:
            step = int(v["__interval"][:-1])
            hits = dashboard.query_range(url, dashboard.substitute(ann[0]["expr"], v), start, end, step)
            pts = sorted(t for s in hits for t, _ in dashboard.finite_points(s))
            if not pts:
                failures.append("the switch annotation found nothing")
            else:
                phase = 'max(tessera_training_phase{namespace="default",job="dash"})'
                after, before = instant(url, phase, pts[0]), instant(url, phase, pts[0] - 2 * step)
                at_step = instant(url, 'max(tessera_step{namespace="default",job="dash"})', pts[0])
                print(f"  switch annotation at +{pts[0] - start:.0f} s: phase {before} -> {after}, step {at_step} "
                      f"(the controller's switch step {switch_step})")
                if after != 1 or before != 0:
                    failures.append(f"the switch annotation's first point is not the switch (phase {before} -> {after})")
                elif at_step is None or at_step < switch_step:
                    failures.append(f"the switch annotation is at step {at_step}, before the switch step {switch_step}")
        if args.pictures:
            subprocess.run([sys.executable, os.path.join(os.path.dirname(dashboard.__file__), "dashboard.py"), "render",
                            "--prometheus", url, "--namespace", "default", "--job", "dash", "--start", str(start),
                            "--end", str(end), "--out", args.pictures], check=True)
        if failures:
            sys.exit("dashboard_test: FAILED\n  " + "\n  ".join(failures))
        print(f"dashboard_test: {checked} queries of {len(dashboard.panels(d))} panels returned data; switch annotated")
    finally:
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
