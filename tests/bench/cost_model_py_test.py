#!/usr/bin/env python3
"""The cost model of bench/cluster against hand-computed cases, and results.py's median runs.

  cost_model_py_test.py SOURCE_DIR
"""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(sys.argv.pop(1), "bench", "cluster"))
import cost_model  # noqa: E402
import results  # noqa: E402

A_I, B_I, A_L, B_L = 1e-4, 1e-8, 1e-5, 1e-9


def machine(cores=None, hidden=0.0):
    """Links as given (B_L: the CPU seconds of a byte through loopback; bytes between nodes cost no CPU),
    selection and passes free unless a test sets them, nothing shared by default, and by default no
    CPU work hidden behind the wire: the times add up."""
    return cost_model.Machine({"inter": (A_I, B_I), "intra": (A_L, B_L)}, None, cores, {0.001: 0.0}, 0.0, 0.0, hidden)


class ExchangeTest(unittest.TestCase):
    def test_dense_is_a_world_ring(self):
        S = 1_000_000
        self.assertAlmostEqual(cost_model.exchange_s("dense", S, 1, 2, 1, machine()), 2 * (A_I + 4 * S / 2 * B_I))
        # four nodes x two ranks: 14 steps of S/8, each across a node link; the other rank of a node
        # sends through loopback
        self.assertAlmostEqual(cost_model.exchange_s("dense", S, 1, 4, 2, machine()),
                               14 * (A_I + 4 * S / 8 * B_I) + 14 * 4 * S / 8 * B_L / 2)
        # one node: loopback
        self.assertAlmostEqual(cost_model.exchange_s("dense", S, 1, 1, 2, machine()), 2 * (A_L + 4 * S / 2 * B_L))

    def test_torus_rings_share_the_node_link(self):
        S, m, n = 1_000_000, 2, 4
        want = 2 * (n - 1) * (A_L + 4 * S / n * B_L) + 2 * (m - 1) * (A_I + 4 * S / m * B_I)
        self.assertAlmostEqual(cost_model.exchange_s("torus", S, 1, m, n, machine()), want)

    def test_rings_sharing_a_link_take_its_sharing_factor(self):
        # 4 rings at 0.9: 3.6 times one ring's wire time per byte across; one ring alone unchanged
        S, m, n = 1_000_000, 2, 4
        mc = machine()
        mc.link_sharing = 0.9
        want = 2 * (n - 1) * (A_L + 4 * S / n * B_L) + 2 * (m - 1) * (A_I + 0.9 * 4 * S / m * B_I)
        self.assertAlmostEqual(cost_model.exchange_s("torus", S, 1, m, n, mc), want)
        self.assertAlmostEqual(cost_model.exchange_s("torus", S, 1, 4, 1, mc), cost_model.exchange_s("torus", S, 1, 4, 1, machine()))

    def test_sparse_work_scales_the_sparse_strategies_work_besides_the_selection(self):
        S, d = 1_000_000, 0.01

        def mc(sparse_work):
            m = cost_model.Machine({"inter": (A_I, B_I), "intra": (A_L, B_L)}, None, None, {d: 2e-9}, 1e-9, 1e-8, 0.0)
            m.sparse_work = sparse_work
            return m
        for s in ["topk", "hitopk"]:
            _, busy, sel = cost_model.exchange_cost(s, S, d, 2, 2, mc(1.0))
            _, busy_more, sel_more = cost_model.exchange_cost(s, S, d, 2, 2, mc(1.5))
            self.assertAlmostEqual(sel_more, sel, places=12)
            self.assertAlmostEqual(busy_more - sel_more, 1.5 * (busy - sel), places=12)
        for s in ["dense", "torus"]:
            self.assertAlmostEqual(cost_model.exchange_s(s, S, 1, 2, 2, mc(1.5)), cost_model.exchange_s(s, S, 1, 2, 2, mc(1.0)), places=12)

    def test_sparse_strategies_send_pairs(self):
        S, d, m, n = 1_000_000, 0.01, 2, 2
        k = math.ceil(d * S)
        # a world ring: one rank of each node sends across, the other through loopback
        self.assertAlmostEqual(cost_model.exchange_s("topk", S, d, m, n, machine()), 3 * (A_I + 8 * k * B_I) + 3 * 8 * k * B_L / 2)
        ks = math.ceil(d * S / n)
        want = (A_L + 4 * S / n * B_L) + (A_I + 8 * ks * n * B_I) + (A_L + 8 * m * ks * B_L)
        self.assertAlmostEqual(cost_model.exchange_s("hitopk", S, d, m, n, machine()), want)

    def test_shared_cores_slow_cpu_work(self):
        # 4 processes on 4 cores, then on 2: the selection (1 ns per float) takes twice as long, at
        # its share of the cores
        own, shared = machine(cores=4), machine(cores=2)
        for mc in (own, shared):
            mc.sel, mc.c_l = {0.001: 1e-9}, 0.0
        t_own, busy_own, sel_own = cost_model.exchange_cost("topk", 1_000_000, 0.001, 2, 2, own)
        t_shared, busy_shared, sel_shared = cost_model.exchange_cost("topk", 1_000_000, 0.001, 2, 2, shared)
        self.assertAlmostEqual(sel_own, 1e-3)
        self.assertAlmostEqual(sel_shared, 2e-3)
        self.assertAlmostEqual(t_shared - t_own, 1e-3)
        self.assertAlmostEqual(busy_shared - busy_own, 1e-3)
        for mc in (own, shared):
            mc.sel_share = 0.75  # calibrated: the selections do not all run at once
        self.assertAlmostEqual(cost_model.exchange_cost("topk", 1_000_000, 0.001, 2, 2, shared)[2], 1.5e-3)
        self.assertAlmostEqual(cost_model.exchange_cost("topk", 1_000_000, 0.001, 2, 2, own)[2], 1e-3)  # never below one core

    def test_nothing_is_sent_before_the_selection_ends(self):
        # topk on a slow link, its selection and scatter-add taking time: the phases add up, where a
        # dense ring's copies hide behind its wire. Every float costs 1 ns to select, every pair 10 ns
        # to add; 2 x 2 ranks with a core each.
        S, d = 1_000_000, 0.01
        k = math.ceil(d * S)
        mc = machine(cores=4, hidden=1.0)
        mc.sel, mc.add, mc.c_l = {d: 1e-9}, 1e-8, 0.0
        select = S * 1e-9 + 2 * k * 1e-8  # top-k, packing the pairs and zeroing them in the residual
        ring = 3 * (A_I + 8 * k * B_I)
        scatter = 4 * k * 1e-8
        t, busy, sel = cost_model.exchange_cost("topk", S, d, 2, 2, mc)
        self.assertAlmostEqual(sel, select)
        self.assertAlmostEqual(busy, select + scatter)
        self.assertAlmostEqual(t, select + ring + scatter)

    def test_the_wire_or_the_cores_whichever_is_longer(self):
        # dense between 2 nodes x 2 ranks: the wire carries 6 steps of S/4 floats across each node's
        # link; each rank's CPU moves them half across (c_i), half through loopback (c_l)
        S = 1_000_000
        wire, work = 6 * (A_I + S * B_I), 6 * S * (5e-9 + 1e-9) / 2
        for hidden in (0.0, 0.5, 1.0):
            mc = machine(cores=2, hidden=hidden)
            mc.c_i, mc.c_l = 5e-9, 1e-9
            busy = 2 * work  # 4 processes on 2 cores
            self.assertGreater(wire, busy)
            t, b, _ = cost_model.exchange_cost("dense", S, 1, 2, 2, mc)
            self.assertAlmostEqual(b, busy)
            self.assertAlmostEqual(t, wire + (1 - hidden) * busy)
            mc.b_i = B_I / 100  # a fast link: the cores bound it, and nothing of the wire shows
            self.assertAlmostEqual(cost_model.exchange_s("dense", S, 1, 2, 2, mc),
                                   max(6 * (A_I + S * B_I / 100) + (1 - hidden) * busy, busy))

    def test_links_scale_the_wire_by_rate_and_take_the_cpu_from_the_fastest(self):
        def run(nodes, local, rate, size, ms):
            return {"bench": "cluster", "strategy": "dense", "density": 1, "nodes": nodes, "local": local,
                    "rate": rate, "size": size, "exchange_ms": ms}
        # t = 2 alpha + 4S beta: 1gbit's wire 8 ns per byte, alpha 100 us; 10gbit CPU-bound at 1.2 ns;
        # loopback 0.8 ns, alpha 50 us
        rows = [run(2, 1, "1gbit", s, 0.2 + 4 * s * 8e-6) for s in (1000, 10**6, 10**7)]
        rows += [run(2, 1, "10gbit", s, 0.2 + 4 * s * 1.2e-6) for s in (1000, 10**6, 10**7)]
        rows += [run(1, 2, "1gbit", s, 0.1 + 4 * s * 0.8e-6) for s in (1000, 10**6, 10**7)]
        links = cost_model.Links(rows)
        self.assertAlmostEqual(links.inter["1gbit"][0], 1e-4, places=6)
        self.assertAlmostEqual(links.inter["1gbit"][1], 8e-9, places=12)
        self.assertAlmostEqual(links.inter["10gbit"][1], 8e-10, places=12)
        self.assertAlmostEqual(links.cpu_inter, 1.2e-9, places=12)
        self.assertAlmostEqual(links.intra[0], 5e-5, places=7)
        self.assertAlmostEqual(links.intra[1], 0.8e-9, places=12)


