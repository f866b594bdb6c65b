#!/usr/bin/env python3
"""teacher.precision = int8 against fp32 (and bf16 where the CPU has it), measured in one run:
top-1 agreement and KL of the int8 logits against fp32 on the whole Fashion-MNIST test set, for the
shipped teacher and for a ResNet-18 and a MobileNetV2 (torchvision's) trained here by this script
under a fixed seed; and the rate of each precision (`kdflow teacher bench`, same batch and threads)
on those and on torchvision's ResNet-18, MobileNetV2 and ResNet-50 at 224 x 224. Run with the kdflow
venv's python (torch, torchvision, numpy).

usage: int8_teacher.py KDFLOW_BINARY OUT_JSON [--data DIR] [--train-steps N] [--seconds S]
                       [--threads 1 2] [--models-224 resnet18 mobilenet_v2 resnet50] [--batch-224 B]
                       [--only-224]

Calibration: 576 training images (a seeded draw, unaugmented): for the rates, 8 batches of 64 and
the ninth as the check, as `kdflow train` does; for the agreement on the test set, all 576 (`teacher
infer` runs batches of 1000, so they are repeated to fill them). The test set's images are never in
it. The trained networks read Fashion-MNIST padded to 32 x 32
and repeated to 3 channels (their accuracy is reported beside the agreement); the 224 networks keep
torchvision's initialisation (a rate does not depend on the weights) and are calibrated on
Fashion-MNIST upsampled to 224.
"""
import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchvision

MEAN, STD = 0.2860, 0.3530


def idx(path, offset):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def fashion(data, split):
    prefix = "train" if split == "train" else "t10k"
    x = idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)
    y = idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"), 8).astype(np.int64)
    return (x.astype(np.float32) / 255 - MEAN) / STD, y


def as_rgb(x, size):
    t = torch.from_numpy(x)
    t = torch.nn.functional.pad(t, (2, 2, 2, 2), value=-MEAN / STD) if size == 32 else \
        torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)
    return t.repeat(1, 3, 1, 1).contiguous().numpy()


