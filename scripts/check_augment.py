#!/usr/bin/env python3
"""The loader's image transforms against torchvision's own, on the same images and the same random
draws (the project venv's python: torch, torchvision, Pillow, numpy).

Writes a small image folder (PNG, and JPEG small enough that no DCT scaling applies, so both sides
decode the same pixels), asks `kdflow data sample` for samples of a few epochs, and checks:
- training, data.random_resized_crop: the box equals what torchvision's
  RandomResizedCrop.get_params returns when its uniform draws are kdflow's (torch.empty().uniform_
  and torch.randint fed from the JSON's `draws`), and the pixels are
  F.resized_crop(img, box, [size, size], BILINEAR) (+ F.hflip where kdflow flipped);
- evaluation: the pixels are CenterCrop(size)(Resize(resize)(img));
- training without random_resized_crop: Resize(resize) then the size x size window at kdflow's
  position.
- colour jitter (data.color_jitter): torchvision's adjust_brightness/contrast/saturation/hue on the
  same samples unjittered, in kdflow's order with kdflow's factors (see check_jitter());
- batch mixing (data.mixup_alpha, data.cutmix_alpha): `kdflow data sample --batch` against
  torchvision.transforms.v2.MixUp/CutMix applied to the batch's unmixed samples with kdflow's
  draws (the Beta draw and CutMix's two torch.randint corners fed from the JSON): images within
  1e-3 of a level, the mixed one-hot targets within 1e-6.
Pixels: every value within one level of torchvision's and at least 90% equal (see compare()).
Exit 1 naming the first sample that differs. Deterministic for a given --seed."""
import argparse
import json
import os
import subprocess
import sys
from unittest import mock

import numpy as np
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F
import torchvision.transforms.v2 as T2
from PIL import Image


def make_folder(root, seed, size):
    rng = np.random.default_rng(seed)
    n = 0
    for split in ("train", "val"):
        for c in range(3):
            d = os.path.join(root, split, f"class{c}")
            os.makedirs(d, exist_ok=True)
            for k in range(6):
                # PNG any size; JPEG below twice the crop size (no DCT scaling on kdflow's side).
                jpeg = k % 2 == 1
                hi = 2 * size - 1 if jpeg else 3 * size
                h, w = (int(v) for v in rng.integers(size + 8, hi, 2))
                # smooth content plus noise: both the filter's smoothing and its rounding show
                yy, xx = np.mgrid[0:h, 0:w]
                base = np.stack([128 + 100 * np.sin(xx / (7 + c) + ch) * np.cos(yy / 11.0)
                                 for ch in range(3)], -1)
                img = np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)
                path = os.path.join(d, f"img{k}.{'jpg' if jpeg else 'png'}")
                Image.fromarray(img, "RGB").save(path, **({"quality": 92} if jpeg else {}))
                n += 1
    return n


class Draws:
    """torch.empty(1).uniform_(a, b) and torch.randint(lo, hi, ...) answered from kdflow's draws."""

    def __init__(self, draws):
        self.draws = list(draws)
        self.value = None

    def take(self):
        if not self.draws:
            raise AssertionError("torchvision asked for more draws than kdflow made")
        return self.draws.pop(0)

    def empty(self, *args, **kwargs):
        return self

    def uniform_(self, a, b):
        # torch draws a float32 tensor between float32 bounds; the draw's own value is kdflow's
        a, b = float(np.float32(a)), float(np.float32(b))
        return torch.tensor([a + (b - a) * self.take()], dtype=torch.float32)

    def item(self):
        return self.value

    def randint(self, low, high, size=None, **kwargs):
        out = Draws([])
        out.value = int(low + int(self.take() * (high - low)))
        return out


def torchvision_box(img, scale, ratio, draws):
    fake = Draws(draws)
    saved = torch.empty, torch.randint
    torch.empty, torch.randint = fake.empty, fake.randint
    try:
        box = T.RandomResizedCrop.get_params(img, list(scale), list(ratio))
    finally:
        torch.empty, torch.randint = saved
    if fake.draws:
        raise AssertionError(f"kdflow made {len(fake.draws)} draws torchvision did not use")
    return [int(v) for v in box]


