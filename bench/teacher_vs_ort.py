#!/usr/bin/env python3
"""kdflow's oneDNN teacher against ONNX Runtime (CPU execution provider, all graph optimizations,
same threads, same batch, same exported file), measured in one run, model by model, over a broad
set of networks (torchvision CNNs, ConvNeXt, a DeiT-tiny-shaped ViT, a TransformerEncoder
classifier) at the input sizes people distil at. Run with the kdflow venv's python (torch,
torchvision, onnxruntime, onnxscript).

usage: teacher_vs_ort.py KDFLOW_BINARY OUT_JSON [--seconds S] [--threads 1 2] [--sizes 32 64 224]
                         [--models NAME...] [--exporter dynamo|legacy] [--tune auto|off]
                         [--no-bf16] [--check-only] [--throughput N...] [--note TEXT]
                         [--plan-cache DIR] [--rounds R]

Each model is exported by torch.onnx.export (the dynamo exporter with a dynamic batch unless
--exporter legacy) once per input size. Rates are images/s from the median batch time; ORT and
kdflow alternate per model so that drifts in the machine's speed hit both; with --rounds R they
alternate R times (ORT, kdflow fp32, ORT, ...) and each side's rate is the median of its rounds
(the upper middle of an even count), every round kept in the result, so that a slow spell on a
shared machine moves one round, not the ratio. Each run also keeps
kdflow's and ORT's shares of the FMA peak that kdflow's bench measured, both counting the
network's direct multiply-adds (scripts/ort_table.py turns them into the README's table). The
bench measures the peak at the vector width its engine runs at: under ONEDNN_MAX_CPU_ISA=AVX2 the
AVX2 peak, which ONNX Runtime (not capped) can exceed; the run names it (peak_isa).

--throughput N...: the throughput mode instead (fp32): images/s on N physical cores (one CPU of
each core, the cores kdflow's teacher takes), for every split of them into replicas x threads:
kdflow's `teacher bench --replicas R --threads T` against R ONNX Runtime sessions of T threads run
at once from Python threads (ORT releases the GIL in run), each session made on a thread bound to
its own T cores (its intra-op threads inherit the binding). Each side's best split, and the ratio of
the two bests, per model, size and N.
"""
import argparse
import contextlib
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from make_teacher_fixtures import EncoderClassifier  # noqa: E402 (the test fixtures' classifier)
from int8_teacher import cpu_id  # noqa: E402 (the CPU's family and core, as every bench names it)

warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)


def deit_tiny(size):
    # DeiT-tiny's shape (vit_b_16's structure at width 192, 3 heads); 8x8 patches at 32 and 64,
    # 16x16 at 224 (196 tokens, as DeiT).
    patch = 16 if size >= 224 else size // 8
    m = torchvision.models.VisionTransformer(image_size=size, patch_size=patch, num_layers=12,
                                             num_heads=3, hidden_dim=192, mlp_dim=768, num_classes=10)
    # torchvision zero-initializes the head: all-zero logits would make the check against ORT
    # vacuous.
    torch.nn.init.normal_(m.heads.head.weight, std=0.05)
    return m


def model_set():
    tv = torchvision.models
    cnn = lambda f: (lambda size: f(num_classes=10))  # noqa: E731 (any input size)
    # name: (constructor taking the input size, channels, whether it runs at every size)
    return {
        "resnet18": (cnn(tv.resnet18), 3),
        "resnet50": (cnn(tv.resnet50), 3),
        "mobilenet_v2": (cnn(tv.mobilenet_v2), 3),
        "mobilenet_v3_large": (cnn(tv.mobilenet_v3_large), 3),
        "efficientnet_b0": (cnn(tv.efficientnet_b0), 3),
        "regnet_y_400mf": (cnn(tv.regnet_y_400mf), 3),
        "shufflenet_v2_x1_0": (cnn(tv.shufflenet_v2_x1_0), 3),
        "squeezenet1_1": (cnn(tv.squeezenet1_1), 3),
        "densenet121": (cnn(tv.densenet121), 3),
        "mnasnet1_0": (cnn(tv.mnasnet1_0), 3),
        "convnext_tiny": (cnn(tv.convnext_tiny), 3),
        "deit_tiny": (deit_tiny, 3),
        # The families the coverage work added ops for (Swin's mask, Swin V2's cosine attention,
        # MaxViT's Einsum, AlexNet's gather, a GroupNorm ResNet).
        "swin_t": (cnn(tv.swin_t), 3),
        "swin_v2_t": (cnn(tv.swin_v2_t), 3),
        "maxvit_t": (lambda size: tv.maxvit_t(num_classes=10, input_size=(size, size)), 3),
        "alexnet": (cnn(tv.alexnet), 3),
        "resnet18_groupnorm": (lambda size: tv.resnet18(
            num_classes=10, norm_layer=lambda c: torch.nn.GroupNorm(8, c)), 3),
        "transformer_encoder": (
            lambda size: EncoderClassifier(width=size, dim=128, layers=4, expansion=4), 1),
    }


