#!/usr/bin/env python3
"""A JPEG folder's first images as a teacher's input, for `kdflow teacher bench --calibration`: the
evaluation view kdflow's folder loader makes (short side resized to --resize, bilinear; a centred
--size crop; ImageNet's mean/std, as kdflow's folder default), NCHW float32, written as one .npy.
Images are taken in sorted order across the class folders, round-robin, so every class is in it.
Uses the project venv's python (numpy and Pillow)."""
import argparse
import os

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def view(path, size, resize):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    scale = resize / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BILINEAR)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    x = np.asarray(img.crop((left, top, left + size, top + size)), np.float32) / 255
    return ((x - MEAN) / STD).transpose(2, 0, 1)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--folder", required=True, help="ROOT/<class>/*.jpg (a split of the folder)")
    p.add_argument("--images", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--resize", type=int, help="short side before the crop (default: size * 8 / 7)")
    p.add_argument("--out", required=True, help=".npy file")
    a = p.parse_args()
    classes = sorted(d for d in os.listdir(a.folder) if os.path.isdir(os.path.join(a.folder, d)))
    files = [sorted(os.path.join(a.folder, c, f) for f in os.listdir(os.path.join(a.folder, c)))
             for c in classes]
    picked = [f for k in range(max(map(len, files), default=0)) for f in
              (fs[k] for fs in files if k < len(fs))][:a.images]
    if len(picked) < a.images:
        raise SystemExit(f"folder_calibration: {a.folder} has {len(picked)} images, {a.images} asked for")
    x = np.stack([view(f, a.size, a.resize or a.size * 8 // 7) for f in picked])
    np.save(a.out, x)


if __name__ == "__main__":
    main()
