#!/usr/bin/env python3
"""The soak: one long `kdflow train` with the teacher-output cache (on disk), a feature loss and two
teachers, sampled every few seconds from /proc: resident memory, threads, open files and locked
(pinned) bytes, with the epoch the run is in. After the first epoch (the cache fills, the plans
settle) nothing may grow: the last quarter of the samples is compared with the first, and a
leak fails the soak (exit 1). Standard library only; any python3 (bench/soak.sh uses the venv's).

Usage: soak.py KDFLOW --minutes M --out RESULT.json [--work DIR] [--interval S] [--subset N]
"""
import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def proc_figures(pid):
    """RSS and locked bytes (kB from /proc/PID/status), threads, open files; None once gone."""
    try:
        status = open(f"/proc/{pid}/status").read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    found = {name: re.search(rf"^{name}:\s+(\d+)", status, re.M) for name in ("VmRSS", "VmLck", "Threads")}
    if not all(found.values()):
        return None  # exited meanwhile: a zombie has no memory lines
    field = lambda name: int(found[name].group(1))
    return {"rss_kib": field("VmRSS"), "locked_kib": field("VmLck"), "threads": field("Threads"),
            "open_files": fds}


def last_epoch(metrics):
    try:
        with open(metrics) as f:
            lines = [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return None
    steps = [l for l in lines if "event" not in l]
    return steps[-1]["epoch"] if steps else None


def cpu_name():
    """The model name and the vector ISAs that decide the teacher's kernels."""
    name, flags = platform.processor(), []
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = [f for f in line.split(":", 1)[1].split() if f.startswith(("avx2", "avx512", "amx"))]
            break
    return f"{name} ({', '.join(flags) or 'no AVX2'})"


def subset(src, dst, n):
    """The first n training images of the IDX dataset at src (all of the test split), plain files."""
    import gzip
    os.makedirs(dst, exist_ok=True)
    for stem, kind, header in (("train", "images", 16), ("train", "labels", 8), ("t10k", "images", 16),
                               ("t10k", "labels", 8)):
        name = f"{stem}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"
        data = gzip.open(os.path.join(src, name + ".gz")).read()
        if stem == "train":
            per = 784 if kind == "images" else 1
            data = data[:4] + n.to_bytes(4, "big") + data[8:header] + data[header:header + n * per]
        open(os.path.join(dst, name), "wb").write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kdflow")
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--subset", type=int, default=0, help="train on the first N images (short soaks)")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="kdflow-soak-")
    scratch = a.work is None  # a folder of its own: removed at the end
    run = os.path.join(work, "run")
    sets = ["train.epochs=10000", "kd.cache=disk", f"kd.cache_path={os.path.join(work, 'teacher.kdcache')}",
            "teacher.others=[{model = \"models/fmnist_teacher_w16.onnx\", weight = 0.5}]",
            "kd.features=[{teacher = \"/head/head.0/Flatten_output_0\", "
            "student = \"penultimate\", loss = \"hint\", weight = 0.5}]",
            "train.log_every=50", "train.keep_checkpoints=2", "train.export=off"]
    if a.subset:
        data = os.path.join(work, "data")
        subset("/usr/share/datasets/fashion-mnist", data, a.subset)
        sets.append(f"data.path={data}")
    cmd = [a.kdflow, "train", "--out", run]
    for s in sets:
        cmd += ["--set", s]
    log = open(os.path.join(work, "train.log"), "w")
    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    started = time.monotonic()
    samples = []
    deadline = started + 60 * a.minutes
    while time.monotonic() < deadline and child.poll() is None:
        f = proc_figures(child.pid)
        if f:
            f["t_s"] = round(time.monotonic() - started, 1)
            f["epoch"] = last_epoch(os.path.join(run, "metrics.jsonl"))
            samples.append(f)
        time.sleep(a.interval)
    if child.poll() is None:
        child.send_signal(signal.SIGINT)  # stops after a step, saves, exit 130
        try:
            child.wait(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    code = child.returncode
    # Epoch 1 (index 0) fills the cache: the figures are every sample from the epoch after it on.
    # The first and the last quarter of them are compared, windows of equal length: each spans
    # several epochs, so each holds the troughs and the peaks of the within-epoch swing (the
    # evaluation's buffers; one epoch's few samples against a long tail compared a peak with a
    # trough, and failed a CI run on a flat series).
    settled = [s for s in samples if s["epoch"] is not None and s["epoch"] >= 1]
    verdict = {}
    ok = code in (0, 130) and len(settled) >= 8
    if settled:
        window = max(2, len(settled) // 4)
        first, tail = settled[:window], settled[-window:]
        for key, noise in (("rss_kib", 32 * 1024), ("locked_kib", 0), ("threads", 0), ("open_files", 0)):
            ref = statistics.median(s[key] for s in first)
            last = statistics.median(s[key] for s in tail)
            peak = max(s[key] for s in settled)
            growth = last - ref
            # A leak raises the level and the floor; transients (an evaluation's threads and
            # buffers, the allocator's arenas) can lift the level of a window but not its floor:
            # a key grows only where both do. RSS within 32 MiB, the rest exact (in three
            # scratch 3-minute runs on a Zen 4, not committed, RSS swung by about 90 MiB within
            # each epoch and its floor moved by up to 14 MiB between the windows; a leak of one
            # Fashion-MNIST batch's slot, 200 KiB a step, would add over 100 MiB between them).
            floor_growth = min(s[key] for s in tail) - min(s[key] for s in first)
            flat = growth <= noise or floor_growth <= noise
            verdict[key] = {"first_quarter_median": ref, "last_quarter_median": last, "peak": peak,
                            "growth": growth, "floor_growth": floor_growth,
                            "allowed_growth": noise, "flat": flat}
            ok = ok and flat
    report = {
        "what": "kdflow train soak: kd.cache=disk, two teachers, a hint feature loss; /proc sampled",
        "cpu": cpu_name(), "cpus": os.cpu_count(), "commit": a.commit,
        "minutes": a.minutes, "interval_s": a.interval, "subset": a.subset or None,
        "command": cmd, "exit_code": code,
        "epochs_seen": max((s["epoch"] for s in samples if s["epoch"] is not None), default=None),
        "samples": len(samples), "settled_samples": len(settled),
        "verdict": verdict, "flat": ok, "series": samples,
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    if scratch:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    for key, v in verdict.items():
        print(f"{key:11s} first quarter {v['first_quarter_median']:>9} last quarter {v['last_quarter_median']:>9} "
              f"peak {v['peak']:>9} growth {v['growth']:>7}: {'flat' if v['flat'] else 'GROWS'}")
    print(f"soak: {len(samples)} samples over {a.minutes} min, epochs seen {report['epochs_seen']}, "
          f"exit {code}: {'flat' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
