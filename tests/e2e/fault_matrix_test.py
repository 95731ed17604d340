#!/usr/bin/env python3
"""The fault matrix on the local backend (`tessera run`): each fault injected into a running job,
whose final validation loss is compared with an uninterrupted run of the same job.

- kill -9 of a random worker at a random step, for each seed: the job succeeds after one gang
  restart, retrains at most one checkpoint interval, and ends within 5% of the uninterrupted
  validation loss;
- the rendezvous token, read from a worker's environment, is in no file of the job (logs, status,
  checkpoints, cache) and in no metrics endpoint;
- every entry of the SSD cache tier corrupted mid-run: detected by checksum and read again from
  the remote tier; the job goes on without a restart, and ends within 5% too.

usage: fault_matrix_test.py --bin BUILD/bin [--seeds N] [--epochs E]
Each run is bounded (TIMEOUT); every process and directory it made is removed, also on failure.
`make test` runs 3 seeds; docs/reliability.md has the figures of a longer run.
"""
import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import re
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testing"))
from local_job import TIMEOUT, LocalRun, scratch_runs  # noqa: E402

EVERY = 6      # checkpoint interval, steps
TRAIN = 96     # training samples (batch 4: 24 steps an epoch)


def tessera(bin_dir, *args, **kw):
    return subprocess.run([os.path.join(bin_dir, "tessera"), *args], capture_output=True, text=True, timeout=TIMEOUT, **kw)


def manifest(root, name, epochs):
    return "\n".join([
        "apiVersion: tessera.dev/v1alpha1", "kind: TrainingJob", "metadata: {name: %s}" % name, "spec:",
        "  replicas: 2", "  ranksPerReplica: 2",
        "  model: {name: cosmoflow, inputSize: 16, baseChannels: 4, hidden: [16]}",
        "  dataset: {format: hdf5, path: %s/data/train, validationPath: %s/data/val}" % (root, root),
        "  training: {epochs: %d, batchSize: 4, threads: 1, optimizer: {name: adam, learningRate: 0.002}}" % epochs,
        "  communication: {strategy: dense, timeoutSeconds: 30}",
        "  cache: {memory: 0, localSSD: {path: ssd, sizeLimit: 256Mi}}",
        "  checkpoint: {path: ckpt, everySteps: %d}" % EVERY,
        "  runPolicy: {backoffLimit: 2}",
        "  local: {nodes: 2, gpusPerNode: 2}", ""])


