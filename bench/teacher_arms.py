#!/usr/bin/env python3
"""`kdflow teacher bench` arms measured side by side in one run, rounds alternating between them:
two kdflow binaries (a change against the build before it), or one binary with and without an
option (an arm's --binary value may add `teacher bench` options after the path), and/or each model
beside a variant of it with one activation swapped for another (what that activation costs). torchvision's models at
--size (torchvision's initialisation under --seed: a rate does not depend on the weights), or an
.onnx file as it is, at its own input size (fp32 and bf16), int8
calibrated on Fashion-MNIST upsampled to the size, as bench/int8_teacher.py does. Each binary
keeps its own plan cache folder (a fresh temporary one), so each tunes its own plans. Run with the
kdflow venv's python (torch, torchvision, numpy).

usage: teacher_arms.py OUT_JSON --binary "NAME=PATH [OPTION ...]" [--binary ...]
                       [--models mobilenet_v2 ...] [--swap-activation SiLU:ReLU]
                       [--precisions fp32 int8] [--threads 1 2] [--batch 16] [--size 224]
                       [--rounds 3] [--seconds 3] [--note TEXT]

The JSON names the CPU, its ISA flags, the tree's commit and each binary's path; for every model
(and variant), precision and thread count: each arm's images/s per round, their median, the median
over the same model's with the first binary (over_first_binary) and over the unswapped model's
with the same binary (over_unswapped), the samples per pass (and passes at once) each run's
plan kept, the seconds each run's load spent tuning (null where it read its arm's cache), every
node with more than one way, what the tuner timed for each way and the way it kept (ways, from
the run that tuned), and where an arm's options include --profile, each run's batch time by kind
of step (profile_by_kind).
"""
import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import int8_teacher as it  # noqa: E402  (export, Fashion-MNIST, bench, CPU name)


def construct(arch, size):
    """torchvision's `arch` (1000 classes), else the model of that name in teacher_vs_ort.py's set
    (three-channel input only, as the export here makes)."""
    if hasattr(torchvision.models, arch):
        return getattr(torchvision.models, arch)(num_classes=1000)
    import teacher_vs_ort  # noqa: E402  (onnxruntime too: the venv has it)
    found = teacher_vs_ort.model_set().get(arch)
    if found is None or found[1] != 3:
        sys.exit(f"teacher_arms.py: --models {arch}: neither a torchvision model nor a "
                 "three-channel model of bench/teacher_vs_ort.py")
    return found[0](size)


