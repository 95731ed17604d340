#!/usr/bin/env python3
"""`tessera plan`: each exchange strategy's predicted step for a manifest, from the cost model. On
slow links the sparse strategies come out fastest and on fast ones a dense all-reduce does; the
hybrid row lies between its two phases by its share of the epochs; the compute is timed here when not
given; every bad input names its flag or field.

usage: plan_test.py --bin BUILD/bin --examples DIR [unittest args]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN = EXAMPLES = ""


def plan(*args):
    return subprocess.run([os.path.join(BIN, "tessera"), "plan", *args], capture_output=True, text=True, timeout=300)


def rows(job, *args):
    r = plan(os.path.join(EXAMPLES, job), "--json", *args)  # an absolute path stays as it is
    if r.returncode != 0:
        raise AssertionError(r.stderr)
    out = json.loads(r.stdout)
    return out, {s["strategy"].split(" ")[0]: s for s in out["strategies"]}


def gpu_job(tmp):
    """The Transformer example on GPUs (spec.device: cuda, a GPU per pod): the costs of GPU ranks."""
    with open(os.path.join(EXAMPLES, "transformer-local.yaml")) as f:
        text = f.read()
    text = text.replace("  replicas: 2\n", "  replicas: 2\n  device: cuda\n  resources: {gpu: 1}\n")
    path = os.path.join(tmp, "transformer-gpu.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


class PlanTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.gpu = gpu_job(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_the_sparse_lead_shrinks_on_faster_links(self):
        # GPU ranks: nothing of the selection or the bytes' copies on the CPU. At 100 Mbit/s the
        # dense all-reduce's 13 MB take a second and hitopk's pairs a fiftieth of that; at 100
        # Gbit/s both hide behind the backward pass and the step is the compute.
        _, slow = rows(self.gpu, "--links", "100mbit", "--compute-ms", "100")
        _, fast = rows(self.gpu, "--links", "100gbit", "--compute-ms", "100")
        self.assertEqual(set(slow), {"dense", "torus", "topk", "hitopk", "hybrid"})
        self.assertGreater(slow["dense"]["step_ms"] / slow["hitopk"]["step_ms"], 5)
        self.assertLess(fast["dense"]["step_ms"] / fast["hitopk"]["step_ms"], 1.05)
        for r in list(slow.values()) + list(fast.values()):
            self.assertGreaterEqual(r["step_ms"], 100.0)  # never below the compute
        for s in slow:  # a step at 100 Mbit/s is longer than at 100 Gbit/s, for every strategy
            self.assertGreater(slow[s]["step_ms"], fast[s]["step_ms"])
        # CPU ranks pay for moving the bytes too: the same job on the CPU is slower at every rate
        _, cpu = rows("transformer-local.yaml", "--links", "100gbit", "--compute-ms", "100")
        for s in cpu:
            self.assertGreater(cpu[s]["step_ms"], fast[s]["step_ms"])

    def test_auto_would_choose_a_sparse_phase_on_slow_links_only(self):
        # strategy auto's choice (common/exchange_choice.h) on the same assumed costs: a sparse phase
        # for the epochs before the switch (the example's 1 of 3), dense throughout on fast links
        slow, _ = rows(self.gpu, "--links", "100mbit", "--compute-ms", "100")
        fast, _ = rows(self.gpu, "--links", "100gbit", "--compute-ms", "100")
        self.assertRegex(slow["auto"]["exchange"], r"^(topk|hitopk) at density 0.01, then (dense|torus)$")
        self.assertIn("inter-node links taken as 90 Mbit/s", slow["auto"]["reason"])
        self.assertIn("sparse for 33% of the remaining steps", slow["auto"]["reason"])
        self.assertIn(fast["auto"]["exchange"], ("dense", "torus"))
        self.assertIn("a sparse phase would not gain 5% over the job", fast["auto"]["reason"])

    def test_hybrid_weighs_its_phases_by_epochs(self):
        # the example: hitopk for 1 of 3 epochs, then torus
        _, r = rows("transformer-local.yaml", "--links", "1gbit", "--compute-ms", "50")
        want = r["hitopk"]["step_ms"] / 3 + 2 * r["torus"]["step_ms"] / 3
        self.assertAlmostEqual(r["hybrid"]["step_ms"], want, places=6)

    def test_the_compute_is_timed_here_when_not_given(self):
        out, r = rows("transformer-local.yaml", "--links", "1gbit")
        self.assertIn("timed here", out["compute_from"])
        self.assertGreater(out["compute_ms"], 0)
        self.assertEqual((out["nodes"], out["ranks_per_node"]), (2, 1))  # spec.local
        self.assertEqual(out["parameters"], 3_257_856)  # the example's model: width 256, 4 blocks, context 128
        text = plan(os.path.join(EXAMPLES, "transformer-local.yaml"), "--links", "1gbit", "--compute-ms", "10")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("fastest:", text.stdout)

    def test_bad_input_is_named(self):
        job = os.path.join(EXAMPLES, "transformer-local.yaml")
        cases = [
            ((job, "--links", "fast"), "--links"),
            ((job,), "--links"),  # no rate in the manifest and none given
            ((job, "--links", "1gbit", "--nodes", "3"), "--nodes"),
            ((os.path.join(EXAMPLES, "cosmoflow-spatial.yaml"), "--links", "1gbit", "--compute-ms", "10"), "spec.parallelism.spatial"),
            ((self.gpu, "--links", "1gbit"), "--compute-ms"),  # a GPU job's compute is not timed on the CPU
            ((os.path.join(tempfile.gettempdir(), "no-such-job.yaml"), "--links", "1gbit"), "no-such-job.yaml"),
        ]
        for args, named in cases:
            r = plan(*args)
            self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
            self.assertIn(named, r.stderr, args)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--examples", required=True)
    a, rest = p.parse_known_args()
    BIN, EXAMPLES = a.bin, a.examples
    unittest.main(argv=[sys.argv[0]] + rest)
