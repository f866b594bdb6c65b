#!/usr/bin/env python3
"""Runs students kdflow exported through the tools people deploy with, against the logits kdflow's
LibTorch student gave: every NAME.onnx through ONNX Runtime (and onnx.checker), every NAME.pt
through torch.jit.load in eval mode, on NAME.input.npy, compared with NAME.logits.npy. Run with the
kdflow venv's python (onnx, onnxruntime, torch).

usage: check_export.py DIR [--tolerance 1e-4]

Prints one JSON line per file (max normalized error: max |ours - theirs| / max(1, max |theirs|),
and top-1 agreement); exits 1 when any file is over the tolerance or disagrees on a top-1, 2 when
DIR holds no export.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np


def run_onnx(path, x):
    import onnx
    import onnxruntime as ort
    onnx.checker.check_model(onnx.load(path), full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    return session.run(None, {name: x})[0]


def run_torchscript(path, x):
    import torch
    m = torch.jit.load(path, map_location="cpu")
    m.eval()
    with torch.no_grad():
        out = m(torch.from_numpy(x))
    if isinstance(out, (tuple, list)):
        out = out[0]
    elif isinstance(out, dict):
        out = out["logits"] if "logits" in out else next(iter(out.values()))
    return out.numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "*.onnx")) + glob.glob(os.path.join(a.dir, "*.pt")))
    if not files:
        print(f"{a.dir}: no exported student", file=sys.stderr)
        return 2
    ok = True
    for path in files:
        base = os.path.splitext(path)[0]
        x = np.load(base + ".input.npy")
        want = np.load(base + ".logits.npy")
        got = run_onnx(path, x) if path.endswith(".onnx") else run_torchscript(path, x)
        error = float(np.abs(got - want).max() / max(1.0, float(np.abs(want).max())))
        agree = float((got.argmax(1) == want.argmax(1)).mean())
        good = got.shape == want.shape and error <= a.tolerance and agree == 1.0
        ok &= good
        print(json.dumps({"file": os.path.basename(path), "max_normalized_error": error,
                          "top1_agreement": agree, "ok": good}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
