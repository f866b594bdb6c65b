#!/usr/bin/env python3
"""Writes example students as TorchScript (what `student.arch = "torchscript"` loads), and a few
modules kdflow must refuse, for the tests and as templates for users. Run with the kdflow venv's
python (torch).

usage: make_students.py OUT_DIR [--channels 1] [--size 28] [--classes 10] [--seed 0]

Written (each takes [batch, channels, size, size] float32 images):
  resnet8_scripted.pt, resnet8_traced.pt        a ResNet-8-like CNN, logits [batch, classes]
  mobilenet_scripted.pt, mobilenet_traced.pt    a small MobileNet-like net (depthwise separable)
  resnet8_dict.pt     scripted, returns {"logits": ..., "features": ...}
  mobilenet_tuple.pt  traced, returns (logits, features)
and the refused ones: not_an_archive.pt (bytes), wrong_classes.pt (7 logits), three_channels.pt
(a first convolution that wants 3 channels) and no_parameters.pt (buffers only). manifest.json
lists both sets ({name, error} for the refused ones: text the one-line error must contain).
"""
import argparse
import json
import os
from typing import Dict, Tuple

import torch
from torch import nn


def conv_bn(cin, cout, stride=1, groups=1, k=3):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.a = conv_bn(cin, cout, stride)
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return torch.relu(self.b(self.a(x)) + self.skip(x))


class ResNet8(nn.Module):
    """Stem and three basic blocks (16, 32, 64 channels): 8 weighted layers with the head."""

    def __init__(self, channels, classes):
        super().__init__()
        self.stem = conv_bn(channels, 16)
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def features(self, x):
        return self.stages(self.stem(x)).mean((2, 3))

    def forward(self, x):
        return self.fc(self.features(x))


class ResNet8Dict(ResNet8):
    def forward(self, x) -> Dict[str, torch.Tensor]:
        f = self.features(x)
        return {"features": f, "logits": self.fc(f)}  # logits not first: found by name


class MobileNetLike(nn.Module):
    """A stem, then depthwise 3x3 + pointwise 1x1 pairs, global pooling and a linear head."""

    def __init__(self, channels, classes):
        super().__init__()
        layers = [conv_bn(channels, 16)]
        for cin, cout, stride in [(16, 32, 1), (32, 64, 2), (64, 96, 2), (96, 128, 1)]:
            layers += [conv_bn(cin, cin, stride, groups=cin), conv_bn(cin, cout, k=1)]
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(128, classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class MobileNetTuple(MobileNetLike):
    def forward(self, x) -> Tuple[torch.Tensor, torch.Tensor]:
        f = self.body(x).mean((2, 3))
        return self.fc(f), f


class NoParameters(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.register_buffer("scale", torch.ones(classes))

    def forward(self, x):
        return x.flatten(1)[:, : self.scale.numel()] * self.scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    example = torch.randn(2, a.channels, a.size, a.size)
    manifest = {"channels": a.channels, "size": a.size, "classes": a.classes, "students": [],
                "refused": []}

    def save(name, module, trace):
        module.train()  # saved as a user saves a model to be trained
        m = torch.jit.trace(module, example) if trace else torch.jit.script(module)
        m.save(os.path.join(a.out, name + ".pt"))
        manifest["students"].append(name)

    save("resnet8_scripted", ResNet8(a.channels, a.classes), trace=False)
    save("resnet8_traced", ResNet8(a.channels, a.classes), trace=True)
    save("mobilenet_scripted", MobileNetLike(a.channels, a.classes), trace=False)
    save("mobilenet_traced", MobileNetLike(a.channels, a.classes), trace=True)
    save("resnet8_dict", ResNet8Dict(a.channels, a.classes), trace=False)
    save("mobilenet_tuple", MobileNetTuple(a.channels, a.classes), trace=True)

    with open(os.path.join(a.out, "not_an_archive.pt"), "wb") as f:
        f.write(bytes(range(256)) * 4)
    manifest["refused"].append({"name": "not_an_archive", "error": "not a TorchScript archive"})
    torch.jit.script(ResNet8(a.channels, 7)).save(os.path.join(a.out, "wrong_classes.pt"))
    manifest["refused"].append({"name": "wrong_classes", "error": f"has {a.classes} classes"})
    other = 3 if a.channels != 3 else 1
    torch.jit.script(ResNet8(other, a.classes)).save(os.path.join(a.out, "three_channels.pt"))
    manifest["refused"].append({"name": "three_channels", "error": "forward rejects a batch"})
    torch.jit.script(NoParameters(a.classes)).save(os.path.join(a.out, "no_parameters.pt"))
    manifest["refused"].append({"name": "no_parameters", "error": "no floating-point parameters"})

    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"students: {len(manifest['students'])} written, {len(manifest['refused'])} to refuse, "
          f"in {a.out}")


if __name__ == "__main__":
    main()
