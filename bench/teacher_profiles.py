#!/usr/bin/env python3
"""Where a teacher's time goes, for several kdflow binaries side by side: `kdflow teacher bench
--profile` per binary, ONNX model and precision, the binaries alternating, each keeping its own plan
cache folder. The JSON names the CPU (family, model, stepping, core), its ISA flags, the tree's
commit, each binary's path and ONEDNN_MAX_CPU_ISA; for each run the images/s, the time by kind and
the slowest steps (kind, oneDNN implementation or kdflow's kernel, label). Run with the kdflow
venv's python (numpy for the calibration file int8 needs).

usage: teacher_profiles.py OUT_JSON --binary NAME=PATH [--binary ...] --model PATH [--model ...]
                           [--precisions fp32 bf16] [--threads 2] [--batch 64] [--input-size 224]
                           [--seconds 3] [--steps 8] [--note TEXT]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import int8_teacher as it  # noqa: E402  (the CPU's name, family and flags, as every bench names them)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--binary", action="append", required=True, help="NAME=PATH to a kdflow binary")
    p.add_argument("--model", action="append", required=True, help="an ONNX teacher")
    p.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--input-size", default="auto")
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--steps", type=int, default=8, help="slowest steps kept per run")
    p.add_argument("--note", default="")
    a = p.parse_args()
    binaries = []
    for b in a.binary:
        name, _, path = b.partition("=")
        if not name or not os.access(path, os.X_OK):
            p.error(f"--binary {b}: want NAME=PATH to an executable")
        binaries.append((name, os.path.abspath(path)))
    for m in a.model:
        if not os.path.isfile(m):
            p.error(f"--model {m}: no such file")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        caches = {name: tempfile.mkdtemp(dir=tmp) for name, _ in binaries}
        for model in a.model:
            for precision in a.precisions:
                for name, binary in binaries:
                    out = os.path.join(tmp, "r.json")
                    env = dict(os.environ, KDFLOW_CACHE_DIR=caches[name])
                    r = subprocess.run([binary, "teacher", "bench", "--model", model, "--batch",
                                        str(a.batch), "--threads", str(a.threads), "--input-size",
                                        a.input_size, "--precision", precision, "--seconds",
                                        str(a.seconds), "--profile", "--json", out],
                                       capture_output=True, text=True, env=env)
                    if r.returncode != 0:
                        runs.append({"model": os.path.basename(model), "precision": precision,
                                     "binary": name, "error": r.stderr.strip()[-500:]})
                        continue
                    d = json.load(open(out))
                    prof = d["profile"]
                    steps = sorted(prof["steps"], key=lambda s: -s["ms"])[:a.steps]
                    runs.append({"model": os.path.basename(model), "precision": precision,
                                 "binary": name, "images_per_s": d["images_per_s"],
                                 "peak_fraction": d["peak_fraction"], "isa": d["isa"],
                                 "step_ms_sum": prof["step_ms_sum"], "by_kind": prof["by_kind"],
                                 "slowest_steps": steps})
                    print(f"{os.path.basename(model)} {precision} {name}: "
                          f"{d['images_per_s']:.1f} images/s", flush=True)
    result = {"benchmark": "teacher_profiles", "cpu": it.cpu_name(), "cpu_id": it.cpu_id(),
              "isa_flags": it.isa_flags(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "commit": commit,
              "binaries": dict(binaries), "threads": a.threads, "batch": a.batch,
              "input_size": a.input_size, "seconds": a.seconds, "note": a.note, "runs": runs}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
