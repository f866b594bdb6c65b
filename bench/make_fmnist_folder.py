#!/usr/bin/env python3
"""Fashion-MNIST as an ImageNet-shaped JPEG folder: real images and real labels at the sizes and in
the layout people distil from (the project venv's python: numpy and Pillow).

ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg, the class folders named after Fashion-MNIST's
ten classes. Each 28x28 grey image is scaled up (bicubic) to a random size of --min to --max pixels
a side (independent height and width: aspect ratios vary as photographs' do), placed on a
background, and given colour: the garment in one random colour and the background in another, with
mild noise (a JPEG's cost follows its detail), so that neither colour nor size tells the class.
Saved at quality 90, 4:2:0 chroma (Pillow's default, as most photographs). Deterministic for a given
--seed (each image draws from its own generator, keyed by seed, split and index, so the images are
made in --jobs processes side by side and are the same whatever --jobs); the training images come from Fashion-MNIST's training split and the validation images from
its test split. A stamp file makes a second call with the same arguments a no-op."""
import argparse
import gzip
import multiprocessing
import os

import numpy as np
from PIL import Image

CLASSES = ["tshirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle_boot"]


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def render(rng, grey, lo, hi):
    h, w = (int(v) for v in rng.integers(lo, hi + 1, 2))
    # The garment fills 60-95% of the shorter side, somewhere in the frame.
    side = int(min(h, w) * rng.uniform(0.6, 0.95))
    garment = np.asarray(Image.fromarray(grey).resize((side, side), Image.BICUBIC), np.float32)
    alpha = garment[..., None] / 255.0
    fg = rng.uniform(40, 255, 3)
    bg = rng.uniform(0, 200, 3)
    canvas = np.empty((h, w, 3), np.float32)
    canvas[:] = bg + rng.normal(0, 6, (h, w, 3))
    y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
    patch = canvas[y:y + side, x:x + side]
    canvas[y:y + side, x:x + side] = patch * (1 - alpha) + (fg * alpha) * (0.8 + 0.4 * alpha)
    return Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8), "RGB")


def make_image(job):
    """Renders and saves one image; returns its size in bytes."""
    path, grey, lo, hi, key = job
    render(np.random.default_rng(key), grey, lo, hi).save(path, quality=90)
    return os.path.getsize(path)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--train", type=int, default=10000, help="training images (at most 60000)")
    p.add_argument("--val", type=int, default=2000, help="validation images (at most 10000)")
    p.add_argument("--min", type=int, default=300, help="shortest side drawn")
    p.add_argument("--max", type=int, default=500, help="longest side drawn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    if not (0 < a.train <= 60000 and 0 < a.val <= 10000 and 28 <= a.min <= a.max):
        p.error("want 0 < --train <= 60000, 0 < --val <= 10000, 28 <= --min <= --max")
    # v2: one generator per image (v1 drew every image from one stream, in order)
    stamp = os.path.join(a.out, f".made-fmnist-v2-{a.train}-{a.val}-{a.min}-{a.max}-{a.seed}")
    if os.path.exists(stamp):
        print(open(stamp).read().strip())
        return
    jobs = []
    for k, (split, prefix, n) in enumerate((("train", "train", a.train), ("val", "t10k", a.val))):
        images = read_idx(os.path.join(a.source, f"{prefix}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(a.source, f"{prefix}-labels-idx1-ubyte.gz"))
        for c in CLASSES:
            os.makedirs(os.path.join(a.out, split, c), exist_ok=True)
        jobs += [(os.path.join(a.out, split, CLASSES[labels[i]], f"{prefix}{i:05d}.jpg"), images[i],
                  a.min, a.max, [a.seed, k, i]) for i in range(n)]
    with multiprocessing.get_context("fork").Pool(max(1, a.jobs)) as pool:
        sizes = pool.map(make_image, jobs, chunksize=64)
    total, count = sum(sizes), len(sizes)
    line = (f"{a.train} training and {a.val} validation JPEGs of {a.min}-{a.max} px, mean "
            f"{total / count / 1024:.1f} KiB, in {a.out}")
    with open(stamp, "w") as f:
        f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