class Run(LocalRun):
    """One `tessera run` of the job in its own work directory."""

    def __init__(self, bin_dir, root, tag, epochs):
        super().__init__(bin_dir, os.path.join(root, tag), manifest(root, "fm-" + tag, epochs))

    def token_and_metrics(self):
        """The job's rendezvous token (from a worker's environment) and the text of every metrics
        endpoint (the controller's, and each worker's it lists), read while the job runs."""
        s = self.wait_for_step(1)
        with open("/proc/%d/environ" % s["workers"][0]["pid"], "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        token = env[b"TESSERA_TOKEN"].decode()
        m = re.search(r"the controller's at (http://[0-9.:]+)/metrics", self.output())
        if not m:
            raise AssertionError("no metrics address in: " + self.output())
        texts = [urllib.request.urlopen(m.group(1) + "/metrics", timeout=10).read().decode()]
        targets = json.loads(urllib.request.urlopen(m.group(1) + "/targets", timeout=10).read())
        for group in targets:
            for t in group["targets"]:
                try:
                    texts.append(urllib.request.urlopen("http://%s/metrics" % t, timeout=10).read().decode())
                except OSError:
                    pass  # a worker that has finished
        return token, texts

    def expect_no_secret(self, token, scraped):
        """The token is in no log, status, checkpoint or cache file of the job, and in no metric."""
        if len(token) < 16:
            raise AssertionError("a rendezvous token of %d characters" % len(token))
        needle = token.encode()
        for dirpath, _, files in os.walk(self.work):
            for name in files:
                with open(os.path.join(dirpath, name), "rb") as f:
                    if needle in f.read():
                        raise AssertionError("the rendezvous token is in %s" % os.path.join(dirpath, name))
        for text in scraped:
            if token in text:
                raise AssertionError("the rendezvous token is in a metrics endpoint")
        print("the token is in none of the job's %d metrics endpoints and files" % len(scraped))

    def worker_logs(self):
        text = ""
        for p in sorted(glob.glob(os.path.join(self.work, "logs", "*"))):
            with open(p, errors="replace") as f:
                text += f.read()
        return text


def within(loss, reference, what):
    gap = abs(loss - reference) / reference
    print("  %s: validation loss %.5f against %.5f uninterrupted (%.2f%%)" % (what, loss, reference, 100 * gap))
    if gap > 0.05:
        raise AssertionError("%s: validation loss %.5f is %.1f%% from the uninterrupted %.5f" % (what, loss, 100 * gap, reference))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    bin_dir = os.path.abspath(args.bin)
    with scratch_runs("tessera-faults-") as (root, runs):
        for part, n, seed in (("train", TRAIN, 1), ("val", 32, 2)):
            r = tessera(bin_dir, "data", "generate", "--kind", "cosmoflow", "--samples", str(n), "--size", "16",
                        "--out", os.path.join(root, "data", part), "--seed", str(seed))
            if r.returncode:
                raise AssertionError(r.stderr)
        steps = args.epochs * TRAIN // 4

        base = Run(bin_dir, root, "uninterrupted", args.epochs)
        runs.append(base)
        token, scraped = base.token_and_metrics()
        s = base.finish()
        base.expect_no_secret(token, scraped)
        reference, baseline = s["validation"]["loss"], s["validation"]["baselineLoss"]
        print("uninterrupted: %d steps, validation loss %.5f (predict-the-mean %.5f)" % (s["step"], reference, baseline))
        if reference > 0.8 * baseline:  # otherwise 5% of it would not tell a trained model from an untrained one
            raise AssertionError("the uninterrupted job did not learn: %.5f against %.5f" % (reference, baseline))

        for seed in range(1, args.seeds + 1):
            rng = random.Random(seed)
            at = rng.randint(EVERY + 1, steps - 3)
            run = Run(bin_dir, root, "kill-%d" % seed, args.epochs)
            runs.append(run)
            workers = run.wait_for_step(at)["workers"]
            victim = rng.choice(workers)
            os.kill(victim["pid"], signal.SIGKILL)
            s = run.finish()
            h = s.get("restartHistory", [])
            if s.get("restarts") != 1 or len(h) != 1:
                raise AssertionError("seed %d: %s restarts: %s" % (seed, s.get("restarts"), run.output()))
            # failedAtStep is the last step the gang reported starting; a kill just after a checkpoint
            # was written (at the end of that step) resumes past it: nothing was retrained.
            lost = max(0, h[0]["failedAtStep"] - h[0]["resumedAtStep"])
            print("seed %d: killed rank %d (replica %d) once the status showed step %d; failed at %d, resumed at %d: %d steps retrained" %
                  (seed, victim.get("rank", -1), victim["replica"], at, h[0]["failedAtStep"], h[0]["resumedAtStep"], lost))
            if lost > EVERY:
                raise AssertionError("seed %d: %d steps retrained, more than the checkpoint interval %d" % (seed, lost, EVERY))
            if s["step"] != steps:
                raise AssertionError("seed %d: ended at step %d of %d" % (seed, s["step"], steps))
            within(s["validation"]["loss"], reference, "seed %d" % seed)

        # The SSD tier corrupted mid-run, once every rank has cached its first epoch.
        run = Run(bin_dir, root, "corrupt-ssd", args.epochs)
        runs.append(run)
        run.wait_for_step(TRAIN // 4 + 2)
        corrupted = 0
        for p in glob.glob(os.path.join(run.work, "ssd", "**", "*"), recursive=True):
            if os.path.isfile(p) and os.path.getsize(p) > 64:
                with open(p, "r+b") as f:
                    f.seek(os.path.getsize(p) // 2)
                    f.write(b"\xff" * 16)
                corrupted += 1
        s = run.finish()
        detected = run.worker_logs().count("is corrupt; dropping it and reading the remote tier")
        print("corrupt SSD: %d entries corrupted, %d detected by checksum, restarts %d" % (corrupted, detected, s.get("restarts")))
        if corrupted == 0 or detected == 0:
            raise AssertionError("no corrupt SSD entry was detected (%d corrupted)" % corrupted)
        if s.get("restarts") != 0:
            raise AssertionError("the corrupt cache restarted the gang: %s" % run.output())
        within(s["validation"]["loss"], reference, "corrupt SSD")
        print("fault matrix: every job succeeded")
        return 0


if __name__ == "__main__":
    sys.exit(main())
