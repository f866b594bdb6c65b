#!/usr/bin/env python3
"""Exports test teachers with PyTorch's ONNX exporters (the legacy one and the dynamo one that
torch.onnx.export uses by default, which needs onnxscript) and records PyTorch's outputs on fresh
random inputs, for kdflow's teacher tests (run with the kdflow venv's python: it has torch,
torchvision and onnx).

usage: make_teacher_fixtures.py OUT_DIR [--seed N] [--only NAME...] [--jobs N]

Writes OUT_DIR/<name>.onnx, <name>.input.npy, <name>.output.npy (PyTorch's fp32 logits),
<name>.bf16_output.npy (PyTorch's own bf16 logits, under CPU autocast: the peer a bf16 teacher's
rounding is measured against) and manifest.json. Inputs are fresh random data every run unless
--seed is given. The models are made in --jobs processes side by side (default: one per CPU, at
most 8), each its own seed drawn from the run's, so a --seed run is the same whatever --jobs.
"""
import argparse
import concurrent.futures
import multiprocessing
import json
import os
import sys
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import logging

logging.disable(logging.WARNING)  # the dynamo exporter reports each pass it runs

warnings.filterwarnings("ignore")


class Mlp(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, 64)
        self.fc2 = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class OpZoo(nn.Module):
    """Exercises ops and attribute variants the torchvision models do not: BatchNorm kept unfolded,
    ceil_mode and count_include_pad pooling, LeakyReLU/Hardswish/Hardsigmoid/Sigmoid/ReLU6, dilated
    and grouped convs, concat, residual adds, broadcasting binary ops and x.view(x.size(0), -1)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.bn2 = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, stride=2, padding=2, groups=16)
        self.c3 = nn.Conv2d(32, 24, 1)
        self.scale = nn.Parameter(torch.randn(1, 24, 1, 1))
        self.fc = nn.Linear(24 * 5 * 5, 10)
        for bn in (self.bn1, self.bn2):  # non-trivial running statistics
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x):
        a = F.leaky_relu(self.bn1(self.c1(x)), 0.1)
        b = self.bn2(self.c2(a))
        b = F.hardswish(b + a)                                   # residual, then activation
        b = F.max_pool2d(b, 3, stride=2, padding=1, ceil_mode=True)
        d = torch.sigmoid(self.dw(a))
        d = F.avg_pool2d(d, 1)
        cat = torch.cat([b, F.relu6(d)], dim=1)
        c = F.hardsigmoid(self.c3(cat)) * self.scale - 0.25      # broadcasting Mul and Sub
        c = F.avg_pool2d(c, 3, stride=2, padding=1, count_include_pad=False)
        c = c / 2.0
        return self.fc(c.view(c.size(0), -1))


class EncoderClassifier(nn.Module):
    """A TransformerEncoder over the image's rows (tokens = rows), mean-pooled, as a text-style
    transformer teacher: MatMul with batch dimensions, Softmax, LayerNormalization, Gather."""

    def __init__(self, classes=10, width=28, dim=64, layers=2, expansion=2):
        super().__init__()
        self.embed = nn.Linear(width, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, expansion * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x[:, 0])).mean(1))


class Upsampler(nn.Module):
    """F.interpolate as segmentation and FPN-style teachers use it: nearest by a factor, bilinear to
    a size (half-pixel) and bilinear with align_corners, between convolutions."""

    def __init__(self, classes=10):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x):
        a = F.relu(self.c1(x))
        b = F.interpolate(a, scale_factor=2, mode="nearest")
        c = F.interpolate(self.c2(b), size=(20, 12), mode="bilinear", align_corners=False)
        d = F.interpolate(c, scale_factor=0.5, mode="bilinear", align_corners=True)
        return self.fc(d.mean((2, 3)))


def tiny_vit():
    m = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                                             hidden_dim=64, mlp_dim=128, num_classes=10)
    nn.init.normal_(m.heads.head.weight, std=0.05)  # torchvision zero-initializes the head
    return m


def small_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)], num_classes=10)


def models():
    tv = torchvision.models
    # name: (constructor, sample shape, opset, fold constants, exporter). Exporters: "legacy"
    # (TorchScript-based, dynamo=False, a dynamic batch axis), "dynamo" (torch.onnx.export's
    # default since torch 2.9, a dynamic batch dimension) and "dynamo_static" (the default call
    # as a user writes it: no dynamic shapes, the batch of the example input fixed in the graph).
    return {
        "mlp_opset13": (Mlp, (1, 28, 28), 13, True, "legacy"),
        # 7 classes: the training run must refuse it for a 10-class dataset.
        "mlp7_opset13": (lambda: Mlp(classes=7), (1, 28, 28), 13, True, "legacy"),
        "opzoo_opset11": (OpZoo, (3, 16, 16), 11, False, "legacy"),
        "opzoo_opset17": (OpZoo, (3, 16, 16), 17, False, "legacy"),
        "resnet18_opset17": (lambda: tv.resnet18(num_classes=10), (3, 32, 32), 17, True, "legacy"),
        "mobilenet_v2_opset13": (lambda: tv.mobilenet_v2(num_classes=10), (3, 32, 32), 13, True,
                                 "legacy"),
        # The same network at 64 px: maps of 32x32 after the stem. Whether oneDNN fuses a
        # pointwise convolution with the depthwise one after it depends on the maps, the batch
        # and the CPU's caches: on an Intel Xeon with AMX (2 MiB of L2 a core) it fuses none of
        # the 32 px network's layers (16x16 maps and smaller) and some of these.
        "mobilenet_v2_64_opset13": (lambda: tv.mobilenet_v2(num_classes=10), (3, 64, 64), 13,
                                    True, "legacy"),
        "resnet18_bnkept_opset11": (lambda: tv.resnet18(num_classes=10), (3, 32, 32), 11, False,
                                    "legacy"),
        "resnet18_dynamo": (lambda: tv.resnet18(num_classes=10), (3, 32, 32), 20, True, "dynamo"),
        "mobilenet_v3_dynamo_static": (lambda: tv.mobilenet_v3_small(num_classes=10), (3, 32, 32),
                                       20, True, "dynamo_static"),
        "encoder_dynamo": (EncoderClassifier, (1, 28, 28), 20, True, "dynamo"),
        "encoder_opset20": (EncoderClassifier, (1, 28, 28), 20, True, "legacy"),
        # Before opset 17 the legacy exporter decomposes LayerNorm (ReduceMean, Sub, Pow, Sqrt, Div).
        "encoder_opset16": (EncoderClassifier, (1, 28, 28), 16, True, "legacy"),
        "vit_dynamo": (tiny_vit, (3, 32, 32), 20, True, "dynamo"),
        "vit_dynamo_static": (tiny_vit, (3, 32, 32), 20, True, "dynamo_static"),
        "vit_opset17": (tiny_vit, (3, 32, 32), 17, True, "legacy"),
        "convnext_dynamo": (small_convnext, (3, 32, 32), 20, True, "dynamo"),
        "upsampler_dynamo": (Upsampler, (3, 16, 16), 20, True, "dynamo"),
        "upsampler_opset13": (Upsampler, (3, 16, 16), 13, True, "legacy"),
        # The other torchvision families, from today's default exporter: SiLU and
        # squeeze-and-excitation (efficientnet, regnet), channel shuffle, fire modules with ceil-mode
        # pooling, dense concatenation, mnasnet's inverted residuals.
        "efficientnet_b0_dynamo": (lambda: tv.efficientnet_b0(num_classes=10), (3, 32, 32), 20, True,
                                   "dynamo"),
        "regnet_y_400mf_dynamo": (lambda: tv.regnet_y_400mf(num_classes=10), (3, 32, 32), 20, True,
                                  "dynamo"),
        "shufflenet_v2_dynamo": (lambda: tv.shufflenet_v2_x0_5(num_classes=10), (3, 32, 32), 20, True,
                                 "dynamo"),
        "squeezenet1_1_dynamo": (lambda: tv.squeezenet1_1(num_classes=10), (3, 32, 32), 20, True,
                                 "dynamo"),
        "densenet121_dynamo": (lambda: tv.densenet121(num_classes=10), (3, 32, 32), 20, True, "dynamo"),
        "mnasnet0_5_dynamo": (lambda: tv.mnasnet0_5(num_classes=10), (3, 32, 32), 20, True, "dynamo"),
        "convnext_opset18": (small_convnext, (3, 32, 32), 18, True, "legacy"),
    }


# Fewer fitting steps for the large families (each step is a training step at the fixture batch
# on the test machine's CPU): enough to make their logits decisive, without minutes per model.
FIT_STEPS = {"mobilenet_v2_64_opset13": 8, "efficientnet_b0_dynamo": 8, "regnet_y_400mf_dynamo": 8,
             "shufflenet_v2_dynamo": 8, "squeezenet1_1_dynamo": 8, "densenet121_dynamo": 6,
             "mnasnet0_5_dynamo": 8}


def export(model, x, path, opset, fold, exporter):
    if exporter == "legacy":
        torch.onnx.export(model, x, path, opset_version=opset, dynamo=False,
                          do_constant_folding=fold, input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    elif exporter == "dynamo":
        torch.onnx.export(model, (x,), path, dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    else:  # the plain call, with one sample as the example input
        torch.onnx.export(model, (x[:1],), path)


def make_one(job):
    """One fixture model: fitted, exported, its inputs and PyTorch's outputs saved."""
    name, out, batch, fit_steps, seed, threads = job
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    ctor, sample, opset, fold, exporter = models()[name]
    model = ctor()
    x = torch.randn(batch, *sample)
    # A freshly initialized classifier's top-1 is decided by near-ties that any rounding flips;
    # a trained teacher's is not. Fit the fixture's own inputs to random labels for a few steps
    # so its logits are as decisive as a trained model's (bf16 top-1 checks then measure
    # rounding, not coin flips); BatchNorm statistics are updated by the same steps.
    with torch.no_grad():
        classes = model(x).shape[1]
    labels = torch.randint(0, classes, (batch,))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(min(fit_steps, FIT_STEPS.get(name, fit_steps))):
        opt.zero_grad()
        F.cross_entropy(model(x), labels).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        y = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_bf16 = model(x).float()
    path = os.path.join(out, name + ".onnx")
    export(model, x, path, opset, fold, exporter)
    np.save(os.path.join(out, name + ".input.npy"), x.numpy().astype(np.float32))
    np.save(os.path.join(out, name + ".output.npy"), y.numpy().astype(np.float32))
    np.save(os.path.join(out, name + ".bf16_output.npy"), y_bf16.numpy().astype(np.float32))
    return {"name": name, "sample": list(sample), "opset": opset}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--fit-steps", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    names = [n for n in models() if not args.only or n in args.only]
    jobs = max(1, min(args.jobs, len(names)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    work = [(n, args.out, args.batch, args.fit_steps, (seed * 1000003 + k) % 2**32, threads)
            for k, n in enumerate(names)]
    if jobs == 1:
        made = [make_one(w) for w in work]
    else:
        # spawn, not fork: a forked child would inherit the parent's torch thread pools.
        with concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            made = list(pool.map(make_one, work))
    manifest = {"seed": seed, "batch": args.batch, "models": made}
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"fixtures: {len(manifest['models'])} models, seed {seed}, in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
