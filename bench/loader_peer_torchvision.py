#!/usr/bin/env python3
"""The loader benchmark's ImageNet-recipe peer (the kdflow venv's python: torch, torchvision,
Pillow): what a PyTorch user's DataLoader worker does per training sample, torchvision's
ImageFolder loader (PIL open + convert("RGB")) and transforms.Compose([RandomResizedCrop(size),
RandomHorizontalFlip(), (ColorJitter(0.4, 0.4, 0.4),) ToTensor(), Normalize(ImageNet)]) into a
float32 batch tensor, one worker process per core, each pinned to its core with one torch thread
(as DataLoader workers run).

Reads kdflow_loader_bench's JSON (--kdflow, with its `imagenet_recipe` part), measures the peer on
the same files, recipes, core counts, window and repetitions, and writes both with the ratios
kdflow / torchvision, the CPU and the commit (--out)."""
import argparse
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys

import PIL
import torch
import torchvision
import torchvision.transforms as T
from torchvision.datasets.folder import default_loader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_peer import list_files, median, processes, timed  # noqa: E402 (the PIL peer's)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def worker(cpu, files, size, jitter, batch, seconds, out):
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    torch.manual_seed(cpu)
    steps = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
    if jitter:
        steps.append(T.ColorJitter(0.4, 0.4, 0.4))
    transform = T.Compose(steps + [T.ToTensor(), T.Normalize(MEAN, STD)])
    slot = torch.empty(batch, 3, size, size)

    def one(i):
        slot[i % batch] = transform(default_loader(files[i % len(files)]))

    timed(one, len(files), cpu, seconds, out)


def rate(cpus, files, size, jitter, batch, seconds):
    return processes(worker, cpus, (files, size, jitter, batch, seconds), mp.get_context("fork"))


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kdflow", required=True, help="kdflow_loader_bench's JSON")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    k = json.load(open(a.kdflow))
    ir = k["imagenet_recipe"]
    reps, seconds = k["repetitions"], k["seconds_per_window"]
    files = list_files(os.path.join(ir["root"], "train"))
    allowed = sorted(os.sched_getaffinity(0))
    for recipe in ir["recipes"]:
        for row in recipe["loader"]:
            n = row["cores"]
            peer = median([rate(allowed[:n], files, ir["size"], recipe["color_jitter"], k["batch"],
                                seconds) for _ in range(reps)])
            row["torchvision_images_per_s"] = peer
            row["torchvision_images_per_s_per_core"] = peer / n
            row["kdflow_vs_torchvision"] = row["images_per_s"] / peer
            print(f"{recipe['augment']}, {n} core(s): kdflow {row['images_per_s']:.0f}, "
                  f"torchvision {peer:.0f} images/s ({row['kdflow_vs_torchvision']:.2f}x)")
    ir["peer"] = {"route": "torchvision ImageFolder loader + transforms, one process per core, "
                           "one torch thread each",
                  "torch": torch.__version__, "torchvision": torchvision.__version__,
                  "pillow": PIL.__version__, "python": platform.python_version()}
    flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
    k["machine"] = {"cpu": cpu_name(), "cpus": len(allowed),
                    "isa": "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"}
    k["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    with open(a.out, "w") as f:
        json.dump(k, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