def swapped(model, old, new):
    """`model` with every module of class `old` (torch.nn) replaced by a fresh `new`."""
    old_cls, new_cls = getattr(torch.nn, old), getattr(torch.nn, new)
    count = 0
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, old_cls):
                setattr(parent, name, new_cls())
                count += 1
    if count == 0:
        sys.exit(f"teacher_arms.py: the model has no torch.nn.{old} to swap")
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--binary", action="append", required=True,
                   help="NAME=PATH, then any `teacher bench` options for that arm (repeatable)")
    p.add_argument("--models", nargs="+", default=["mobilenet_v2"],
                   help="torchvision model names, the three-channel names of "
                        "bench/teacher_vs_ort.py's set (resnet18_groupnorm, deit_tiny), or an "
                        ".onnx file, run at its own input size (fp32 and bf16 only)")
    p.add_argument("--swap-activation", help="OLD:NEW, torch.nn class names (SiLU:ReLU)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--note", default="")
    a = p.parse_args()
    binaries = []
    extra = {}  # name -> the arm's own `teacher bench` options
    for b in a.binary:
        words = shlex.split(b)
        name, _, path = (words[0] if words else "").partition("=")
        if not name or not os.access(path, os.X_OK) or name in extra:
            sys.exit(f"teacher_arms.py: --binary {b}: want a new NAME=PATH to an executable")
        binaries.append((name, os.path.abspath(path)))
        extra[name] = words[1:]

    with tempfile.TemporaryDirectory() as tmp:
        x, _ = it.fashion(a.data, "train")
        rng = np.random.default_rng(a.seed)
        sel = rng.choice(len(x), 9 * a.batch, replace=False)
        calib = os.path.join(tmp, "calib.npy")
        np.save(calib, it.as_rgb(x[sel], a.size))
        models = []  # (label, onnx path, the unswapped model's label)
        own_size = set()  # .onnx files given as they are: benched at their own input size
        for arch in a.models:
            if arch.endswith(".onnx"):
                if not os.path.isfile(arch):
                    sys.exit(f"teacher_arms.py: --models {arch}: no such file")
                if "int8" in a.precisions or a.swap_activation:
                    sys.exit(f"teacher_arms.py: --models {arch}: an .onnx file runs in fp32 and "
                             "bf16 only, unswapped (int8 calibrates on the --size images)")
                models.append((arch, os.path.abspath(arch), arch))
                own_size.add(arch)
                continue
            for swap in [None] + ([a.swap_activation] if a.swap_activation else []):
                torch.manual_seed(a.seed)
                m = construct(arch, a.size).eval()
                label = arch
                if swap:
                    old, _, new = swap.partition(":")
                    m = swapped(m, old, new)
                    label = f"{arch} ({old} -> {new})"
                path = os.path.join(tmp, f"{arch}{'_' + swap.replace(':', '_') if swap else ''}.onnx")
                it.export(m, a.size, path)
                models.append((label, path, arch))
        caches = {name: tempfile.mkdtemp(dir=tmp) for name, _ in binaries}
        # (arm label, model, the unswapped model, onnx path, binary name, binary path)
        arms = [(f"{label} / {name}" if len(binaries) > 1 else label, label, arch, path, name,
                 binary) for label, path, arch in models for name, binary in binaries]
        runs = []
        for precision in a.precisions:
            for threads in a.threads:
                rates = {arm[0]: [] for arm in arms}
                passes = {arm[0]: [] for arm in arms}
                at_once = {arm[0]: [] for arm in arms}
                tuning = {arm[0]: [] for arm in arms}
                profiles = {arm[0]: [] for arm in arms}
                ways = {arm[0]: None for arm in arms}
                errors = {}
                for _ in range(a.rounds):
                    for label, _, arch, path, name, binary in arms:
                        os.environ["KDFLOW_CACHE_DIR"] = caches[name]
                        r = it.bench(binary, path, precision, a.batch, threads, a.seconds, calib,
                                     None if arch in own_size else a.size, extra[name])
                        if "error" in r:
                            errors[label] = r["error"]
                        else:
                            rates[label].append(r["images_per_s"])
                            passes[label].append(r["samples_per_pass"])
                            at_once[label].append(r["passes_at_once"])
                            tuning[label].append(r["tune_seconds"])
                            if r["profile_by_kind"] is not None:
                                profiles[label].append(r["profile_by_kind"])
                            if r["ways"] is not None:
                                ways[label] = r["ways"]
                row = {"precision": precision, "threads": threads, "arms": {}}
                med = {}
                for label, model, arch, _, name, _ in arms:
                    v = sorted(rates[label])
                    med[(model, name)] = v[len(v) // 2] if v else None
                for label, model, arch, _, name, _ in arms:
                    m = med[(model, name)]
                    first = med[(model, binaries[0][0])]  # the same model, the first binary
                    plain = med[(arch, name)]  # the unswapped model, the same binary
                    row["arms"][label] = {
                        "model": model, "binary": name, "images_per_s": rates[label], "median": m,
                        "samples_per_pass": passes[label], "passes_at_once": at_once[label],
                        "tune_seconds": tuning[label],
                        "profile_by_kind": profiles[label] or None,
                        "ways": ways[label],
                        "over_first_binary": m / first if m and first else None,
                        "over_unswapped": m / plain if m and plain else None,
                        "error": errors.get(label)}
                runs.append(row)
                print(json.dumps(row), flush=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    out = {"cpu": it.cpu_name(), "cpu_id": it.cpu_id(), "isa_flags": it.isa_flags(),
           "machine": platform.machine(),
           "commit": commit, "binaries": {n: [b] + extra[n] for n, b in binaries},
           "models": a.models,
           "swap_activation": a.swap_activation, "batch": a.batch, "size": a.size,
           "rounds": a.rounds, "seconds": a.seconds, "seed": a.seed, "note": a.note,
           "python": sys.executable, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