def export(model, shape, path, exporter):
    model.eval()
    x = torch.randn(2, *shape)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        export_quietly(model, x, path, exporter)


def export_quietly(model, x, path, exporter):
    if exporter == "legacy":
        torch.onnx.export(model, x, path, opset_version=17, dynamo=False, input_names=["input"],
                          output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    else:
        torch.onnx.export(model, (x,), path, dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))


def error_vs_ort(binary, path, shape, batch, tune):
    """max |kdflow - ORT| / max |ORT| of the logits on one random batch (fp32): the rates below
    are rates of the same function."""
    x = np.random.default_rng(2).standard_normal((batch, *shape)).astype(np.float32)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "x.npy"), x)
        subprocess.run([binary, "teacher", "infer", "--model", path, "--input", os.path.join(tmp, "x.npy"),
                        "--output", os.path.join(tmp, "y.npy"), "--threads", "1", "--tune", tune],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ))
        got = np.load(os.path.join(tmp, "y.npy"))
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def ort_session(path, threads):
    """An ONNX Runtime CPU session of `threads` intra-op threads, every graph optimization on."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_images_per_s(path, shape, batch, threads, seconds):
    sess = ort_session(path, threads)
    name = sess.get_inputs()[0].name
    x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
    sess.run(None, {name: x})
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(times) < 3:
        t0 = time.perf_counter()
        sess.run(None, {name: x})
        times.append(time.perf_counter() - t0)
    times.sort()
    return batch / times[len(times) // 2]


def kdflow_bench(binary, path, batch, threads, precision, seconds, tune):
    """kdflow teacher bench's JSON, or None where the precision is refused on this CPU (exit 2)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([binary, "teacher", "bench", "--model", path, "--batch", str(batch),
                            "--threads", str(threads), "--precision", precision, "--seconds",
                            str(seconds), "--profile", "--json", f.name, "--tune", tune],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode == 2 and precision == "bf16":
            return None
        if r.returncode != 0:
            raise RuntimeError(f"kdflow teacher bench {path} {precision}: {r.stderr.strip()}")
        return json.load(open(f.name))


def physical_cpus():
    """One CPU of each physical core this process may use, in core order (what kdflow pins)."""
    allowed = sorted(os.sched_getaffinity(0))
    seen, cpus = set(), []
    for cpu in allowed:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
                core = f.read().strip()
        except OSError:
            core = str(cpu)
        if core not in seen:
            seen.add(core)
            cpus.append(cpu)
    return cpus


