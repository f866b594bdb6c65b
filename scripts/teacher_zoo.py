#!/usr/bin/env python3
"""Teacher coverage: exports every classifier builder of torchvision.models (and, where timm is
installed, the timm families distillation papers use) with both of PyTorch's ONNX exporters, runs
each file through `kdflow teacher infer` and compares the logits with PyTorch's on the same input.
Run with the kdflow venv's python (torch 2.11, torchvision, onnxscript; timm optional).

usage: teacher_zoo.py --kdflow BIN --out DIR [--json FILE] [--only NAME...] [--exporters dynamo,legacy]
                      [--batch 2] [--seed 0] [--max-params 700e6] [--keep] [--fail-on-error]
                      [--profile] [--bf16]

A model is built with random weights (seeded), at a small input its architecture allows
(`size_of`), run by PyTorch in fp32, exported by the dynamo exporter (dynamic batch) and by the
legacy exporter (opset 17, dynamic batch axis), and each file is run by kdflow (teacher.tune off:
coverage, not speed). The result per model and exporter: ok with the normalized error
(max |kdflow - torch| / max |torch|), `refused` with kdflow's one-line message, `export` where
PyTorch's own exporter fails, or `skipped` above --max-params (export time and memory, not a
kdflow limit). With --json the table is written there (the CPU and commit named), after each
model; with --only as well, the other models' rows already in it are kept. Exit 1 with
--fail-on-error when any model is refused or off by more than 1e-4 (in fp32).

--bf16: each fp32-ok file also runs under `--precision bf16` where this CPU has native bf16
(AVX512_BF16 or AMX; kdflow refuses it in one line elsewhere, recorded once as `not native`),
against PyTorch's own bf16 (CPU autocast) on the same input: `ok` where kdflow's normalized error
from the fp32 logits is at most PyTorch's bf16 error plus 2e-2 (the bound of the teacher tests'
bf16 check), with both errors and the top-1 agreement of each with fp32. Recorded, not failed on.
"""
import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
import logging  # noqa: E402

logging.disable(logging.WARNING)  # the dynamo exporter reports each pass it runs

TOLERANCE = 1e-4
BF16_MARGIN = 2e-2  # kdflow's bf16 error may exceed PyTorch's own by this much (tests' bound)


def torchvision_models():
    import torchvision
    names = torchvision.models.list_models(module=torchvision.models)
    return {f"tv.{n}": (lambda n=n: torchvision.models.get_model(n, weights=None, **tv_kwargs(n)))
            for n in names}


def extra_models():
    """Families torchvision lacks a builder for: a BiT-style ResNet (GroupNorm in place of
    BatchNorm, the legacy exporter's InstanceNormalization over a reshape)."""
    import torchvision
    return {"extra.resnet18_groupnorm": (
        lambda: torchvision.models.resnet18(num_classes=10,
                                            norm_layer=lambda c: torch.nn.GroupNorm(8, c)), 64)}


def tv_kwargs(name):
    # Builders whose input size is a constructor argument take the small size; a 10-class head
    # keeps the files small. Everything else is the builder's default.
    kw = {"num_classes": 10}
    if name.startswith("vit_"):
        kw["image_size"] = size_of("tv." + name)
    if name.startswith("inception") or name == "googlenet":
        kw["aux_logits"] = False
        kw["init_weights"] = True
    return kw


def size_of(name):
    """The smallest input (square, pixels) the architecture allows, rounded to what its strides
    and windows need: 64 for most; windowed and patch models at their window grid; Inception's
    stem needs 75 or more."""
    base = name.split(".", 1)[1]
    if base.startswith(("alexnet", "vgg")):
        # Below 224 their adaptive pooling upsamples: the legacy exporter refuses it and the dynamo
        # exporter writes a masked fill of computed data.
        return 224
    if base.startswith("maxvit"):
        return 224  # every stage's map must be a multiple of the 7x7 partition
    if base.startswith(("inception", "googlenet")):
        return 96
    if base.startswith("vit_h_14"):
        return 56
    if base.startswith("vit_"):
        return 64
    if base.startswith(("swin",)):
        return 64
    return 64


TIMM_FAMILIES = [
    # (timm model name, input size): the families of the teacher-coverage issue, small members.
    ("deit_tiny_distilled_patch16_224", 224), ("vit_tiny_patch16_224", 224),
    ("swin_tiny_patch4_window7_224", 224), ("swinv2_cr_tiny_ns_224", 224),
    ("convnext_atto", 64), ("convnextv2_atto", 64), ("efficientnet_b0", 64),
    ("efficientnetv2_rw_t", 64), ("regnety_002", 64), ("regnetz_b16", 64), ("resnet18d", 64),
    ("resnest14d", 64), ("mobilenetv3_small_050", 64), ("mobilevit_xxs", 64), ("levit_128s", 224),
    ("poolformer_s12", 64), ("cait_xxs24_224", 224), ("beit_base_patch16_224", 224),
    ("eva02_tiny_patch14_224", 224), ("efficientformer_l1", 224), ("fastvit_t8", 64),
    ("nfnet_l0", 64), ("resnetv2_50x1_bit", 64), ("inception_v3", 96), ("xception41", 96),
]


