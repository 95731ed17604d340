#!/usr/bin/env python3
"""Elastic data parallelism on the local backend (`tessera run`).

A job of 4 replicas (one rank each, on 4 virtual nodes of one GPU slot, spec.elastic.minReplicas 3)
loses a virtual node mid-run (`tessera node remove`: a lost machine, its pod killed) with no node to
spare. It goes on with 3 replicas from its newest checkpoint, keeping its global batch of 8 (rank 0
trains two of the four micro-batches of 2, as its log says), and grows back to 4 once the node is
added back (`tessera node add`): its gang stops at a checkpoint and is placed whole. Neither counts
against backoffLimit. For each seed the final validation loss is compared with the same job's
uninterrupted run: within 1% under dense, which follows the uninterrupted trajectory up to the order
of summation (TrainingTest: 2e-8 over 20 steps), and within the spread of the uninterrupted runs over
the seeds under hybrid (topk, then dense), whose re-sharded residuals change the selections. The
recipe decays its learning rate (cosine), as training recipes do: with a constant rate this small
Adam model amplifies a change in the order of summation to a few percent over 128 steps, with the
decay the runs end within 0.01% of each other. Each difference is printed.

usage: elastic_test.py --bin BUILD/bin [--seeds N]
Each run is bounded (TIMEOUT); every process and directory it made is removed, also on failure.
"""
import argparse
import glob
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testing"))
from local_job import LocalRun, scratch_runs  # noqa: E402


def manifest(name, strategy, seed):
    communication = ("{strategy: dense, timeoutSeconds: 20}" if strategy == "dense" else
                     "{strategy: hybrid, sparse: topk, dense: dense, density: 0.1, switchAtEpoch: 3, timeoutSeconds: 20}")
    return "\n".join([
        "apiVersion: tessera.dev/v1alpha1", "kind: TrainingJob", "metadata: {name: %s}" % name, "spec:",
        "  replicas: 4", "  ranksPerReplica: 1",
        "  model: {name: cosmoflow, inputSize: 16, baseChannels: 4, hidden: [16], seed: %d}" % seed,
        "  dataset: {synthetic: cosmo, samples: 256, validationSamples: 32, seed: %d}" % seed,
        "  training: {epochs: 8, batchSize: 8, threads: 1, seed: %d, optimizer: {name: adam, learningRate: 0.002},"
        " schedule: {decay: cosine}}" % seed,
        "  communication: %s" % communication,
        "  checkpoint: {path: ckpt, everySteps: 4}",
        "  elastic: {minReplicas: 3}",
        "  runPolicy: {backoffLimit: 0}",
        "  local: {nodes: 4, gpusPerNode: 1}", ""])


class Run(LocalRun):
    """One `tessera run` of the job in its own work directory."""

    def __init__(self, bin_dir, root, tag, strategy, seed):
        super().__init__(bin_dir, os.path.join(root, tag), manifest("el-" + tag, strategy, seed))


def resumed(s, entries):
    h = s.get("restartHistory", [])
    return len(h) >= entries and h[entries - 1].get("resumedAtStep", -1) >= 0


def elastic_run(bin_dir, root, strategy, seed, runs):
    run = Run(bin_dir, root, "%s-%d-elastic" % (strategy, seed), strategy, seed)
    runs.append(run)
    # As early as the status shows training (it trails by a second or more, some 40-100 steps of the
    # 256 on a loaded machine), so that the smaller gang has steps left to be seen resuming and to
    # grow back.
    run.wait("step 4", lambda s: s.get("step", -1) >= 4)
    run.node("remove", "local-3")
    s = run.wait("the gang resumed on 3 replicas", lambda s: s.get("replicas") == 3 and resumed(s, 1))
    lost_at, resumed_at = s["restartHistory"][0]["failedAtStep"], s["restartHistory"][0]["resumedAtStep"]
    logs = ""
    for path in glob.glob(os.path.join(run.work, "logs", "*.log")):
        with open(path) as f:
            logs += f.read()
    if "global batch 8 (4 micro-batches of 2 over 3 replicas" not in logs:
        raise AssertionError("the 3-replica gang does not say it keeps the global batch: %s" % run.output())
    run.node("add", "local-3")
    s = run.wait("the gang grown back to 4 replicas", lambda s: s.get("replicas") == 4 and s.get("attempt", 0) >= 2)
    s = run.finish()
    out = run.output()
    for reason in ("ScaledDown", "ScaledUp"):
        if reason not in out:
            raise AssertionError("no %s event: %s" % (reason, out))
    if s.get("restarts") != 0:
        raise AssertionError("counted against backoffLimit: %s" % s.get("restartHistory"))
    print("  %s seed %d: node lost at step %d, resumed on 3 replicas at %d (%d retrained), grown back to 4; "
          "validation MSE %.5f" % (strategy, seed, lost_at, resumed_at, max(0, lost_at - resumed_at), s["validation"]["loss"]))
    return s["validation"]["loss"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    with scratch_runs("tessera-elastic-") as (root, runs):
        failed = []
        for strategy in ("dense", "hybrid"):
            straight, elastic = {}, {}
            for seed in range(1, args.seeds + 1):
                run = Run(args.bin, root, "%s-%d" % (strategy, seed), strategy, seed)
                runs.append(run)
                straight[seed] = run.finish()["validation"]["loss"]
                elastic[seed] = elastic_run(args.bin, root, strategy, seed, runs)
            spread = max(straight.values()) - min(straight.values())
            for seed in straight:
                diff = elastic[seed] - straight[seed]
                bound, why = (0.01 * straight[seed], "1%") if strategy == "dense" else (spread, "the seeds' spread")
                print("%s seed %d: uninterrupted %.5f, elastic %.5f (%+.2f%%); allowed %.5f (%s)" % (
                    strategy, seed, straight[seed], elastic[seed], 100 * diff / straight[seed], bound, why))
                if abs(diff) > bound:
                    failed.append("%s seed %d: %+.5f is beyond %.5f" % (strategy, seed, diff, bound))
        if failed:
            raise AssertionError("; ".join(failed))
        print("PASS elastic: shrink on a lost node and grow back, %d seeds, dense and hybrid" % args.seeds)
        return 0


if __name__ == "__main__":
    sys.exit(main())