class StepTest(unittest.TestCase):
    def test_buckets_hold_every_parameter_last_layer_first(self):
        b = cost_model.buckets("cnn25m")
        self.assertEqual(sum(size for size, _ in b), 25201546)
        self.assertEqual([round(r, 6) for _, r in b], sorted(round(r, 6) for _, r in b))
        self.assertAlmostEqual(b[-1][1], 1.0)

    def test_the_layers_are_the_cpp_models(self):
        # torchvision's resnet50: 25,557,032 parameters, 4.1 G multiply-adds at 224 x 224
        self.assertEqual(sum(p for p, _ in cost_model.layers("resnet50", 224)), 25557032)
        self.assertAlmostEqual(cost_model.forward_flops("resnet50", 224) / 2e9, 4.1, delta=0.05)
        # the benchmark's 64 x 64: the same parameters, (64 / 224)^2 of the convolutions' FLOPs
        self.assertEqual(sum(p for p, _ in cost_model.layers("resnet50")), 25557032)
        self.assertLess(cost_model.forward_flops("resnet50"), cost_model.forward_flops("resnet50", 224) / 12)
        # the Transformer's output is tied to the token embedding: FLOPs, no parameters of its own
        self.assertEqual(cost_model.layers("transformer")[-1][0], 0)
        self.assertGreater(cost_model.layers("transformer")[-1][1], 0)
        with self.assertRaisesRegex(ValueError, "--model"):
            cost_model.layers("cnn25")

    def test_overlap_hides_at_most_the_backward_pass(self):
        mc = machine()
        seq, exp_seq, total = cost_model.step_time("cosmoflow", "dense", 1, 2, 1, mc, 0.3, 0.0, False)
        ovl, exp_ovl, _ = cost_model.step_time("cosmoflow", "dense", 1, 2, 1, mc, 0.3, 0.0, True)
        self.assertAlmostEqual(seq, 0.3 + total)
        self.assertAlmostEqual(exp_seq, total)
        self.assertLess(ovl, seq)
        self.assertGreaterEqual(ovl, seq - 0.3 * 2 / 3 - 1e-12)

    def test_an_overlapped_cpu_bound_exchange_holds_the_cores_for_its_busy_share(self):
        mc = machine(cores=2, hidden=1.0)
        mc.c_i = B_I  # 4 processes on 2 cores: the CPU work twice the wire time
        seq = cost_model.step_time("cosmoflow", "dense", 1, 4, 1, mc, 0.3, 0.0, False)[0]
        self.assertAlmostEqual(cost_model.step_time("cosmoflow", "dense", 1, 4, 1, mc, 0.3, 0.0, True)[0], seq)
        mc.busy_share = 0.5
        self.assertAlmostEqual(cost_model.step_time("cosmoflow", "dense", 1, 4, 1, mc, 0.3, 0.0, False)[0], seq)
        ovl = cost_model.step_time("cosmoflow", "dense", 1, 4, 1, mc, 0.3, 0.0, True)[0]
        # the exchange (about 1.1 s) runs beside nearly all of the backward pass (0.2 s)
        self.assertLess(ovl, seq - 0.9 * 0.3 * 2 / 3)


