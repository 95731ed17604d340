#!/usr/bin/env python3
"""Datasets as users already have them, written with h5py and numpy (Debian's python3-h5py and
python3-numpy), not with Tessera: each sample layout is indexed by `tessera data index`, the blocks that
the ranks of a spatial-2 job read (`tessera data read`) equal slices of the whole file read with
h5py or numpy, and a short job trains on it end to end through `tessera run`; token files as
nanoGPT writes them (no index: their layout is fixed) train a Transformer the same way. Every bad input gets
an error naming the file and the problem, and a failed index leaves no manifest behind.

usage: dataset_files_test.py --bin BUILD/bin [unittest args]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import zlib

import h5py
import numpy as np

BIN = ""
TIMEOUT = 240  # seconds for any one command


def tessera(*args, cwd=None):
    p = subprocess.run([os.path.join(BIN, "tessera"), *args], cwd=cwd, capture_output=True, text=True,
                       timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def counts(rng, shape):
    return rng.poisson(3.0, size=shape).astype(np.int16)


def write_cosmo(path, full, targets, input_key="full", target_key="unitPar", **filters):
    with h5py.File(path, "w") as f:
        f.create_dataset(input_key, data=full, chunks=True, compression="gzip", **filters)
        f.create_dataset(target_key, data=np.asarray(targets, dtype=np.float32))


def write_unet(path, volume, labels):
    with h5py.File(path, "w") as f:
        f.create_dataset("volume", data=volume)
        f.create_dataset("segmentation", data=labels)


def shapes_volume(rng, w):
    """A (D, H, W) float volume with a bright box labelled 1 and a dim ball labelled 2, in noise."""
    v = rng.normal(0.0, 0.3, size=(w, w, w)).astype(np.float32)
    y = np.zeros((w, w, w), dtype=np.uint8)
    a = rng.integers(0, w // 2)
    y[a:a + w // 3, a:a + w // 3, a:a + w // 3] = 1
    z, yy, x = np.mgrid[:w, :w, :w]
    c = rng.integers(w // 3, 2 * w // 3, size=3)
    ball = (z - c[0]) ** 2 + (yy - c[1]) ** 2 + (x - c[2]) ** 2 < (w / 5) ** 2
    y[ball] = 2
    v[y == 1] += 2.0
    v[y == 2] += 1.0
    return v, y


class DatasetFilesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tessera-files-")
        self.rng = np.random.default_rng(7)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *parts):
        p = os.path.join(self.dir, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p

    def job(self, name, model, dataset, spatial=2, batch=2, outputs=None):
        model_fields = dict(model)
        if outputs:
            model_fields["outputs"] = outputs
        text = "\n".join([
            "apiVersion: tessera.dev/v1alpha1", "kind: TrainingJob", "metadata: {name: %s}" % name, "spec:",
            "  replicas: 1", "  ranksPerReplica: %d" % spatial,
            "  model: " + json.dumps(model_fields),
            "  dataset: " + json.dumps(dataset),
            "  training: {epochs: 1, batchSize: %d, optimizer: {name: adam, learningRate: 0.001}, threads: 1}" % batch,
            "  parallelism: {spatial: {d: %d}}" % spatial,
            "  local: {nodes: 1, gpusPerNode: %d}" % spatial, ""])
        path = self.path(name + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def index(self, data_dir, *flags):
        rc, out, err = tessera("data", "index", data_dir, *flags)
        self.assertEqual(rc, 0, out + err)
        return out

    def index_fails(self, data_dir, *expected, flags=()):
        rc, out, err = tessera("data", "index", data_dir, *flags)
        self.assertNotEqual(rc, 0, out)
        for e in expected:
            self.assertIn(e, err)
        self.assertFalse(os.path.exists(os.path.join(data_dir, "manifest.tsv")), "a failed index wrote a manifest")
        return err

    def read_block(self, job, sample, rank):
        prefix = self.path("blocks", "s%d-r%d" % (sample, rank))
        rc, out, err = tessera("data", "read", job, "--sample", str(sample), "--rank", str(rank), "--out", prefix)
        self.assertEqual(rc, 0, out + err)
        return np.load(prefix + "_x.npy"), np.load(prefix + "_y.npy")

    def check_blocks(self, job, samples, expected):
        """expected(sample) -> (input (C, D, H, W) transformed, target): rank r of 2 reads half r of D."""
        for s in samples:
            x, y = expected(s)
            d = x.shape[1]
            for rank in (0, 1):
                bx, by = self.read_block(job, s, rank)
                part = slice(rank * d // 2, (rank + 1) * d // 2)
                np.testing.assert_allclose(bx, x[:, part], rtol=1e-5, atol=1e-5, err_msg="sample %d rank %d" % (s, rank))
                want_y = y[part] if y.ndim == 3 else y
                np.testing.assert_array_equal(by, want_y.astype(np.float32))

    def train(self, job):
        work = self.path("work", os.path.basename(job))
        rc, out, err = tessera("run", job, "--work-dir", work, "--progress", "30")
        self.assertEqual(rc, 0, out + err)
        with open(os.path.join(work, "status.json")) as f:
            status = json.load(f)["status"]
        self.assertEqual(status["phase"], "Succeeded", status)
        return out + err

    def run_fails(self, job, *expected):
        work = self.path("work", os.path.basename(job))
        rc, out, err = tessera("run", job, "--work-dir", work)
        self.assertNotEqual(rc, 0, out + err)
        for e in expected:
            self.assertIn(e, out + err)

    # ---- the layouts

    def test_lbann_cosmoflow_channels_first_int16_and_float32(self):
        d = self.path("lbann", "x")[:-2]
        files = []
        for i in range(6):
            full, t = counts(self.rng, (4, 16, 16, 16)), self.rng.uniform(-1, 1, 4)
            # nested directories are indexed too, in sorted order
            p = self.path("lbann", "part%d" % (i // 3), "univ_%03d.hdf5" % i)
            write_cosmo(p, full, t)
            files.append((full, t))
        rc, out, err = tessera("data", "index", d, "--progress", "0")
        self.assertEqual(rc, 0, out + err)
        self.assertIn("layout cosmo, full int16 [4, 16, 16, 16], unitPar float32 [4], transform log1p", out)
        self.assertIn("indexed 5/6 (", err)  # progress, here after every file
        job = self.job("lbann", {"name": "cosmoflow", "inputSize": 16, "baseChannels": 2, "hidden": [8]},
                       {"format": "hdf5", "path": d, "validationSplit": 0.34})
        self.check_blocks(job, [0, 4], lambda s: (np.log1p(files[s][0].astype(np.float32)), files[s][1]))
        self.assertEqual(tessera("data", "verify", d)[0], 0)
        self.train(job)
        # float32 densities: the same layout (here also shuffled and checksummed, as h5py can write it)
        f32 = self.path("lbann32", "x")[:-2]
        vol = self.rng.gamma(2.0, 1.5, size=(4, 16, 16, 16)).astype(np.float32)
        for i in range(2):
            write_cosmo(os.path.join(f32, "u%d.h5" % i), vol * (i + 1), [0.1, 0.2, 0.3, 0.4], shuffle=True, fletcher32=True)
        self.assertIn("full float32 [4, 16, 16, 16]", self.index(f32))
        job32 = self.job("lbann32", {"name": "cosmoflow", "inputSize": 16, "baseChannels": 2, "hidden": [8]},
                         {"format": "hdf5", "path": f32})
        self.check_blocks(job32, [1], lambda s: (np.log1p(vol * 2), np.array([0.1, 0.2, 0.3, 0.4])))

    def test_cosmo_universe_channels_last_crops_to_sub_volumes(self):
        # one 64^3 x 4 file, channels last, as the cosmoUniverse simulations store them; inputSize 32
        d = self.path("universe", "x")[:-2]
        full = counts(self.rng, (64, 64, 64, 4))
        write_cosmo(os.path.join(d, "univ_ics_2019-03_a10000668_000.hdf5"), full, [0.3, -0.2, 0.5, 0.1])
        out = self.index(d)
        self.assertIn("layout cosmo-channels-last, full int16 [64, 64, 64, 4]", out)
        model = {"name": "cosmoflow", "inputSize": 32, "baseChannels": 2, "hidden": [8]}
        job = self.job("universe", model, {"format": "hdf5", "path": d, "crop": True})
        # without crop, the job is told what fits
        self.run_fails(self.job("universe-nocrop", model, {"format": "hdf5", "path": d}),
                       "spec.model.inputSize", "set inputSize: 64, or spec.dataset.crop: true to train on the 8 sub-volumes")

        def sub(s):
            z, y, x = s // 4, (s // 2) % 2, s % 2
            block = full[32 * z:32 * z + 32, 32 * y:32 * y + 32, 32 * x:32 * x + 32, :]
            return np.log1p(np.moveaxis(block, -1, 0).astype(np.float32)), np.array([0.3, -0.2, 0.5, 0.1])

        self.check_blocks(job, range(8), sub)
        rc, out, err = tessera("data", "read", job, "--sample", "8", "--out", self.path("past"))
        self.assertEqual(rc, 2)
        self.assertIn("8 is past the 8 samples", err)
        self.train(job)

    def test_unet_hdf5_volume_and_uint8_segmentation(self):
        d = self.path("unet", "x")[:-2]
        cases = []
        for i in range(4):
            v, y = shapes_volume(self.rng, 16)
            if i % 2:
                write_unet(os.path.join(d, "case_%d.h5" % i), v[None], y)  # (C, D, H, W) is the same layout
            else:
                write_unet(os.path.join(d, "case_%d.h5" % i), v, y)
            cases.append((v, y))
        # the shapes differ ((16,16,16) against (1,16,16,16)): the index names the file
        self.index_fails(d, "case_1.h5", "every sample of a dataset has the same shape")
        for i in (1, 3):
            write_unet(os.path.join(d, "case_%d.h5" % i), cases[i][0], cases[i][1])
        out = self.index(d, "--transform", "standardize")
        self.assertIn("layout unet, volume float32 [16, 16, 16], segmentation uint8 [16, 16, 16], transform standardize, 3 classes", out)
        job = self.job("unet", {"name": "unet3d", "inputSize": 16, "baseChannels": 2},
                       {"format": "hdf5", "path": d, "validationSplit": 0.25})

        def standardized(s):
            v, y = cases[s]
            return ((v - v.mean()) / v.std())[None], y

        self.check_blocks(job, range(4), standardized)
        self.train(job)

    def test_mlperf_unet_npy_pairs(self):
        d = self.path("kits", "x")[:-2]
        cases = []
        for i in range(4):
            v, y = shapes_volume(self.rng, 16)
            np.save(os.path.join(d, "case_%05d_x.npy" % i), v[None])
            np.save(os.path.join(d, "case_%05d_y.npy" % i), y[None])
            cases.append((v, y))
        out = self.index(d)
        self.assertIn("layout unet-npy, .npy float32 [1, 16, 16, 16], .npy uint8 [1, 16, 16, 16], transform none", out)
        job = self.job("kits", {"name": "unet3d", "inputSize": 16, "baseChannels": 2},
                       {"format": "hdf5", "path": d, "validationSplit": 0.25})
        self.check_blocks(job, range(4), lambda s: (cases[s][0][None], cases[s][1]))
        self.train(job)
        # a volume without its labels
        os.remove(os.path.join(d, "case_00002_y.npy"))
        os.remove(os.path.join(d, "manifest.tsv"))
        self.index_fails(d, "case_00002_x.npy' has no labels", "case_00002_y.npy' is missing")

    def token_job(self, name, path, vocab, token_bytes=2):
        return self.job(name, {"name": "transformer", "context": 16, "width": 16, "depth": 1, "heads": 2},
                        {"format": "tokens", "path": path, "vocabSize": vocab, "tokenBytes": token_bytes, "samples": 32,
                         "validationSamples": 8}, spatial=1)

    def test_nanogpt_token_files_uint16_and_uint32(self):
        # English text from Debian's fortunes package as byte ids, written as nanoGPT's prepare scripts
        # write them (numpy's tofile, no header); uint32 ids shifted past 2^16 with a vocabulary to match.
        with open("/usr/share/games/fortunes/fortunes", "rb") as f:
            ids = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
        cut = len(ids) * 9 // 10
        for dtype, offset in ((np.uint16, 0), (np.uint32, 70000)):
            name = np.dtype(dtype).name
            d = self.path("tokens-" + name, "x")[:-2]
            (ids[:cut] + offset).astype(dtype).tofile(os.path.join(d, "train.bin"))
            (ids[cut:] + offset).astype(dtype).tofile(os.path.join(d, "val.bin"))
            out = self.train(self.token_job("tokens-" + name, d, 256 + offset, np.dtype(dtype).itemsize))
            self.assertIn("validation loss", out)

    def test_index_checks_token_files_and_records_them(self):
        # nanoGPT's GPT-2 files: uint16 ids below 50257, no meta.json beside them
        d = self.path("gpt2", "x")[:-2]
        np.array([1, 2, 50000, 3] * 50, dtype=np.uint16).tofile(os.path.join(d, "train.bin"))
        np.array([7, 8, 9] * 20, dtype=np.uint16).tofile(os.path.join(d, "val.bin"))
        rc, out, err = tessera("data", "index", d)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--vocab-size: required for the token files", err)
        rc, out, err = tessera("data", "index", d, "--vocab-size", "1000")
        self.assertNotEqual(rc, 0, out)
        self.assertIn("train.bin: token 2 is id 50000, not below the vocabulary size 1000", err)
        out = self.index(d, "--vocab-size", "50257")
        self.assertIn("train.bin 200 tokens, val.bin 60", out)
        self.assertIn("vocabSize: 50257, tokenBytes: 2", out)
        with open(os.path.join(d, "meta.json")) as f:
            meta = json.load(f)
        self.assertEqual((meta["vocabSize"], meta["dtype"], meta["trainTokens"], meta["valTokens"]), (50257, "uint16", 200, 60))
        self.index(d)  # meta.json gives the vocabulary now
        os.remove(os.path.join(d, "val.bin"))
        rc, out, err = tessera("data", "index", d)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("has train.bin but no val.bin", err)

    def test_index_of_an_image_folders_split_names_its_parent(self):
        d = self.path("shapes", "x")[:-2]
        rc, out, err = tessera("data", "generate", "--kind", "images", "--samples", "60", "--size", "16", "--classes", "3", "--out", d,
                               "--replace")
        self.assertEqual(rc, 0, out + err)
        for split in ("train", "val/"):
            err = self.index_fails(os.path.join(d, split), "is one split of an ImageFolder", "`tessera data index %s`" % d)

    def test_bad_token_files_are_named_with_the_problem(self):
        def fresh(name, train, val=np.arange(100) % 256):
            d = self.path(name, "x")[:-2]
            np.asarray(train).astype(np.uint16).tofile(os.path.join(d, "train.bin"))
            if val is not None:
                np.asarray(val).astype(np.uint16).tofile(os.path.join(d, "val.bin"))
            return d

        text = np.arange(200) % 256
        d = fresh("odd", text)
        with open(os.path.join(d, "train.bin"), "ab") as f:
            f.write(b"\x01")
        self.run_fails(self.token_job("odd", d, 256), "train.bin", "401 bytes is not a whole number of 2-byte tokens")
        d = fresh("over", np.concatenate([text, [300]]))
        self.run_fails(self.token_job("over", d, 256), "train.bin", "token 200 is id 300, not below the vocabulary size 256")
        d = fresh("short", text[:10])
        self.run_fails(self.token_job("short", d, 256), "train.bin", "holds 10 tokens; a window of context 16 needs at least 17")
        d = fresh("noval", text, val=None)
        self.run_fails(self.token_job("noval", d, 256), "val.bin")

    def test_dataset_names_are_configurable(self):
        d = self.path("named", "x")[:-2]
        for i in range(4):
            write_cosmo(os.path.join(d, "s%d.h5" % i), counts(self.rng, (4, 8, 8, 8)), [0, 0, 0, i / 4],
                        input_key="density", target_key="params")
        err = self.index_fails(d, "has no dataset 'full' or 'volume'", "'density' int16 [4, 8, 8, 8]", "--input-key")
        self.index(d, "--input-key", "density", "--target-key", "params")
        model = {"name": "cosmoflow", "inputSize": 8, "baseChannels": 2, "hidden": [8]}
        ok = self.job("named", model, {"format": "hdf5", "path": d, "inputKey": "density", "targetKey": "params"})
        self.check_blocks(ok, [3], lambda s: self._named_expected(d, s))
        self.train(ok)
        self.run_fails(self.job("named-wrong", model, {"format": "hdf5", "path": d, "inputKey": "full"}),
                       "spec.dataset.inputKey", "was indexed with 'density'", "--input-key full")

    def _named_expected(self, d, s):
        with h5py.File(os.path.join(d, "s%d.h5" % s)) as f:
            return np.log1p(f["density"][...].astype(np.float32)), f["params"][...]

    # ---- bad input

    def test_bad_files_are_named_with_the_problem(self):
        def fresh(name, n=3, shape=(4, 8, 8, 8), targets=4):
            d = self.path(name, "x")[:-2]
            for i in range(n):
                write_cosmo(os.path.join(d, "s%d.h5" % i), counts(self.rng, shape), np.zeros(targets))
            return d

        d = fresh("shape")
        write_cosmo(os.path.join(d, "s1.h5"), counts(self.rng, (4, 8, 8, 4)), np.zeros(4))
        self.index_fails(d, "s1.h5' dataset 'full' is int16 [4, 8, 8, 4] but the first sample's (s0.h5) is int16 [4, 8, 8, 8]")

        d = fresh("targets")
        write_cosmo(os.path.join(d, "s2.h5"), counts(self.rng, (4, 8, 8, 8)), np.zeros(3))
        self.index_fails(d, "s2.h5' dataset 'unitPar' is float32 [3]", "the first sample's (s0.h5) is float32 [4]")

        d = fresh("truncated")
        p = os.path.join(d, "s1.h5")
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(size // 2)
        self.index_fails(d, "s1.h5': cannot open as HDF5")

        d = fresh("text")
        with open(os.path.join(d, "s0.h5"), "w") as f:
            f.write("not an HDF5 file\n")
        self.index_fails(d, "s0.h5': cannot open as HDF5")

        d = self.path("nan", "x")[:-2]
        for i in range(2):
            v = self.rng.gamma(2.0, 1.0, size=(4, 8, 8, 8)).astype(np.float32)
            if i == 1:
                v[2, 3, 4, 5] = np.nan
            write_cosmo(os.path.join(d, "s%d.h5" % i), v, np.zeros(4))
        self.index_fails(d, "s1.h5' dataset 'full' holds NaN or infinite values")

        # a 3-byte integer volume (HDF5 would convert it; a malformed size overran its buffers)
        d = fresh("odd-type", n=2)
        with h5py.File(os.path.join(d, "s1.h5"), "r+") as f:
            del f["full"]
            odd = h5py.h5t.STD_I32LE.copy()
            odd.set_size(3)
            h5py.h5d.create(f.id, b"full", odd, h5py.h5s.create_simple((4, 8, 8, 8)))
        self.index_fails(d, "s1.h5' dataset 'full': holds neither 8- to 64-bit integers nor 32- or 64-bit floats")

        # a chunk that inflates to fewer bytes than its shape needs (HDF5 would copy past its end);
        # float volumes are read whole by the index
        d = self.path("short-chunk", "x")[:-2]
        for i in range(2):
            write_cosmo(os.path.join(d, "s%d.h5" % i), self.rng.gamma(2.0, 1.0, size=(4, 8, 8, 8)).astype(np.float32), np.zeros(4))
        with h5py.File(os.path.join(d, "s1.h5"), "r+") as f:
            ds = f["full"]
            ds.id.write_direct_chunk((0,) * ds.ndim, zlib.compress(b"\0" * 100))
            need = int(np.prod(ds.chunks)) * ds.dtype.itemsize
        self.index_fails(d, "s1.h5' dataset 'full': the chunk at [0, 0, 0, 0] holds 100 bytes, its shape needs %d" % need)

        # a volume partly written: the chunks never written are named, not read as zeros
        d = self.path("partial", "x")[:-2]
        for i in range(2):
            write_cosmo(os.path.join(d, "s%d.h5" % i), self.rng.gamma(2.0, 1.0, size=(4, 8, 8, 8)).astype(np.float32), np.zeros(4))
        with h5py.File(os.path.join(d, "s1.h5"), "r+") as f:
            del f["full"]
            f.create_dataset("full", shape=(4, 8, 8, 8), dtype="f4", chunks=(1, 8, 8, 8))[0] = 1.0
        self.index_fails(d, "s1.h5' dataset 'full': reading it needs 4 chunks, and the file holds 1 (chunks never written")

        # a target declaring a billion values in a file of a few kilobytes
        d = fresh("huge-target", n=2)
        with h5py.File(os.path.join(d, "s1.h5"), "r+") as f:
            del f["unitPar"]
            f.create_dataset("unitPar", shape=(10 ** 9,), dtype="f4")
        self.index_fails(d, "s1.h5' dataset 'unitPar' is float32 [1000000000] but the first sample's (s0.h5) is float32 [4]")
        d = fresh("huge-target-first", n=2)
        with h5py.File(os.path.join(d, "s0.h5"), "r+") as f:
            del f["unitPar"]
            f.create_dataset("unitPar", shape=(10 ** 9,), dtype="f4")
        self.index_fails(d, "s0.h5' dataset 'unitPar': its shape needs 4e+09 bytes, and the file holds")

        # a filter the reader cannot measure a chunk through
        d = fresh("filter", n=2)
        with h5py.File(os.path.join(d, "s1.h5"), "r+") as f:
            del f["full"]
            f.create_dataset("full", data=counts(self.rng, (4, 8, 8, 8)), chunks=True, scaleoffset=0)
        self.index_fails(d, "s1.h5' dataset 'full': is stored with the HDF5 filter 'scaleoffset'", "h5repack -f GZIP=1")

        d = self.path("empty", "x")[:-2]
        with open(os.path.join(d, "README"), "w") as f:
            f.write("no samples here\n")
        self.index_fails(d, "holds no samples", "(1 other file)")

        d = self.path("labels", "x")[:-2]
        v, y = shapes_volume(self.rng, 8)
        write_unet(os.path.join(d, "a.h5"), v, (y.astype(np.float32) * 0.5))
        self.index_fails(d, "a.h5' dataset 'segmentation' holds the label 0.5")

        # a directory that was never indexed: the run names the command
        d = fresh("unindexed")
        model = {"name": "cosmoflow", "inputSize": 8, "baseChannels": 2, "hidden": [8]}
        self.run_fails(self.job("unindexed", model, {"format": "hdf5", "path": d}, spatial=1),
                       "spec.dataset.path", "has no index (manifest.tsv): index its files with `tessera data index %s`" % d)
        # indexed, but the model predicts 5 targets and the files hold 4
        self.index(d)
        self.run_fails(self.job("outputs", model, {"format": "hdf5", "path": d}, spatial=1, outputs=5),
                       "spec.model.outputs", "set outputs: 4")
        # a changed file after indexing: verify names it
        write_cosmo(os.path.join(d, "s0.h5"), counts(self.rng, (4, 8, 8, 8)), np.ones(4))
        rc, out, err = tessera("data", "verify", d)
        self.assertEqual(rc, 1)
        self.assertIn("s0.h5' does not match the manifest", err)
        # a manifest cut short lists fewer files than it says: an error naming it, not a smaller dataset;
        # a key this version does not know is said, not silently dropped
        self.index(d)
        manifest = os.path.join(d, "manifest.tsv")
        with open(manifest) as f:
            lines = f.read().splitlines()
        with open(manifest, "w") as f:
            f.write("\n".join(lines[:-1] + ["future=1"]) + "\n")
        rc, out, err = tessera("data", "verify", d)
        self.assertNotEqual(rc, 0, err)
        self.assertIn("manifest.tsv", err)
        self.assertIn("but lists", err)
        self.assertIn("unknown key 'future' ignored", err)


def main():
    global BIN
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    args, rest = parser.parse_known_args()
    BIN = os.path.abspath(args.bin)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