def kdflow_samples(args, root, split, epoch, sets, indices=range(18), batch=None):
    out = os.path.join(args.work, f"{split}_{epoch}.npy")
    cmd = [args.kdflow, "data", "sample", "--split", split, "--epoch", str(epoch), "--out", out,
           "--set", "data.dataset=folder", "--set", f"data.path={root}",
           "--set", f"data.image_size={args.size}", "--set", f"data.resize={args.resize}",
           "--set", f"train.seed={args.seed}"]
    for s in sets:
        cmd += ["--set", s]
    if batch is None:
        for i in indices:
            cmd += ["--index", str(i)]
    else:
        cmd += ["--batch", str(batch)]
    meta = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    px = np.load(out)
    return meta, px if batch is not None else px.astype(np.uint8)


class FixedBeta:
    """torchvision's mix transforms draw lam from self._dist.sample(()): kdflow's draw instead."""

    def __init__(self, lam):
        self.lam = lam

    def sample(self, shape):
        return torch.tensor(self.lam, dtype=torch.float64)


def check_mixes(args, root, checked):
    """Batches mixed by kdflow against torchvision's MixUp/CutMix on the same unmixed samples."""
    sets = ["data.random_resized_crop=true", "data.hflip=true", "data.batch_size=6",
            "data.mixup_alpha=0.8", "data.cutmix_alpha=1.0"]
    for epoch in range(2):
        for b in range(3):
            meta, mixed = kdflow_samples(args, root, "train", epoch, sets, batch=b)
            mix = meta["mix"]
            what = f"batch {b} of epoch {epoch} ({mix['kind']})"
            _, plain = kdflow_samples(args, root, "train", epoch, sets, indices=meta["indices"])
            x = torch.from_numpy(plain.astype(np.float32))
            y = torch.tensor(meta["labels"], dtype=torch.int64)
            classes = 1 + max(max(meta["labels"]), max(meta["mix_labels"]))
            if mix["kind"] == "mixup":
                t = T2.MixUp(alpha=0.8, num_classes=classes)
                t._dist = FixedBeta(mix["lam"])
                out, target = t(x, y)
            else:
                t = T2.CutMix(alpha=1.0, num_classes=classes)
                t._dist = FixedBeta(mix["lam"])
                cy, cx = mix["centre"]
                corners = iter([torch.tensor([cx]), torch.tensor([cy])])
                with mock.patch("torch.randint", side_effect=lambda *a, **k: next(corners)):
                    out, target = t(x, y)
            diff = (out - torch.from_numpy(mixed)).abs().max().item()
            if diff > 1e-3:
                raise AssertionError(f"{what}: images differ from torchvision's by up to {diff}")
            mine = torch.zeros(len(y), classes, dtype=torch.float64)
            for i, (a, p, lam) in enumerate(zip(meta["labels"], meta["mix_labels"],
                                                 meta["mix_lam"])):
                mine[i, a] += lam
                mine[i, p] += 1 - lam
            tdiff = (target.double() - mine).abs().max().item()
            if tdiff > 1e-6:
                raise AssertionError(f"{what}: targets differ from torchvision's by {tdiff}")
            checked[mix["kind"]] += 1


def check_jitter(args, root, checked):
    """data.color_jitter against torchvision's own adjust_brightness/contrast/saturation/hue (the
    tensor functions ColorJitter calls on a uint8 tensor), applied in kdflow's order with kdflow's
    factors to the same samples without the jitter (the jitter's draw leaves the crop's and flip's
    alone): every value within one level and at least 99.5% equal (PyTorch's float32 ops, repeated;
    a truncation to uint8 may fall the other way where a vectorized op rounds differently)."""
    base = ["data.random_resized_crop=true", "data.hflip=true"]
    ranges = (0.4, 0.4, 0.4, 0.1)
    jitter = "data.color_jitter=" + ",".join(str(r) for r in ranges)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    orders, equal, total = set(), 0, 0
    for epoch in range(2):
        meta, px = kdflow_samples(args, root, "train", epoch, base + [jitter])
        _, plain = kdflow_samples(args, root, "train", epoch, base)
        for k, s in enumerate(meta["samples"]):
            what = f"{s['file']} (epoch {epoch}, color_jitter {s['jitter']})"
            x = torch.from_numpy(plain[k].copy())
            for step in s["jitter"]:
                op, factor = step["op"], step["factor"]
                lo, hi = (-ranges[3], ranges[3]) if op == 3 else (max(0, 1 - ranges[op]), 1 + ranges[op])
                if not lo <= factor <= hi:
                    raise AssertionError(f"{what}: factor {factor} outside [{lo}, {hi}]")
                x = adjust[op](x, factor)
            orders.add(tuple(step["op"] for step in s["jitter"]))
            diff = np.abs(px[k].astype(int) - x.numpy().astype(int))
            if diff.max() > 1:
                raise AssertionError(f"{what}: {int((diff > 1).sum())} values differ from "
                                     f"torchvision's by more than one, by up to {int(diff.max())}")
            equal += int((diff == 0).sum())
            total += diff.size
            checked["color_jitter"] += 1
    if len(orders) < 4:
        raise AssertionError(f"the jitter drew only {len(orders)} orders of its four adjustments")
    if equal < 0.995 * total:
        raise AssertionError(f"color_jitter: only {equal / total:.4f} of the values equal torchvision's")
    checked["color_jitter_values_equal"] = round(equal / total, 5)