def train(arch, x, y, steps, seed):
    torch.manual_seed(seed)
    m = getattr(torchvision.models, arch)(num_classes=10)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=steps)
    g = torch.Generator().manual_seed(seed)
    m.train()
    for _ in range(steps):
        i = torch.randint(0, len(x), (128,), generator=g)
        xb = torch.from_numpy(as_rgb(x[i.numpy()], 32))
        loss = torch.nn.functional.cross_entropy(m(xb), torch.from_numpy(y[i.numpy()]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return m.eval()


def export(m, size, path):
    torch.onnx.export(m, torch.zeros(1, 3, size, size), path, dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def kl_top1(ref, other):
    def log_softmax(z):
        z = z.astype(np.float64)
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))
    lp, lq = log_softmax(ref), log_softmax(other)
    kl = float((np.exp(lp) * (lp - lq)).sum(1).mean())
    return float((ref.argmax(1) == other.argmax(1)).mean()), kl


def infer(kdflow, model, x, precision, calib, tmp, threads):
    """The model's logits on x through `kdflow teacher infer`, in chunks of 1000."""
    out = []
    for k in range(0, len(x), 1000):
        xi, yo = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
        np.save(xi, x[k:k + 1000])
        cmd = [kdflow, "teacher", "infer", "--model", model, "--input", xi, "--output", yo,
               "--precision", precision, "--threads", str(threads)]
        if precision == "int8":
            cmd += ["--calibration", calib]
        subprocess.run(cmd, check=True, capture_output=True)
        out.append(np.load(yo))
    return np.concatenate(out)


def bench(kdflow, model, precision, batch, threads, seconds, calib, size, extra=()):
    with tempfile.TemporaryDirectory() as d:
        j = os.path.join(d, "r.json")
        cmd = [kdflow, "teacher", "bench", "--model", model, "--precision", precision, "--batch",
               str(batch), "--threads", str(threads), "--seconds", str(seconds), "--json", j]
        cmd += list(extra)
        if size:
            cmd += ["--input-size", str(size)]
        if precision == "int8":
            cmd += ["--calibration", calib]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed"}
        res = json.load(open(j))
        return {"images_per_s": res["images_per_s"], "isa": res["isa"],
                "int8": res.get("int8"),
                "samples_per_pass": res.get("tune", {}).get("samples_per_pass"),
                "passes_at_once": res.get("tune", {}).get("passes_at_once"),
                # the seconds the load spent tuning (None where the plan came from the cache)
                "tune_seconds": None if res.get("tune", {}).get("from_cache", True)
                else res["tune"].get("seconds"),
                # with --profile among the options: the batch's time by kind of step
                "profile_by_kind": res.get("profile", {}).get("by_kind"),
                # where this load tuned: every node with more than one way, each way's ms per
                # batch as the tuner timed it and the way kept
                "ways": None if res.get("tune", {}).get("from_cache", True)
                else res["tune"].get("ways")}


def network_224(arch):
    """torchvision's `arch` with 10 classes, or one of bench/teacher_vs_ort.py's model set
    (deit_tiny, ...) at 224."""
    if hasattr(torchvision.models, arch):
        return getattr(torchvision.models, arch)(num_classes=10)
    from teacher_vs_ort import model_set  # here: that script imports this one
    return model_set()[arch][0](224)


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


# x86 families whose number alone names the core (AMD's: Zen 4 and Zen 5 share the ISA flags
# but not the vector units: Zen 5 runs 512-bit FMAs at full width). Intel's family 6 names none.
AMD_FAMILIES = {23: "Zen/Zen 2", 25: "Zen 3", 26: "Zen 5"}


def cpu_id():
    """The CPU's vendor, family, model and stepping from cpuinfo, and the core they name where the
    family alone does (AMD), so that a result file tells machines of one model name apart."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model", "stepping") and key not in fields:
                fields[key] = value.strip()
            if not line.strip():
                break
    except OSError:
        return {}
    out = {"vendor": fields.get("vendor_id", ""), "family": int(fields.get("cpu family", 0) or 0),
           "model": int(fields.get("model", 0) or 0), "stepping": int(fields.get("stepping", 0) or 0)}
    if out["vendor"] == "AuthenticAMD" and out["family"] in AMD_FAMILIES:
        # family 25 is Zen 3 and Zen 4; of the two only Zen 4 has AVX-512
        out["core"] = "Zen 4" if out["family"] == 25 and "avx512f" in isa_flags() else \
            AMD_FAMILIES[out["family"]]
    return out


def isa_flags():
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    keep = ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    return [f for f in keep if f in flags]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("kdflow")
    p.add_argument("out")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--models-224", nargs="*", default=["resnet18", "mobilenet_v2", "resnet50"],
                   help="torchvision's, or bench/teacher_vs_ort.py's (deit_tiny, ...)")
    p.add_argument("--batch-224", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only-224", action="store_true",
                   help="the 224 rates alone: no agreement runs, no networks trained")
    a = p.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    xtr, ytr = fashion(a.data, "train")
    xte, yte = fashion(a.data, "test")
    order = np.random.default_rng(a.seed).permutation(len(xtr))[: 9 * 64]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    result = {"benchmark": "teacher_int8", "commit": commit,
              "machine": {"cpu": cpu_name(), "cpu_id": cpu_id(), "cpus": os.cpu_count(),
                          "isa": isa_flags(),
                          "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "")},
              "torch": torch.__version__, "seed": a.seed, "train_steps": a.train_steps,
              "calibration": "agreement: the 576 training images of a seeded draw, on the 10000 "
                             "test images; rates: 8 batches of 64 of them, the ninth checked",
              "agreement": [], "rates": []}
    with tempfile.TemporaryDirectory() as tmp:
        nets = [("shipped fmnist_teacher", os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "models", "fmnist_teacher.onnx"),
            xtr[order], xte, None)]
        for arch in [] if a.only_224 else ["resnet18", "mobilenet_v2"]:
            t0 = time.time()
            m = train(arch, xtr, ytr, a.train_steps, a.seed)
            path = os.path.join(tmp, f"{arch}_32.onnx")
            export(m, 32, path)
            nets.append((f"{arch} (trained here, 32 px)", path, as_rgb(xtr[order], 32),
                         as_rgb(xte, 32), time.time() - t0))
        for name, path, calib_x, test_x, train_s in [] if a.only_224 else nets:
            calib = os.path.join(tmp, "calib.npy")
            # infer runs batches of 1000: the 576 calibration images repeated to whole batches of
            # it (the ranges are those of the 576; the check batch inside infer is a repeat)
            np.save(calib, np.concatenate([calib_x] * 4)[: 4 * 1000] if len(calib_x) < 4000
                    else calib_x)
            f32 = infer(a.kdflow, path, test_x, "fp32", calib, tmp, max(a.threads))
            i8 = infer(a.kdflow, path, test_x, "int8", calib, tmp, max(a.threads))
            top1, kl = kl_top1(f32, i8)
            row = {"model": name, "test_images": len(test_x), "top1_agreement": top1, "kl": kl,
                   "fp32_accuracy": float((f32.argmax(1) == yte).mean()),
                   "int8_accuracy": float((i8.argmax(1) == yte).mean())}
            if train_s is not None:
                row["train_seconds"] = round(train_s, 1)
            print(json.dumps(row), flush=True)
            result["agreement"].append(row)
            # rates at batch 64 on the same file and calibration (the shipped size / 32 px)
            np.save(calib, calib_x[: 9 * 64])
            for threads in a.threads:
                rates = {p_: bench(a.kdflow, path, p_, 64, threads, a.seconds, calib, None)
                         for p_ in ["fp32", "bf16", "int8"]}
                r = {"model": name, "batch": 64, "threads": threads, "rates": rates}
                if "images_per_s" in rates["int8"] and "images_per_s" in rates["fp32"]:
                    r["int8_vs_fp32"] = rates["int8"]["images_per_s"] / rates["fp32"]["images_per_s"]
                print(json.dumps(r), flush=True)
                result["rates"].append(r)
        calib224 = os.path.join(tmp, "calib224.npy")
        b = a.batch_224
        np.save(calib224, as_rgb(xtr[order[: 3 * b]], 224))
        for arch in a.models_224:
            torch.manual_seed(a.seed)
            path = os.path.join(tmp, f"{arch}_224.onnx")
            export(network_224(arch).eval(), 224, path)
            for threads in a.threads:
                rates = {p_: bench(a.kdflow, path, p_, b, threads, a.seconds, calib224, None)
                         for p_ in ["fp32", "bf16", "int8"]}
                r = {"model": f"{arch} (torchvision init, 224 px)", "batch": b,
                     "threads": threads, "rates": rates}
                if "images_per_s" in rates["int8"] and "images_per_s" in rates["fp32"]:
                    r["int8_vs_fp32"] = rates["int8"]["images_per_s"] / rates["fp32"]["images_per_s"]
                if "images_per_s" in rates["bf16"] and "images_per_s" in rates["fp32"]:
                    r["bf16_vs_fp32"] = rates["bf16"]["images_per_s"] / rates["fp32"]["images_per_s"]
                print(json.dumps(r), flush=True)
                result["rates"].append(r)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