def load(rows, fastest=False):
    """results.load of these rows, written as JSON lines to a file of their own."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    try:
        return results.load(f.name, fastest)
    finally:
        os.unlink(f.name)


class CalibrationTest(unittest.TestCase):
    def test_the_rest_is_each_workloads_weighted_excess_and_never_negative(self):
        # workload a: steps 0.05 s beyond their exchange, weighted 1 and 3 (0.02 and 0.06); b: below it
        pts = [("a", 0.02 + 0.4, 0.4, 1.0), ("a", 0.06 + 1.5, 1.5, 3.0), ("b", 0.3, 0.4, 1.0)]
        rests = cost_model.fit_rests(pts)
        self.assertAlmostEqual(rests["a"][0], 0.05)
        self.assertAlmostEqual(rests["b"][0], 0.0)
        self.assertAlmostEqual(rests["b"][1], -0.1)

    def test_solve_finds_where_a_monotonic_function_meets_its_target(self):
        self.assertAlmostEqual(cost_model.solve(lambda x: 2 * x + 1, 2.0, 0.0, 1.0), 0.5)
        self.assertAlmostEqual(cost_model.solve(lambda x: 1 / x, 4.0, 0.05, 1.0), 0.25)
        # out of reach: the nearer end
        self.assertAlmostEqual(cost_model.solve(lambda x: 1 / x, 0.5, 0.05, 1.0), 1.0)
        self.assertAlmostEqual(cost_model.solve(lambda x: x, -1.0, 0.5, 1.5), 0.5)

    def test_without_overlap_the_step_is_compute_rest_and_every_exchange(self):
        mc = machine()
        step, exposed, total = cost_model.step_time("cnn25m", "dense", 1, 2, 1, mc, 0.3, 0.02, False)
        self.assertAlmostEqual(exposed, total)
        self.assertAlmostEqual(total, sum(cost_model.exchange_s("dense", b, 1, 2, 1, mc) for b, _ in cost_model.buckets("cnn25m")))
        self.assertAlmostEqual(step, 0.3 + 0.02 + total)


class ResultsTest(unittest.TestCase):
    def test_placements_of_the_same_ranks_are_one_workload(self):
        def run(model, nodes, local, batch):
            return {"model": model, "nodes": nodes, "local": local, "batch": batch}
        self.assertEqual(results.workload(run("resnet50", 2, 2, 16)), results.workload(run("resnet50", 4, 1, 16)))
        self.assertNotEqual(results.workload(run("cosmoflow", 2, 1, 64)), results.workload(run("cosmoflow", 2, 2, 16)))
        self.assertNotEqual(results.workload(run("cosmoflow", 2, 2, 16)), results.workload(run("cosmoflow", 2, 2, 32)))
        self.assertNotEqual(results.workload(run("resnet50", 2, 2, 16)), results.workload(run("transformer", 2, 2, 16)))

    def test_a_repeated_configuration_is_its_median_run(self):
        rows = [{"bench": "cluster", "strategy": "dense", "exchange_ms": v, "bytes_inter": 1} for v in (30, 10, 20)]
        rows.append({"bench": "cluster", "strategy": "topk", "exchange_ms": 5, "bytes_inter": 1})
        got = load(rows)
        self.assertEqual([(r["strategy"], r["exchange_ms"], r["repeats"]) for r in got], [("dense", 20, 3), ("topk", 5, 1)])
        # the links' calibration takes each configuration's fastest run
        got = load(rows, fastest=True)
        self.assertEqual([(r["strategy"], r["exchange_ms"], r["repeats"]) for r in got], [("dense", 10, 3), ("topk", 5, 1)])

    def test_repeated_selection_runs_are_one_configuration_per_density(self):
        def run(density, mstopk, pass_ms):
            return {"bench": "topk", "size": 1000, "density": density, "k": 10, "repeat": 5, "mstopk_ms": mstopk,
                    "pass_ms": pass_ms, "nth_element_ms": 9.0, "candidates": 40 + mstopk, "exact": True}
        rows = [run(0.01, 3.0, 1.0), run(0.01, 1.0, 2.0), run(0.001, 0.5, 1.5), run(0.01, 2.0, 3.0)]
        got = load(rows)
        # the median run by selection time keeps its own pass time
        self.assertEqual([(r["density"], r["mstopk_ms"], r["pass_ms"], r["repeats"]) for r in got],
                         [(0.01, 2.0, 3.0, 3), (0.001, 0.5, 1.5, 1)])

    def test_the_large_bucket_is_apart_from_the_exchange_comparison(self):
        def run(size, density, ms, select_ms=None):
            r = {"bench": "cluster", "strategy": "topk", "size": size, "density": density, "exchange_ms": ms}
            if select_ms is not None:
                r["select_ms"] = select_ms
            return r
        # the selection time is a measurement: runs with and without it are one configuration
        rows = load([run(25600000, 0.001, 40), run(results.BUCKET, 0.01, 75, 30), run(results.BUCKET, 0.01, 80, 35),
                     run(2500, 1, 0.3)])
        self.assertEqual([r["exchange_ms"] for r in results.exchanges(rows)], [40])
        self.assertEqual([(r["exchange_ms"], r["repeats"]) for r in results.exchanges(rows, bucket=True)], [(75, 2)])

    def test_time_to_loss_runs_group_by_schedule_and_keep_every_seed(self):
        def run(strategy, seed, losses):
            return {"bench": "cluster-train", "peer": "tessera", "model": "cosmoflow", "batch": 16, "strategy": strategy, "seed": seed,
                    "step_ms": 1.0, "epochs": [{"epoch": i, "seconds": 2.0 * (i + 1), "val_loss": v} for i, v in enumerate(losses)]}
        rows = [run("hybrid", 2, [0.4, 0.3]), run("hybrid", 1, [0.4, 0.2, 0.1]), run("dense", 1, [0.3, 0.2]),
                run("hybrid", 1, [0.5, 0.3])]
        groups = results.time_to_loss(load(rows))
        self.assertEqual({k: [r["seed"] for r in g] for k, g in groups.items()},
                         {"dense, 2 epochs": [1], "hybrid, 2 epochs": [1, 2], "hybrid, 3 epochs": [1]})
        self.assertEqual(list(groups)[0], "dense, 2 epochs")
        self.assertEqual(results.reached(groups["hybrid, 3 epochs"][0], 0.2), 4.0)
        self.assertIsNone(results.reached(groups["hybrid, 2 epochs"][0], 0.2))


if __name__ == "__main__":
    unittest.main()
