#!/usr/bin/python3
"""Writes an image folder of JPEGs for the loader benchmark (Debian's /usr/bin/python3 with
python3-pil and python3-numpy): ROOT/train/<class>/*.jpg, SIZE x SIZE RGB.

No photographs are available offline, so the images are made to have a photograph's statistics
where JPEG cost depends on them: a 1/f amplitude spectrum (natural images fall off about so),
correlated colour channels, and some hard-edged shapes; saved at quality 90 with 4:2:0 chroma
subsampling (PIL's default, as most photographs). The files' mean size is printed: it is what
decoding cost tracks. Deterministic for a given --seed."""
import argparse
import os

import numpy as np
from PIL import Image, ImageDraw


def image(rng, size):
    fy = np.fft.fftfreq(size)[:, None]
    fx = np.fft.rfftfreq(size)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    base = None
    channels = []
    for c in range(3):
        spectrum = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f
        plane = np.fft.irfft2(spectrum, s=(size, size))
        plane = (plane - plane.mean()) / (plane.std() + 1e-9)
        base = plane if base is None else base
        channels.append(0.7 * base + 0.3 * plane if c else plane)  # correlated channels
    rgb = np.stack(channels, axis=-1)
    rgb = 128 + 48 * rgb + rng.uniform(-40, 40, size=3)
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(rng.integers(2, 6)):
        x0, y0 = rng.integers(0, size, 2)
        x1, y1 = x0 + rng.integers(10, size // 2), y0 + rng.integers(10, size // 2)
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=fill)
    return img


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    stamp = os.path.join(a.out, f".made-{a.images}-{a.classes}-{a.size}-{a.seed}")
    if os.path.exists(stamp):
        print(open(stamp).read().strip())
        return
    rng = np.random.default_rng(a.seed)
    total = 0
    for i in range(a.images):
        d = os.path.join(a.out, "train", f"class{i % a.classes:02d}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"img{i:05d}.jpg")
        image(rng, a.size).save(path, quality=90)
        total += os.path.getsize(path)
    line = f"{a.images} JPEGs of {a.size}x{a.size}, mean {total / a.images / 1024:.1f} KiB, in {a.out}/train"
    with open(stamp, "w") as f:
        f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
