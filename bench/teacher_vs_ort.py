#!/usr/bin/env python3
"""kdflow's oneDNN teacher against ONNX Runtime (CPU execution provider, all graph optimizations,
same threads, same batch), measured in one run on the same exported models. Run with the kdflow
venv's python (torch, torchvision, onnxruntime).

usage: teacher_vs_ort.py KDFLOW_BINARY OUT_JSON [--seconds S] [--threads 1 2]
"""
import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch
import torchvision

warnings.filterwarnings("ignore")


def export(name, model, path):
    model.eval()
    torch.onnx.export(model, torch.randn(1, 3, 32, 32), path, opset_version=17, dynamo=False,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def ort_images_per_s(path, batch, threads, seconds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"input": x})
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 5:
        t0 = time.perf_counter()
        sess.run(None, {"input": x})
        times.append(time.perf_counter() - t0)
    times.sort()
    return batch / times[len(times) // 2]


def kdflow_bench(binary, path, batch, threads, precision, seconds):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "teacher", "bench", "--model", path, "--batch", str(batch), "--threads", str(threads),
                        "--precision", precision, "--seconds", str(seconds), "--profile", "--json", f.name],
                       check=True,
                       stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def time_by_kind(fp32, bf16):
    """Per kind of step (kdflow teacher bench --profile): ms per batch in fp32 and bf16, and the
    speed-up bf16 gives that kind, which says where bf16's overall ratio comes from."""
    ms = {p: {k["kind"]: k["ms"] for k in run["profile"]["by_kind"]} for p, run in (("fp32", fp32), ("bf16", bf16))}
    kinds = sorted(set(ms["fp32"]) | set(ms["bf16"]), key=lambda k: -ms["fp32"].get(k, 0.0))
    return {k: {"fp32_ms": ms["fp32"].get(k, 0.0), "bf16_ms": ms["bf16"].get(k, 0.0),
                "bf16_speedup": ms["fp32"].get(k, 0.0) / ms["bf16"][k] if ms["bf16"].get(k) else None}
            for k in kinds}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kdflow")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    torch.manual_seed(0)
    models = {"resnet18": torchvision.models.resnet18(num_classes=10),
              "mobilenet_v2": torchvision.models.mobilenet_v2(num_classes=10)}
    result = {"benchmark": "teacher_vs_onnxruntime", "batch": args.batch, "input": [3, 32, 32], "classes": 10,
              "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
              "onnxruntime": ort.__version__, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models.items():
            path = os.path.join(tmp, name + ".onnx")
            export(name, model, path)
            for threads in args.threads:
                ort_rate = ort_images_per_s(path, args.batch, threads, args.seconds)
                fp32 = kdflow_bench(args.kdflow, path, args.batch, threads, "fp32", args.seconds)
                bf16 = kdflow_bench(args.kdflow, path, args.batch, threads, "bf16", args.seconds)
                run = {"model": name, "threads": threads,
                       "onnxruntime_images_per_s": ort_rate,
                       "kdflow_fp32_images_per_s": fp32["images_per_s"],
                       "kdflow_bf16_images_per_s": bf16["images_per_s"],
                       "fp32_vs_onnxruntime": fp32["images_per_s"] / ort_rate,
                       "bf16_vs_kdflow_fp32": bf16["images_per_s"] / fp32["images_per_s"],
                       "fp32_peak_fraction": fp32["peak_fraction"], "bf16_peak_fraction": bf16["peak_fraction"],
                       "peak_gflops_per_s": fp32["peak_gflops_per_s"], "isa": fp32["isa"],
                       "native_bf16": bf16["native_bf16"],
                       "time_by_kind": time_by_kind(fp32, bf16)}
                result["runs"].append(run)
                print(f"{name:13s} {threads} thr: ORT {ort_rate:8.1f}  kdflow fp32 {fp32['images_per_s']:8.1f} "
                      f"({run['fp32_vs_onnxruntime']:.2f}x ORT, {100 * fp32['peak_fraction']:.0f}% peak)  "
                      f"bf16 {bf16['images_per_s']:8.1f} ({run['bf16_vs_kdflow_fp32']:.2f}x fp32)", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
