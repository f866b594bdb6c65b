#!/usr/bin/env python3
"""Trains the default Fashion-MNIST teacher that `kdflow train` ships with, and exports it to ONNX.

Run with the kdflow venv's python (Debian's /usr/bin/python3 + the venv made by scripts/setup.sh:
it has torch, numpy and onnx):

    ~/.cache/kdflow/venv/bin/python scripts/train_fmnist_teacher.py models/fmnist_teacher.onnx

Deterministic for a given seed on a given machine (single process, fixed thread count, seeded
shuffling and augmentation). The data is Debian's dataset-fashion-mnist (IDX, gzip) and the
preprocessing matches kdflow's loader: pixels / 255, normalized by the Fashion-MNIST mean and std,
random crop with 2 pixels of padding and horizontal flips while training. Writes the ONNX file and,
beside it, <name>.json with the seed, epochs and the measured test accuracy.
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530  # kdflow's defaults for fashion-mnist (core/dataset.cpp, the dataset registry)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(root, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - MEAN) / STD, torch.from_numpy(y.astype(np.int64))


class Teacher(nn.Module):
    """A VGG-style CNN: light enough for one CPU core to keep up with a small student."""

    def __init__(self, width=32, classes=10):
        super().__init__()

        def block(cin, cout):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                    nn.ReLU(inplace=True)]

        self.features = nn.Sequential(
            *block(1, width), *block(width, width), nn.MaxPool2d(2),
            *block(width, 2 * width), *block(2 * width, 2 * width), nn.MaxPool2d(2),
            *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(4 * width, classes))

    def forward(self, x):
        return self.head(self.features(x))


def augment(x, gen):
    """Random crop with 2 pixels of zero padding (in pixel space, i.e. value -MEAN/STD) and flips."""
    n = x.shape[0]
    pad = F.pad(x, (2, 2, 2, 2), value=-MEAN / STD)
    dy = torch.randint(0, 5, (n,), generator=gen)
    dx = torch.randint(0, 5, (n,), generator=gen)
    flip = torch.rand(n, generator=gen) < 0.5
    out = torch.empty_like(x)
    for i in range(n):
        img = pad[i, :, dy[i]:dy[i] + 28, dx[i]:dx[i] + 28]
        out[i] = torch.flip(img, (2,)) if flip[i] else img
    return out


def accuracy(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    return correct / len(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", help="ONNX file to write")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(args.seed)
    xtr, ytr = load(args.data, "train")
    xte, yte = load(args.data, "test")
    model = Teacher(args.width)
    steps = args.epochs * (len(xtr) // args.batch)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True,
                          weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=steps, pct_start=0.15)
    start = time.time()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(xtr), generator=gen)
        for b in range(len(xtr) // args.batch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            loss = F.cross_entropy(model(augment(xtr[idx], gen)), ytr[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        acc = accuracy(model, xte, yte)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.4f} test accuracy {acc:.4f} "
              f"({time.time() - start:.0f} s)", flush=True)

    model.eval()
    acc = accuracy(model, xte, yte)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    torch.onnx.export(model, torch.zeros(1, 1, 28, 28), args.output, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)
    meta = {"model": os.path.basename(args.output), "dataset": "fashion-mnist",
            "test_accuracy": acc, "seed": args.seed, "epochs": args.epochs, "batch": args.batch,
            "lr": args.lr, "width": args.width, "mean": MEAN, "std": STD,
            "torch": torch.__version__, "train_s": round(time.time() - start, 1)}
    with open(os.path.splitext(args.output)[0] + ".json", "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
