#!/usr/bin/python3
"""The loader benchmark's peer (Debian's /usr/bin/python3 with python3-pil and python3-numpy):
the same JPEG folder through PIL, the route torchvision's ImageFolder takes (Image.open +
convert("RGB"), Resize, RandomCrop, RandomHorizontalFlip, ToTensor + Normalize done in NumPy), with
one worker process per core as a DataLoader runs them, each pinned to its core and filling a
float32 batch array. Also PIL's bare decode + centre crop on one core.

Reads kdflow_loader_bench's JSON (--kdflow), measures the peer on the same files, core counts,
window and repetitions, and writes both with the ratios kdflow / PIL (--out)."""
import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import time

import numpy as np
import PIL
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def list_files(root):
    files = []
    for c in sorted(os.listdir(root)):
        d = os.path.join(root, c)
        if os.path.isdir(d):
            files += [os.path.join(d, f) for f in sorted(os.listdir(d))
                      if f.lower().endswith((".jpg", ".jpeg", ".png"))]
    return files


def load(path, size, resize, rng, augment):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    if min(w, h) != resize:  # torchvision Resize(resize): shorter side, bilinear
        s = resize / min(w, h)
        img = img.resize((max(resize, round(w * s)), max(resize, round(h * s))), Image.BILINEAR)
        w, h = img.size
    if augment:
        x, y = rng.randint(0, w - size), rng.randint(0, h - size)
    else:
        x, y = round((w - size) / 2), round((h - size) / 2)
    img = img.crop((x, y, x + size, y + size))
    if augment and rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img


def worker(cpu, files, size, resize, batch, seconds, decode_only, out):
    os.sched_setaffinity(0, {cpu})
    rng = random.Random(cpu)
    if decode_only:
        def one(i):
            img = load(files[i % len(files)], size, resize, rng, augment=False)
            return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))
    else:
        slot = np.empty((batch, 3, size, size), np.float32)

        def one(i):
            img = load(files[i % len(files)], size, resize, rng, augment=True)
            x = np.asarray(img, np.float32).transpose(2, 0, 1) / 255.0
            slot[i % batch] = (x - MEAN) / STD
    timed(one, len(files), cpu, seconds, out)


def timed(one, files, cpu, seconds, out):
    """A worker's window: `one(i)` over the first files (warm-up: page cache, imports), then
    strided through the files as a shuffled epoch for `seconds`; its images/s go to `out`."""
    for i in range(min(32, files)):
        one(i)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        one(n * 7919 + cpu)
        n += 1
    out.put(n / (time.perf_counter() - t0))


def processes(target, cpus, args, context=mp):
    """images/s of one `target(cpu, *args, queue)` process per CPU, run at once, added up."""
    q = context.Queue()
    procs = [context.Process(target=target, args=(c, *args, q)) for c in cpus]
    for p in procs:
        p.start()
    total = sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    return total


def rate(cpus, files, size, resize, batch, seconds, decode_only=False):
    return processes(worker, cpus, (files, size, resize, batch, seconds, decode_only))


def median(xs):
    return sorted(xs)[len(xs) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kdflow", required=True, help="kdflow_loader_bench's JSON")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    k = json.load(open(a.kdflow))
    jf = k["jpeg_folder"]
    size, resize, reps, seconds = jf["size"], jf["resize"], k["repetitions"], k["seconds_per_window"]
    files = list_files(os.path.join(jf["root"], "train"))
    allowed = sorted(os.sched_getaffinity(0))

    decode = median([rate(allowed[:1], files, size, resize, k["batch"], seconds, True)
                     for _ in range(reps)])
    jf["pil_decode_only_1_core"] = {"images_per_s": decode,
                                    "what": "Image.open + convert(RGB) + centre crop, uint8 CHW"}
    jf["decode_only_kdflow_vs_pil"] = jf["decode_only_1_core"]["images_per_s"] / decode
    for row in jf["loader"]:
        n = row["cores"]
        peer = median([rate(allowed[:n], files, size, resize, k["batch"], seconds)
                       for _ in range(reps)])
        row["pil_images_per_s"] = peer
        row["pil_images_per_s_per_core"] = peer / n
        row["kdflow_vs_pil"] = row["images_per_s"] / peer
        print(f"jpeg folder, {n} core(s): kdflow {row['images_per_s']:.0f}, PIL {peer:.0f} images/s "
              f"({row['kdflow_vs_pil']:.2f}x)")
    jf["peer"] = {"route": "PIL (Debian python3-pil) + NumPy, one process per core",
                  "pil": PIL.__version__, "numpy": np.__version__, "python": platform.python_version(),
                  "libjpeg_turbo": PIL.features.check_feature("libjpeg_turbo")}
    with open(a.out, "w") as f:
        json.dump(k, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    import PIL.features  # noqa: F401  (features is a submodule)
    main()