def timm_models():
    try:
        import timm
    except ImportError:
        return {}
    out = {}
    for n, size in TIMM_FAMILIES:
        out[f"timm.{n}"] = (lambda n=n: timm.create_model(n, pretrained=False, num_classes=10), size)
    return out


def randomize(model):
    """Random weights as a trained model has them: builders zero some parameters at init (ViT's
    head, zero-init residual gammas) or scale them near zero, which would make the logits the bias
    alone and any error look zero;
    BatchNorm statistics get non-trivial values so that folding them is exercised."""
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.normal_(0.0 if p.flatten()[0] == 0 else float(p.flatten()[0]), 0.05)
            elif p.dim() >= 2 and float(p.std()) < 1e-3:  # a head scaled near zero (EVA, BEiT)
                p.normal_(0.0, 0.02)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 2.0)


def export(model, x, path, exporter):
    if exporter == "legacy":
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    else:
        torch.onnx.export(model, (x,), path, dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))


def profile(kdflow, model, out):
    """Where a file's time goes: the share of kdflow's own code (plain kernels and reference
    loops) and of its reference loops alone, each with the kinds that ran so and their shares."""
    p = subprocess.run([kdflow, "teacher", "bench", "--model", model, "--batch", "8", "--threads",
                        "1", "--seconds", "2", "--profile", "--tune", "off", "--json", out],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"profile_error": one_line(p.stderr)}
    prof = json.load(open(out))["profile"]
    os.remove(out)
    total = prof["step_ms_sum"]
    plain, reference = {}, {}
    for s in prof["steps"]:
        if s["impl"] in ("plain kernel", "reference loop"):
            plain[s["kind"]] = plain.get(s["kind"], 0) + s["ms"] / total
        if s["impl"] == "reference loop":
            reference[s["kind"]] = reference.get(s["kind"], 0) + s["ms"] / total
    return {"plain_kernel_share": round(prof["plain_kernel_share"], 4),
            "plain_kinds": {k: round(v, 4) for k, v in plain.items()},
            "reference_share": round(prof["reference_share"], 4),
            "reference_kinds": {k: round(v, 4) for k, v in reference.items()}}


def normalized_error(got, ref):
    """max |got - ref| / max |ref|; infinite where the shapes differ."""
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12))


def bf16_check(args, path, base, e, y, y_bf16, state):
    """The bf16 arm of one fp32-ok file (see --bf16); `state` remembers a refusal for the run."""
    if state.get("refused"):
        return {"status": "not native", "why": state["refused"]}
    out = f"{base}.{e}.bf16.npy"
    p = subprocess.run([args.kdflow, "teacher", "infer", "--model", path, "--input",
                        base + ".input.npy", "--output", out, "--tune", "off", "--precision",
                        "bf16"], capture_output=True, text=True)
    if p.returncode == 2 and "bf16 needs a CPU with" in p.stderr:
        state["refused"] = one_line(p.stderr)
        return {"status": "not native", "why": state["refused"]}
    if p.returncode != 0:
        return {"status": "refused", "exit": p.returncode, "why": one_line(p.stderr)}
    got = np.load(out)
    os.remove(out)
    err, torch_err = normalized_error(got, y), normalized_error(y_bf16, y)
    top1 = lambda a: a.reshape(len(a), -1).argmax(1)  # noqa: E731
    return {"status": "ok" if err <= torch_err + BF16_MARGIN else "mismatch", "error": err,
            "torch_bf16_error": torch_err,
            "top1_agreement": float((top1(got) == top1(y)).mean()) if got.shape == y.shape else 0.0,
            "torch_top1_agreement": float((top1(y_bf16) == top1(y)).mean())}


def one_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:400] if lines else ""