def splits(n):
    """Every (replicas, threads) with replicas x threads = n."""
    return [(r, n // r) for r in range(1, n + 1) if n % r == 0]


def ort_throughput(path, shape, batch, sessions, threads, cpus, seconds):
    """images/s of `sessions` ORT sessions of `threads` threads each, run at once, session k made on
    (and its thread pool inheriting) cpus[k * threads:(k + 1) * threads]."""
    import threading
    x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
    ready = threading.Barrier(sessions)
    rates, errors = [0.0] * sessions, []

    def one(k):
        try:
            os.sched_setaffinity(0, set(cpus[k * threads:(k + 1) * threads]))
            sess = ort_session(path, threads)
            name = sess.get_inputs()[0].name
            for _ in range(3):
                sess.run(None, {name: x})
        except Exception as e:  # noqa: BLE001 (reported after the others finish)
            errors.append(e)
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or n < 3:
            sess.run(None, {name: x})
            n += 1
        rates[k] = n * batch / (time.perf_counter() - start)

    workers = [threading.Thread(target=one, args=(k,)) for k in range(sessions)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return sum(rates)


def kdflow_throughput(binary, path, batch, replicas, threads, seconds, tune):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        r = subprocess.run([binary, "teacher", "bench", "--model", path, "--batch", str(batch),
                            "--threads", str(threads), "--replicas", str(replicas), "--seconds",
                            str(seconds), "--json", f.name, "--tune", tune],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"kdflow teacher bench {path} --replicas {replicas}: {r.stderr.strip()}")
        return json.load(open(f.name))["images_per_s"]


def throughput_runs(args, name, size, shape, path):
    """The throughput mode's rows for one exported file: each N of --throughput."""
    cpus = physical_cpus()
    rows = []
    for n in args.throughput:
        if n > len(cpus):
            print(f"{name:20s} {size:3d} {n} cores: skipped, {len(cpus)} physical cores here", flush=True)
            continue
        kd, rt = [], []
        for replicas, threads in splits(n):  # alternating, so that drifts hit both sides
            rt.append({"sessions": replicas, "threads": threads, "images_per_s":
                       ort_throughput(path, shape, args.batch, replicas, threads, cpus, args.seconds)})
            kd.append({"replicas": replicas, "threads": threads, "images_per_s":
                       kdflow_throughput(args.kdflow, path, args.batch, replicas, threads,
                                         args.seconds, args.tune)})
        best_kd = max(kd, key=lambda e: e["images_per_s"])
        best_rt = max(rt, key=lambda e: e["images_per_s"])
        row = {"model": name, "size": size, "cores": n, "kdflow": kd, "onnxruntime": rt,
               "kdflow_best": best_kd, "onnxruntime_best": best_rt,
               "best_vs_best": best_kd["images_per_s"] / best_rt["images_per_s"]}
        rows.append(row)
        print(f"{name:20s} {size:3d} {n} cores: kdflow {best_kd['images_per_s']:8.1f} "
              f"({best_kd['replicas']}x{best_kd['threads']})  ORT {best_rt['images_per_s']:8.1f} "
              f"({best_rt['sessions']}x{best_rt['threads']})  {row['best_vs_best']:.2f}x", flush=True)
    return rows


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa():
    """The vector ISA flags that decide the kernels (AVX2, the AVX-512 family, AMX), from cpuinfo:
    a model name alone ("AMD EPYC") does not say which machine of a family ran."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split()
                              if f in ("avx2", "fma") or f.startswith(("avx512", "amx", "avx_vnni")))
    except OSError:
        pass
    return []


def largest_kinds(run, k=3):
    """The profile's k kinds of step that took the longest, longest first."""
    return sorted(run["profile"]["by_kind"], key=lambda e: -e["ms"])[:k]


def slowest_kinds(run):
    return {e["kind"]: round(e["ms"], 2) for e in largest_kinds(run)}


def slowest_kinds_peak_share(run):
    """The same kinds' shares of the FMA peak (null for kinds without products)."""
    return {e["kind"]: None if e.get("peak_share") is None else round(e["peak_share"], 4)
            for e in largest_kinds(run)}


def reorders(run):
    """The plan's layout copies: how many steps, their time and share of the batch (profile)."""
    kind = next((e for e in run["profile"]["by_kind"] if e["kind"] == "reorder"), None)
    if kind is None:
        return {"steps": 0, "ms": 0.0, "share": 0.0}
    return {"steps": kind["steps"], "ms": round(kind["ms"], 2), "share": round(kind["share"], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kdflow")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--sizes", type=int, nargs="*", default=[32, 64, 224])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--exporter", choices=["dynamo", "legacy"], default="dynamo")
    ap.add_argument("--tune", choices=["auto", "off"], default="auto")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="ORT and kdflow fp32 measured this many times each, alternating")
    ap.add_argument("--check-only", action="store_true",
                    help="only compare kdflow's logits with ONNX Runtime's, time nothing")
    ap.add_argument("--throughput", type=int, nargs="*",
                    help="images/s on N physical cores, each side's best replicas x threads")
    ap.add_argument("--note", default="", help="what this run measures, kept in the result")
    ap.add_argument("--plan-cache", default="",
                    help="kdflow's tuned plans from and into this folder (default: an empty one "
                         "of this run's, so that every plan is tuned here and now)")
    args = ap.parse_args()
    if args.rounds < 1 or (args.rounds > 1 and args.throughput):
        ap.error(f"--rounds {args.rounds}: at least 1, and 1 in the throughput mode")
    torch.manual_seed(0)
    models = model_set()
    chosen = args.models or list(models)
    result = {"benchmark": "teacher_vs_onnxruntime", "batch": args.batch, "classes": 10,
              "exporter": args.exporter, "tune": args.tune, "rounds": args.rounds,
              "plan_cache": args.plan_cache or "empty, this run's",
              "machine": {"cpu": cpu_name(), "cpu_id": cpu_id(), "isa_flags": cpu_isa(),
                          "cpus": os.cpu_count(),
                          "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "")},
              "onnxruntime": ort.__version__, "torch": torch.__version__,
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, cwd=os.path.dirname(os.path.abspath(__file__))
                                       ).stdout.strip(),
              "runs": [], "throughput": []}
    if args.note:
        result["note"] = args.note
    with tempfile.TemporaryDirectory() as tmp:
        # kdflow's plans: tuned in this run unless asked otherwise (a plan cached by another run
        # may have been tuned by another build or, before plans named the core, another CPU)
        os.environ["KDFLOW_CACHE_DIR"] = args.plan_cache or os.path.join(tmp, "plan_cache")
        for name in chosen:
            make, channels = models[name]
            sizes = [28] if name == "transformer_encoder" else args.sizes
            if name == "maxvit_t":  # every stage's map a multiple of its 7x7 partition
                sizes = [s for s in sizes if s % 224 == 0]
            for size in sizes:
                shape = (channels, size, size)
                path = os.path.join(tmp, f"{name}_{size}.onnx")
                try:
                    export(make(size), shape, path, args.exporter)
                except Exception as e:  # an exporter failure is the exporter's, not kdflow's
                    result["runs"].append({"model": name, "size": size, "export_error": str(e)[:300]})
                    print(f"{name:20s} {size:3d}: export failed: {str(e)[:120]}", flush=True)
                    continue
                error = error_vs_ort(args.kdflow, path, shape, args.batch, args.tune)
                if args.check_only:
                    result["runs"].append({"model": name, "size": size, "fp32_error_vs_onnxruntime": error})
                    print(f"{name:20s} {size:3d}: error {error:.1e}", flush=True)
                    with open(args.out, "w") as f:
                        json.dump(result, f, indent=2)
                    os.remove(path)
                    continue
                if args.throughput:
                    for row in throughput_runs(args, name, size, shape, path):
                        row["fp32_error_vs_onnxruntime"] = error
                        result["throughput"].append(row)
                        with open(args.out, "w") as f:
                            json.dump(result, f, indent=2)
                    os.remove(path)
                    continue
                for threads in args.threads:
                    ort_rates, fp32_runs = [], []
                    for _ in range(args.rounds):
                        ort_rates.append(ort_images_per_s(path, shape, args.batch, threads,
                                                          args.seconds))
                        fp32_runs.append(kdflow_bench(args.kdflow, path, args.batch, threads,
                                                      "fp32", args.seconds, args.tune))
                    ort_rate = statistics.median_high(ort_rates)
                    fp32 = sorted(fp32_runs, key=lambda r: r["images_per_s"])[len(fp32_runs) // 2]
                    bf16 = None if args.no_bf16 else kdflow_bench(
                        args.kdflow, path, args.batch, threads, "bf16", args.seconds, args.tune)
                    run = {"model": name, "size": size, "threads": threads,
                           "gflops_per_image": fp32["flops_per_sample"] / 1e9,
                           "onnxruntime_images_per_s": ort_rate,
                           "kdflow_fp32_images_per_s": fp32["images_per_s"],
                           "fp32_vs_onnxruntime": fp32["images_per_s"] / ort_rate,
                           "fp32_error_vs_onnxruntime": error,
                           "tune": fp32.get("tune"),
                           "fp32_peak_fraction": fp32["peak_fraction"],
                           # the same multiply-adds against the same measured peak: ORT's share
                           # (under ONEDNN_MAX_CPU_ISA the peak is the capped width's, which ORT,
                           # not capped, can pass)
                           "onnxruntime_peak_fraction":
                               fp32["peak_fraction"] * ort_rate / fp32["images_per_s"],
                           "peak_gflops_per_s": fp32["peak_gflops_per_s"],
                           "peak_isa": fp32["peak_isa"],
                           "isa": fp32["isa"],
                           "fp32_slowest_kinds_ms": slowest_kinds(fp32),
                           "fp32_slowest_kinds_peak_share": slowest_kinds_peak_share(fp32),
                           "fp32_reorders": reorders(fp32)}
                    if args.rounds > 1:
                        run["rounds"] = {
                            "onnxruntime_images_per_s": ort_rates,
                            "kdflow_fp32_images_per_s": [r["images_per_s"] for r in fp32_runs]}
                    if bf16 is not None:
                        run["kdflow_bf16_images_per_s"] = bf16["images_per_s"]
                        run["bf16_vs_kdflow_fp32"] = bf16["images_per_s"] / fp32["images_per_s"]
                    result["runs"].append(run)
                    bf16_text = (f"bf16 {bf16['images_per_s']:8.1f} ({run['bf16_vs_kdflow_fp32']:.2f}x fp32)"
                                 if bf16 else "bf16 -")
                    print(f"{name:20s} {size:3d} {threads} thr: ORT {ort_rate:8.1f}  kdflow fp32 "
                          f"{fp32['images_per_s']:8.1f} ({run['fp32_vs_onnxruntime']:.2f}x ORT, "
                          f"{100 * fp32['peak_fraction']:.0f}% peak, ORT "
                          f"{100 * run['onnxruntime_peak_fraction']:.0f}%, error {error:.1e})  {bf16_text}",
                          flush=True)
                    with open(args.out, "w") as f:  # partial results survive an interrupted run
                        json.dump(result, f, indent=2)
                os.remove(path)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