VALUES = {"equal": 0, "total": 0}


def compare(what, mine, theirs):
    """Within one level: both resample as PIL does (triangle filter, PIL's fixed point, 8-bit rows
    between the passes), but the Pillow in the venv (13) runs its two passes in an order of its own
    for some shapes, and the rounding between them moves a value by one; a crop or a one-axis resize
    is exact."""
    theirs = np.asarray(theirs).transpose(2, 0, 1)
    if mine.shape != theirs.shape:
        raise AssertionError(f"{what}: shape {mine.shape} against torchvision's {theirs.shape}")
    diff = np.abs(mine.astype(int) - theirs.astype(int))
    if diff.max() > 1:
        raise AssertionError(f"{what}: {int((diff > 1).sum())} values differ by more than one, "
                             f"by up to {int(diff.max())}")
    VALUES["equal"] += int((diff == 0).sum())
    VALUES["total"] += diff.size


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kdflow", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--size", type=int, default=48)
    p.add_argument("--resize", type=int, default=56)
    p.add_argument("--seed", type=int, default=3)
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    root = os.path.join(args.work, "folder")
    images = make_folder(root, args.seed, args.size)
    checked = {"random_resized_crop": 0, "fallbacks": 0, "flips": 0, "evaluation": 0,
               "resize_crop": 0, "mixup": 0, "cutmix": 0, "color_jitter": 0}
    scale, ratio = (0.08, 1.0), (0.75, 1.3333333)
    for epoch in range(4):
        meta, px = kdflow_samples(args, root, "train", epoch,
                                  ["data.random_resized_crop=true", "data.hflip=true",
                                   f"data.crop_scale={scale[0]},{scale[1]}",
                                   f"data.crop_ratio={ratio[0]},{ratio[1]}"])
        for k, s in enumerate(meta["samples"]):
            what = f"{s['file']} (epoch {epoch}, random_resized_crop)"
            img = Image.open(s["file"]).convert("RGB")
            box = torchvision_box(img, scale, ratio, s["draws"])
            if box != s["box"]:
                raise AssertionError(f"{what}: box {s['box']}, torchvision's {box}")
            out = F.resized_crop(img, *box, [args.size, args.size], T.InterpolationMode.BILINEAR)
            if s["flip"]:
                out = F.hflip(out)
                checked["flips"] += 1
            compare(what, px[k], out)
            checked["random_resized_crop"] += 1
            checked["fallbacks"] += len(s["draws"]) == 40
    meta, px = kdflow_samples(args, root, "test", 0, [])
    for k, s in enumerate(meta["samples"]):
        img = Image.open(s["file"]).convert("RGB")
        out = T.CenterCrop(args.size)(T.Resize(args.resize, T.InterpolationMode.BILINEAR)(img))
        compare(f"{s['file']} (evaluation)", px[k], out)
        checked["evaluation"] += 1
    meta, px = kdflow_samples(args, root, "train", 1, ["data.hflip=false"])
    for k, s in enumerate(meta["samples"]):
        img = T.Resize(args.resize, T.InterpolationMode.BILINEAR)(
            Image.open(s["file"]).convert("RGB"))
        fy, fx = s["crop_at"]
        top = round(fy * (img.height - args.size))
        left = round(fx * (img.width - args.size))
        compare(f"{s['file']} (resize and crop)", px[k],
                F.crop(img, top, left, args.size, args.size))
        checked["resize_crop"] += 1
    check_mixes(args, root, checked)
    check_jitter(args, root, checked)
    if not (checked["mixup"] and checked["cutmix"]):
        raise AssertionError(f"the mixed batches drew only one kind: {checked}")
    share = VALUES["equal"] / VALUES["total"]
    if share < 0.9:
        raise AssertionError(f"only {share:.3f} of the values equal torchvision's")
    print(json.dumps({"images": images, "checked": checked, "values_equal": round(share, 5),
                      "largest_difference": 1 if share < 1 else 0}))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"check_augment: {e}", file=sys.stderr)
        sys.exit(1)