def cpu_name():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cpu_isa():
    """The flags that decide the teacher's kernels: AVX2, AVX-512, AVX512_BF16, AMX."""
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Flags"):
            flags = line.split(":", 1)[1].split()
            return [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return []


def head():
    """The commit kdflow was built from: KD_SOURCE_COMMIT where the binary was copied aside (a long
    run while the tree moves on), else the tree's HEAD."""
    if os.environ.get("KD_SOURCE_COMMIT"):
        return os.environ["KD_SOURCE_COMMIT"]
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()


def write_json(args, rows, exporters):
    counts = {}
    for r in rows:
        for e in exporters:
            s = r[e]["status"] if e in r else "not run"
            counts[f"{e}:{s}"] = counts.get(f"{e}:{s}", 0) + 1
    if args.json:
        rev = head()
        doc = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "isa": cpu_isa(),
               "cpus": os.cpu_count(),
               "commit": rev, "base_commit": args.base_commit or rev,
               "commit_note": "each row names the commit its kdflow was built from; rows without "
                              "one are base_commit's", "torch": torch.__version__, "batch": args.batch, "seed": args.seed,
               "tolerance": TOLERANCE, "max_params": args.max_params, "counts": counts,
               "models": sorted(rows, key=lambda r: r["model"])}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, args.json)
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kdflow", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--json")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exporters", default="dynamo,legacy")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-params", type=float, default=700e6)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--fail-on-error", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also time each ok file (`teacher bench --profile`, 1 thread, batch 8): "
                         "the share of the time in kdflow's plain kernels rather than oneDNN")
    ap.add_argument("--bf16", action="store_true",
                    help="also run each ok file in bf16 where this CPU has native bf16, against "
                         "PyTorch's own bf16 (recorded, not failed on)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)

    zoo = dict(extra_models())
    zoo.update(timm_models())
    zoo.update({k: (v, size_of(k)) for k, v in torchvision_models().items()})
    if args.only:
        unknown = [n for n in args.only if n not in zoo]
        if unknown:
            print(f"teacher_zoo: unknown model(s) {unknown}", file=sys.stderr)
            return 2
        zoo = {n: zoo[n] for n in args.only}
    exporters = args.exporters.split(",")
    rows = []
    earlier = []  # with --only and an existing --json: the other models' rows are kept
    args.base_commit = None  # the commit of rows that do not name their own
    if args.json and args.only and os.path.exists(args.json):
        with open(args.json) as f:
            old = json.load(f)
        earlier = [r for r in old["models"] if r["model"] not in zoo]
        args.base_commit = old.get("base_commit", old.get("commit"))
    bf16_state = {}
    for name, (ctor, size) in zoo.items():
        torch.manual_seed(args.seed)
        t0 = time.time()
        model = ctor().eval()
        randomize(model)
        params = sum(p.numel() for p in model.parameters())
        row = {"model": name, "size": size, "params": params, "commit": head()}
        if params > args.max_params:
            for e in exporters:
                row[e] = {"status": "skipped", "why": f"{params / 1e6:.0f} M parameters"}
            rows.append(row)
            print(f"{name:40s} skipped ({params / 1e6:.0f} M parameters)", flush=True)
            continue
        x = torch.randn(args.batch, 3, size, size)
        with torch.no_grad():
            y = model(x).float().numpy()
            y_bf16 = None
            if args.bf16 and not bf16_state.get("refused"):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y_bf16 = model(x).float().numpy()
        base = os.path.join(args.out, name)
        np.save(base + ".input.npy", x.numpy().astype(np.float32))
        for e in exporters:
            path = f"{base}.{e}.onnx"
            result = {}
            try:
                t1 = time.time()
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    export(model, x, path, e)
                result["export_s"] = round(time.time() - t1, 1)
            except Exception as ex:  # PyTorch's own exporter failing is recorded, not kdflow's
                first = next((l.strip() for l in str(ex).splitlines() if l.strip()), "")
                result = {"status": "export", "why": f"{type(ex).__name__}: {first}"[:400]}
                row[e] = result
                continue
            out = f"{base}.{e}.out.npy"
            t1 = time.time()
            p = subprocess.run([args.kdflow, "teacher", "infer", "--model", path, "--input",
                                base + ".input.npy", "--output", out, "--tune", "off"],
                               capture_output=True, text=True)
            result["kdflow_s"] = round(time.time() - t1, 1)
            if p.returncode != 0:
                result.update(status="refused", exit=p.returncode, why=one_line(p.stderr))
            else:
                got = np.load(out)
                err = normalized_error(got, y)
                result.update(status="ok" if err <= TOLERANCE else "mismatch", error=err)
                if args.profile and result["status"] == "ok":
                    result.update(profile(args.kdflow, path, base + f".{e}.bench.json"))
                if args.bf16 and result["status"] == "ok":
                    result["bf16"] = bf16_check(args, path, base, e, y, y_bf16, bf16_state)
            if not args.keep:
                for f in (path, out, path + ".data"):
                    if os.path.exists(f):
                        os.remove(f)
            row[e] = result
        if not args.keep:
            os.remove(base + ".input.npy")
        rows.append(row)
        summary = "  ".join(f"{e}: {row[e]['status']}" + (f" {row[e]['error']:.1e}" if "error" in row[e] else "")
                            + (f" ({row[e]['why'][:150]})" if "why" in row[e] else "")
                            + (f" bf16: {row[e]['bf16']['status']}" if "bf16" in row[e] else "")
                            for e in exporters)
        print(f"{name:40s} {time.time() - t0:6.1f}s  {summary}", flush=True)
        write_json(args, earlier + rows, exporters)  # after each model: a long run keeps its rows

    print(json.dumps(write_json(args, earlier + rows, exporters)))
    bad = [r["model"] for r in rows for e in exporters if r[e]["status"] in ("refused", "mismatch")]
    return 1 if (args.fail_on_error and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
