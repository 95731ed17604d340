#!/usr/bin/env python3
"""ImageFolder datasets as users have them: JPEGs written by Pillow (Debian's python3-pil) under
train/<class>/ and val/<class>/. `tessera data index` learns the layout; the images a job's model gets
(`tessera data read`) equal Pillow's decoding exactly, and Pillow's bilinear resize and centre crop
to within 1.5 of 255 levels; training images are augmented the same way on every read of an epoch and
differently across epochs; a ResNet-50 trains on them through `tessera run`. Every bad input is an
error naming the directory or the file, and a failed index writes no manifest.

usage: image_folder_run_test.py --bin BUILD/bin [unittest args]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
from PIL import Image

BIN = ""
TIMEOUT = 300  # seconds for any one command
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
CLASSES = ["circle", "cross", "square", "stripes"]  # sorted, as the index numbers them


def tessera(*args, cwd=None):
    p = subprocess.run([os.path.join(BIN, "tessera"), *args], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


def picture(rng, label, w, h):
    """An RGB image of class `label`: a shape in a colour of its own, on a noisy background."""
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    img = rng.normal(110, 25, size=(h, w, 3))
    cx, cy, r = w * rng.uniform(0.35, 0.65), h * rng.uniform(0.35, 0.65), min(w, h) * rng.uniform(0.2, 0.35)
    if label == 0:
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
    elif label == 1:
        mask = (np.abs(xx - cx) < r / 4) | (np.abs(yy - cy) < r / 4)
    elif label == 2:
        mask = (np.abs(xx - cx) < r) & (np.abs(yy - cy) < r)
    else:
        mask = np.sin(xx * 2 * np.pi / rng.uniform(6, 10)) > 0
    colour = np.array([[230, 40, 40], [40, 200, 60], [50, 80, 230], [230, 210, 40]][label])
    img[mask] = colour + rng.normal(0, 15, size=(int(mask.sum()), 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def write_folder(root, per_class, rng, sizes=(40, 90)):
    for split, n in (("train", per_class), ("val", max(2, per_class // 3))):
        for label, name in enumerate(CLASSES):
            os.makedirs(os.path.join(root, split, name), exist_ok=True)
            for i in range(n):
                w, h = rng.integers(*sizes, size=2)
                img = picture(rng, label, int(w), int(h))
                if i == 1:  # some images are greyscale, some progressive, as in ImageNet
                    img = img.convert("L")
                img.save(os.path.join(root, split, name, "%s_%03d.JPEG" % (name, i)), quality=int(rng.integers(75, 95)),
                         progressive=(i == 2))


def pod_logs(work):
    text = ""
    for name in sorted(os.listdir(os.path.join(work, "logs"))):
        with open(os.path.join(work, "logs", name)) as f:
            text += f.read()
    return text


def expected_val(path, size):
    """torchvision's validation transform, written with Pillow: Resize(int(S / 0.875)) then CenterCrop(S)."""
    img = Image.open(path).convert("RGB")
    w, h = img.size
    short = int(size / 0.875)
    ow, oh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = img.resize((ow, oh), Image.BILINEAR)
    top, left = int(round((oh - size) / 2.0)), int(round((ow - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size)), dtype=np.float32)  # (S, S, 3) in 0-255


def levels(x):
    """A normalised (3, S, S) input back in 0-255 levels, (S, S, 3)."""
    return (x.transpose(1, 2, 0) * STD + MEAN) * 255.0


class ImageFolderTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tessera-images-")
        self.rng = np.random.default_rng(11)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def folder(self, name="data", per_class=6, sizes=(40, 90)):
        root = os.path.join(self.dir, name)
        write_folder(root, per_class, self.rng, sizes)
        return root

    def job(self, data, size=32, name="images", extra="", epochs=1, replicas=1, outputs=len(CLASSES), batch=8):
        path = os.path.join(self.dir, name + ".yaml")
        with open(path, "w") as f:
            f.write("\n".join([
                "apiVersion: tessera.dev/v1alpha1", "kind: TrainingJob", "metadata: {name: %s}" % name, "spec:",
                "  replicas: %d" % replicas,
                "  model: {name: resnet50, inputSize: %d, outputs: %d, baseChannels: 8}" % (size, outputs),
                "  dataset: {format: imagefolder, path: %s}" % data,
                "  training: {epochs: %d, batchSize: %d, optimizer: {name: sgd, learningRate: 0.05, momentum: 0.9}, "
                "schedule: {decay: cosine}, threads: 1}" % (epochs, batch),
                "  communication: {strategy: torus}", extra,
                "  local: {nodes: %d, gpusPerNode: 1}" % replicas, ""]))
        return path

    def index(self, data):
        rc, out, err = tessera("data", "index", data, "--progress", "1")
        self.assertEqual(rc, 0, out + err)
        return out + err

    def index_fails(self, data, *expected):
        rc, out, err = tessera("data", "index", data)
        self.assertNotEqual(rc, 0, out + err)
        for e in expected:
            self.assertIn(e, err)
        self.assertFalse(os.path.exists(os.path.join(data, "manifest.tsv")), "a failed index wrote a manifest")
        return err

    def read(self, job, sample, validation=False, epoch=0):
        prefix = os.path.join(self.dir, "read", "%s-%d-%d" % ("val" if validation else "train", sample, epoch))
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        args = ["data", "read", job, "--sample", str(sample), "--epoch", str(epoch), "--out", prefix]
        rc, out, err = tessera(*(args + (["--validation"] if validation else [])))
        self.assertEqual(rc, 0, out + err)
        return np.load(prefix + "_x.npy"), np.load(prefix + "_y.npy"), out

    def manifest(self, data):
        with open(os.path.join(data, "manifest.tsv")) as f:
            return f.read().splitlines()

    def test_index_records_classes_sizes_and_checksums(self):
        data = self.folder()
        out = self.index(data)
        self.assertIn("indexed an ImageFolder of 4 classes (24 train, 8 val)", out)
        lines = self.manifest(data)
        self.assertEqual(lines[0], "# tessera-imagefolder v1")
        self.assertEqual(lines[1:6], ["classes=4"] + ["class=" + c for c in CLASSES])
        entries = [l.split("\t") for l in lines[8:]]
        self.assertEqual(len(entries), 32)
        for file, label, size, _, w, h in entries:
            with Image.open(os.path.join(data, file)) as img:
                self.assertEqual((int(w), int(h)), img.size, file)
            self.assertEqual(int(size), os.path.getsize(os.path.join(data, file)))
            self.assertEqual(CLASSES[int(label)], file.split("/")[1])
        rc, out, err = tessera("data", "verify", data)
        self.assertEqual(rc, 0, out + err)
        # A changed image is found by verify, and by the worker that reads it.
        victim = os.path.join(data, entries[0][0])
        with open(victim, "ab") as f:
            f.write(b"\0")
        rc, out, err = tessera("data", "verify", data)
        self.assertEqual(rc, 1)
        self.assertIn(entries[0][0] + "' changed since it was indexed", err)

    def test_validation_images_equal_pillows_decode_and_resize(self):
        size = 32
        data = self.folder()
        # Images of exactly S / 0.875 on their shorter side are not resized: the crop is Pillow's decode, exactly.
        exact = os.path.join(data, "val", "circle", "exact.jpg")
        picture(self.rng, 0, 36, 50).save(exact, quality=90)
        self.index(data)
        job = self.job(data, size)
        files = [l.split("\t")[0] for l in self.manifest(data)[8:] if l.startswith("val/")]
        worst = worst_mean = 0.0
        for i, file in enumerate(files):
            x, y, out = self.read(job, i, validation=True)
            self.assertEqual(x.shape, (3, size, size))
            self.assertEqual(int(y), CLASSES.index(file.split("/")[1]))
            got, want = levels(x), expected_val(os.path.join(data, file), size)
            if file.endswith("exact.jpg"):
                np.testing.assert_allclose(got, want, atol=1e-3, err_msg="decoded pixels differ from Pillow's")
            diff = np.abs(got - want)
            worst, worst_mean = max(worst, float(diff.max())), max(worst_mean, float(diff.mean()))
            self.assertLessEqual(diff.max(), 1.5, "%s: resize differs from Pillow's by %.2f levels" % (file, diff.max()))
            self.assertLessEqual(diff.mean(), 0.5, file)
        # Pillow rounds to whole levels between its horizontal and vertical passes; Tessera does not.
        print("validation transform against Pillow over %d images: largest difference %.3f of 255 levels, largest mean %.3f" %
              (len(files), worst, worst_mean))

    def test_training_augmentation_is_drawn_per_epoch_and_sample(self):
        data = self.folder()
        self.index(data)
        job = self.job(data, 32)
        a0, _, _ = self.read(job, 3, epoch=0)
        again, _, _ = self.read(job, 3, epoch=0)
        a1, _, _ = self.read(job, 3, epoch=1)
        np.testing.assert_array_equal(a0, again, "one epoch's augmentation is not repeatable")
        self.assertGreater(np.abs(a0 - a1).max(), 0.1, "epochs 0 and 1 drew the same crop")
        crops = [self.read(job, 3, epoch=e)[0] for e in range(2, 8)]
        self.assertEqual(len({c.tobytes() for c in crops}), 6)
        # Every crop holds the image's pixels, not padding: its range stays within the image's.
        with Image.open(os.path.join(data, self.manifest(data)[8 + 3].split("\t")[0])) as img:
            pixels = np.asarray(img.convert("RGB"), dtype=np.float32)
        for c in crops:
            lv = levels(c)
            self.assertGreaterEqual(lv.min(), pixels.min() - 1.5)
            self.assertLessEqual(lv.max(), pixels.max() + 1.5)

    def test_a_resnet50_trains_on_jpegs_through_tessera_run(self):
        data = self.folder(per_class=48)
        self.index(data)
        job = self.job(data, 32, name="resnet-images", epochs=6, replicas=2, batch=16)
        work = os.path.join(self.dir, "work")
        rc, out, err = tessera("run", job, "--work-dir", work, "--progress", "30")
        self.assertEqual(rc, 0, out + err)
        with open(os.path.join(work, "status.json")) as f:
            status = json.load(f)["status"]
        self.assertEqual(status["phase"], "Succeeded", status)
        logs = out + err + pod_logs(work)
        self.assertIn("192 to train on and 64 to validate on, 4 classes; the cache keeps decoded pixels", logs)
        acc = status["validation"]["metric"]
        print("ResNet-50 (base width 8) on 192 JPEGs of 4 classes, 6 epochs on 2 workers: validation accuracy %.3f "
              "(chance 0.25)" % acc)
        # 0.91 and 0.95 measured on two draws of the images.
        self.assertGreaterEqual(acc, 0.7, status["validation"])

    def test_a_small_memory_tier_keeps_the_jpeg_bytes(self):
        data = self.folder(per_class=8)
        self.index(data)
        job = self.job(data, 32, name="small-cache", extra="  cache: {memory: 100Ki}")
        work = os.path.join(self.dir, "work-small")
        rc, out, err = tessera("run", job, "--work-dir", work)
        self.assertEqual(rc, 0, out + err)
        logs = out + err + pod_logs(work)
        self.assertRegex(logs, r"the cache keeps JPEG bytes: the decoded images \([0-9.]+ MB\) do not fit the memory tier \(0\.1 MB\)")

    def test_bad_folders_are_named_with_the_problem(self):
        data = self.folder()
        # An undecodable file: text named .jpg, and a JPEG cut short.
        text = os.path.join(data, "train", "cross", "notes.jpg")
        with open(text, "w") as f:
            f.write("not an image\n")
        good = os.path.join(data, "train", "square", "square_000.JPEG")
        cut = os.path.join(data, "train", "square", "cut.jpg")
        with open(good, "rb") as f:
            whole = f.read()
        with open(cut, "wb") as f:
            f.write(whole[: len(whole) // 2])
        # A CMYK JPEG (as print workflows write them): libjpeg cannot give it as RGB.
        cmyk = os.path.join(data, "val", "circle", "print.jpg")
        Image.new("CMYK", (40, 30), (10, 200, 30, 5)).save(cmyk, quality=90)
        err = self.index_fails(data, "3 images cannot be decoded", "train/cross/notes.jpg", "train/square/cut.jpg",
                               "print.jpg': a CMYK JPEG; convert it to RGB")
        self.assertIn("not a JPEG", err)
        os.remove(text)
        os.remove(cut)
        os.remove(cmyk)
        # An empty class.
        os.makedirs(os.path.join(data, "val", "empty"))
        os.makedirs(os.path.join(data, "train", "empty"))
        self.index_fails(data, "train/empty: an empty class")
        shutil.rmtree(os.path.join(data, "train", "empty"))
        # Classes that differ between train/ and val/.
        shutil.copy(good, os.path.join(data, "val", "empty", "a.jpg"))
        self.index_fails(data, "train/ and val/ hold different classes (1 class only in val/: empty)")
        shutil.rmtree(os.path.join(data, "val", "empty"))
        shutil.rmtree(os.path.join(data, "val", "cross"))
        self.index_fails(data, "1 class only in train/: cross")
        # No val/ at all.
        shutil.rmtree(os.path.join(data, "val"))
        self.index_fails(data, "has no val/ directory")
        # A job whose outputs do not match the classes, and one pointed at a folder not indexed.
        other = self.folder("other")
        job = self.job(other, 32, name="unindexed")
        rc, out, err = tessera("run", job, "--work-dir", os.path.join(self.dir, "w1"))
        self.assertNotEqual(rc, 0)
        self.assertIn("has no index (manifest.tsv): index its images with `tessera data index %s`" % other, out + err)
        self.index(other)
        job = self.job(other, 32, name="outputs", outputs=10)
        rc, out, err = tessera("run", job, "--work-dir", os.path.join(self.dir, "w2"))
        self.assertNotEqual(rc, 0)
        self.assertIn("spec.model.outputs: 10 outputs, but the dataset under %s has 4 classes" % other, out + err)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    args, rest = parser.parse_known_args()
    BIN = os.path.abspath(args.bin)
    unittest.main(argv=[sys.argv[0]] + rest)
