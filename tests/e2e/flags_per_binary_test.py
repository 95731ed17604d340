#!/usr/bin/env python3
"""Every flag of every binary rejects out-of-range, overflowing, negative and non-finite values with
the flag's name, the value and the range, and exits with status 2 (a configuration error); an
unknown flag is named too. One table per binary; each row runs the binary once.

  flags_per_binary_test.py --bin BUILD/bin
"""
import argparse
import os
import subprocess
import sys
import tempfile

BIG = "99999999999999999999"  # past int64
WRAPS = "4294967296"          # 2^32: 0 once cut to 32 bits


def table(job):
    """binary -> [(args, environment, expected substrings)]"""
    run = ["run", job]
    gen = ["data", "generate", "--kind", "cosmoflow", "--out", "/nonexistent/x"]
    read = ["data", "read", job, "--out", "/nonexistent/x"]
    return {
        "tessera": [
            (run + ["--nodes", WRAPS], {}, ["--nodes", WRAPS, "[1, 4096]"]),
            (run + ["--nodes", "-1"], {}, ["--nodes", "'-1'", "[1, 4096]"]),
            (run + ["--gpus-per-node", BIG], {}, ["--gpus-per-node", BIG, "[1, 1024]"]),
            (run + ["--progress", "-2"], {}, ["--progress", "'-2'", "(0, 86400]"]),
            (run + ["--progress", "nan"], {}, ["--progress", "'nan'", "finite"]),
            (run + ["--progress", "inf"], {}, ["--progress", "'inf'", "finite"]),
            (run + ["--bogus"], {}, ["--bogus", "unknown flag"]),
            (["plan", job, "--nodes", WRAPS], {}, ["--nodes", WRAPS, "[1, 1048576]"]),
            (["plan", job, "--gpus-per-node", "0"], {}, ["--gpus-per-node", "'0'", "[1, 1024]"]),
            (["plan", job, "--compute-ms", "-5"], {}, ["--compute-ms", "'-5'", "(0, inf)"]),
            (["plan", job, "--compute-ms", "nan"], {}, ["--compute-ms", "'nan'", "finite"]),
            (gen + ["--samples", "0", "--size", "8"], {}, ["--samples", "'0'", "[1, 1000000000]"]),
            (gen + ["--samples", "2", "--size", WRAPS], {}, ["--size", WRAPS, "[4, 4096]"]),
            (gen + ["--samples", "2", "--size", "8", "--seed", "-1"], {}, ["--seed", "'-1'", "at least 0"]),
            (gen + ["--samples", "2", "--size", "8", "--seed", BIG], {}, ["--seed", BIG, "at least 0"]),
            (gen + ["--samples", "2", "--size", "8", "--classes", "11"], {}, ["--classes", "'11'", "[2, 10]"]),
            (read + ["--sample", "0", "--epoch", "-1"], {}, ["--epoch", "'-1'", "[0, 1073741824]"]),
            (["data", "index", "/nonexistent", "--progress", "-3"], {}, ["--progress", "'-3'", "[0, 86400]"]),
            (["data", "index", "/nonexistent", "--progress", "nan"], {}, ["--progress", "'nan'", "finite"]),
            (read + ["--sample", "-1"], {}, ["--sample", "'-1'", "at least 0"]),
            (read + ["--sample", "0", "--rank", "70000"], {}, ["--rank", "'70000'", "[0, 65535]"]),
        ],
        "tessera-worker": [
            (["--config", job, "--threads", "0"], {}, ["--threads", "'0'", "[1, 1024]"]),
            (["--config", job, "--threads", BIG], {}, ["--threads", BIG, "[1, 1024]"]),
            (["--config", job, "--rank", "-1"], {}, ["--rank", "'-1'", "[0, 65535]"]),
            (["--config", job, "--world-size", WRAPS], {}, ["--world-size", WRAPS, "[1, 65536]"]),
            (["--config", job, "--local-rank", "1.5"], {}, ["--local-rank", "'1.5'", "whole number"]),
            (["--config", job, "--replica", "-7"], {}, ["--replica", "'-7'", "[0, 65535]"]),
            (["--config", job, "--slot", "2048"], {}, ["--slot", "'2048'", "[0, 1023]"]),
            (["--config", job, "--slots", "0"], {}, ["--slots", "'0'", "[1, 1024]"]),
            (["--config", job], {"TESSERA_RANK": WRAPS}, ["TESSERA_RANK", WRAPS, "[0, 65535]"]),
            (["--config", job], {"TESSERA_WORLD_SIZE": "nan"}, ["TESSERA_WORLD_SIZE", "'nan'", "whole number"]),
            (["--config", job, "--frobnicate"], {}, ["--frobnicate", "unknown flag"]),
        ],
        "tessera-controller": [
            (["--status-interval", "nan"], {}, ["--status-interval", "'nan'", "finite"]),
            (["--status-interval", "-1"], {}, ["--status-interval", "'-1'", "[0.001, 86400]"]),
            (["--status-interval", "inf"], {}, ["--status-interval", "'inf'", "finite"]),
            (["--workers", "0"], {}, ["--workers", "'0'", "[1, 64]"]),
            (["--workers=" + WRAPS], {}, ["--workers", WRAPS, "[1, 64]"]),
            (["--bogus"], {}, ["--bogus", "unknown flag"]),
        ],
        "tessera-simulated-nodes": [
            (["--nodes", "-1"], {}, ["--nodes", "'-1'", "[0, 100000]"]),
            (["--gpus", WRAPS], {}, ["--gpus", WRAPS, "[0, 1024]"]),
            (["--zones", "0"], {}, ["--zones", "'0'", "[1, 1024]"]),
            (["--memory", BIG], {}, ["--memory", BIG, "at least 0"]),
        ],
        "tessera-bench": [
            (["topk", "--size", "-1"], {}, ["--size", "'-1'", "[1, 4294967296]"]),
            (["topk", "--density", "nan"], {}, ["--density", "'nan'", "finite"]),
            (["topk", "--density", "1.5"], {}, ["--density", "'1.5'", "(0, 1]"]),
            (["exchange", "--nodes", WRAPS], {}, ["--nodes", WRAPS, "[1, 64]"]),
            (["exchange", "--iters", "0"], {}, ["--iters", "'0'", "[1, 100000]"]),
            (["cluster-train", "--lr", "-0.1"], {}, ["--lr", "'-0.1'", "(0, inf)"]),
            (["cluster-train", "--seed", "0"], {}, ["--seed", "'0'", "at least 1"]),
            (["cluster-train", "--cut-at", "0"], {}, ["--cut-at", "'0'", "[1, 1000000]"]),
            (["cluster-train", "--cut-at", "4", "--cut-rate", "fast"], {}, ["--cut-rate", "'fast'", "not a link rate"]),
            (["cluster-train", "--cut-at", "4"], {}, ["--cut-rate", "go together"]),
            (["cluster-train", "--measure-from", "9", "--measure-to", "3"], {}, ["--measure-to", "A < B"]),
            (["cluster-train", "--momentum-correction", "maybe"], {}, ["--momentum-correction", "'maybe'", "on or off"]),
            (["cluster-train", "--model", "transformer", "--strategy", "hitopk", "--momentum-correction", "on"], {},
             ["--momentum-correction", "SGD with momentum", "adamw"]),
            (["cluster-train", "--model", "resnet50", "--strategy", "torus", "--momentum-correction", "on"], {},
             ["--momentum-correction", "no effect with strategy torus"]),
            (["train", "--threads", BIG], {}, ["--threads", BIG, "[1, 1024]"]),
            (["spatial", "--size", "2"], {}, ["--size", "'2'", "[8, 4096]"]),
            (["cache", "--remote-mbps", "inf"], {}, ["--remote-mbps", "'inf'", "finite"]),
            (["images", "--images", "5"], {}, ["--images", "'5'", "[10, 1000000]"]),
            (["placement", "--workers", "-5"], {}, ["--workers", "'-5'", "[1, 1000000]"]),
            (["controller", "--timeout", "nan"], {}, ["--timeout", "'nan'", "finite"]),
            (["metrics", "--scrape-ms", "0"], {}, ["--scrape-ms", "'0'", "[1, 3600000]"]),
            (["demo", "--local", "-2"], {}, ["--local", "'-2'", "[1, 64]"]),
            (["topk", "--frobnicate", "1"], {}, ["--frobnicate", "unknown flag"]),
        ],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    failures, rows = [], 0
    with tempfile.TemporaryDirectory(prefix="tessera-flags-") as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write("apiVersion: tessera.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: f}\n"
                    "spec: {dataset: {format: synthetic}}\n")
        for binary, rows_of in table(job).items():
            path = os.path.join(args.bin, binary)
            if not os.path.exists(path):
                if binary == "tessera-bench":  # built only with TESSERA_BUILD_BENCH
                    print(f"SKIP {binary}: not built")
                    continue
                sys.exit(f"flags_test: {path} is missing")
            for argv, env, expected in rows_of:
                rows += 1
                r = subprocess.run([path] + argv, env=dict(os.environ, **env), capture_output=True, text=True, timeout=60,
                                   cwd=tmp)
                said = r.stdout + r.stderr
                missing = [e for e in expected if e not in said]
                if r.returncode != 2 or missing:
                    failures.append(f"{binary} {' '.join(argv)} {env or ''}: status {r.returncode}, "
                                    f"missing {missing}: {said.strip()[:300]}")
    for f in failures:
        print("FAIL", f)
    print(f"flags_test: {rows - len(failures)} of {rows} rows rejected with the flag, the value and the range")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
