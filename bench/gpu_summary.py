#!/usr/bin/env python3
"""The table scripts/gpu_check.sh prints last: reads what its phases wrote into one folder (ctest's
log, bench-overlap and tune-cores JSON, the training runs' metrics) and says, for each target of
the GPU check, the figure and whether it was met. Standard library only (any python3).

Usage: gpu_summary.py WORK_DIR [--json OUT.json]
"""
import glob
import json
import math
import os
import re
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def metrics(path):
    """Losses of a run's metrics.jsonl by step (elastic events left out)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                m = json.loads(line)
                if "event" not in m:
                    out[m["step"]] = m
    except OSError:
        pass
    return out


def ctest_summary(work):
    try:
        text = open(os.path.join(work, "ctest.log")).read()
    except OSError:
        return None
    # "100% tests passed, 0 tests failed out of N", or (newer ctest) "100% tests passed out of N"
    m = re.search(r"(\d+)% tests passed(?:, (\d+) tests failed)? out of (\d+)", text)
    failed = re.findall(r"^\s*\d+ - (\S+) \((Failed|Timeout|Not Run|SEGFAULT|Subprocess aborted)", text, re.M)
    skipped = re.findall(r"Test\s+#\d+: (\S+) \.+\*+Skipped", text)
    if not m:
        return {"parsed": False}
    total, nfail = int(m.group(3)), int(m.group(2) or 0)
    return {"total": total, "failed": nfail, "failed_tests": [f[0] for f in failed],
            "skipped_tests": skipped}


def overlap_row(report):
    modes = report["modes"]
    rate = {k: v["samples_per_s"] for k, v in modes.items()}
    teacher_bound_or_equal = rate["teacher-alone"] >= rate["student-alone"]
    vs_student = rate["overlapped"] / rate["student-alone"]
    idle = report.get("student_idle_fraction")
    h2d = report.get("h2d") or {}
    return {
        "device": report.get("device"),
        "plan": report.get("plan_summary"),
        "student": f'{report["setup"]["student"]} x{report["setup"]["student_width"]}, batch {report["setup"]["batch"]}',
        "teacher_precision": report["setup"]["teacher_precision"],
        "samples_per_s": rate,
        "ideal": report["ideal_samples_per_s"],
        "bottleneck": report.get("bottleneck"),
        "efficiency": report["efficiency"],
        "overlapped_vs_student_alone": vs_student,
        "student_idle_fraction": idle,
        "speedup_vs_serial_cpu": report["speedup_vs_serial_cpu"],
        "speedup_vs_colocated": report["speedup_vs_colocated"],
        # The target applies where the CPU teacher can keep up with the student alone.
        "target_applies": teacher_bound_or_equal,
        "target_met": (vs_student >= 0.95 and (idle is None or idle < 0.05)) if teacher_bound_or_equal else None,
        "h2d": h2d,
    }


def follow(work):
    cuda, cpu = metrics(os.path.join(work, "follow_cuda", "metrics.jsonl")), metrics(
        os.path.join(work, "follow_cpu", "metrics.jsonl"))
    steps = sorted(set(cuda) & set(cpu))
    if not steps:
        return None
    rel = [abs(cuda[s]["loss"] - cpu[s]["loss"]) / max(1e-12, abs(cpu[s]["loss"])) for s in steps]
    return {"steps": len(steps), "max_rel_loss_diff": max(rel), "median_rel_loss_diff": statistics.median(rel),
            "first_step_rel_diff": rel[0], "last_loss_cuda": cuda[steps[-1]]["loss"],
            "last_loss_cpu": cpu[steps[-1]]["loss"]}


def teacher_rows(work):
    """The teacher phase's benches (teacher_<precision>_<replicas>x<threads>.json), by rate; None
    when the phase did not run."""
    rows = []
    for path in sorted(glob.glob(os.path.join(work, "teacher_*_*x*.json"))):
        m = re.match(r"teacher_(\w+?)_(\d+)x(\d+)\.json$", os.path.basename(path))
        r = load(path)
        if not m or not r:
            continue
        int8 = r.get("int8") or {}
        rows.append({"precision": m.group(1), "replicas": int(m.group(2)), "threads": int(m.group(3)),
                     "images_per_s": r.get("images_per_s"), "model": os.path.basename(r.get("model", "")),
                     "batch": r.get("batch"), "top1_agreement": int8.get("top1_agreement"),
                     "kl": int8.get("kl")})
    return rows or None


def main():
    work = sys.argv[1]
    out = {"ctest": ctest_summary(work)}
    for setup in ("default", "default_tuned", "gpu"):
        r = load(os.path.join(work, f"overlap_{setup}.json"))
        out[f"overlap_{setup}"] = overlap_row(r) if r else None
    s = load(os.path.join(work, "train_cuda", "summary.json"))
    out["train_cuda"] = {k: s.get(k) for k in ("device", "precision", "steps", "test_accuracy", "samples_per_s",
                                                "student_stall_fraction", "wall_s")} if s else None
    out["cuda_follows_cpu"] = follow(work)
    machine = ""
    try:
        machine = open(os.path.join(work, "machine.txt")).read()
    except OSError:
        pass
    m = re.search(r"^GPUs: +(\d+)", machine, re.M)
    out["gpus"] = int(m.group(1)) if m else None
    try:
        out["failed_phases"] = [l for l in open(os.path.join(work, "failed_phases.txt")).read().split("\n") if l]
    except OSError:
        out["failed_phases"] = None
    runs = {name: load(os.path.join(work, name, "summary.json")) or {}
            for name in ("plain_a", "plain_b", "torchrun_auto", "torchrun_gloo", "torchrun_nccl")}
    digests = {name: r.get("state_digest") for name, r in runs.items()}
    group = {name: (r.get("dist") or {}).get("backend") for name, r in runs.items()}
    plain = digests["plain_a"]
    out["torchrun_one_gpu"] = {
        "digests": digests, "group_backend": group,
        "device": runs["plain_a"].get("device"),
        "plain_runs_equal": plain is not None and plain == digests["plain_b"],
        **{f"{name}_equals_plain": (digests[name] == plain if digests[name] and plain else None)
           for name in ("torchrun_auto", "torchrun_gloo", "torchrun_nccl")}}
    t = load(os.path.join(work, "tune_default.json"))
    out["tune_exhaustive"] = t.get("exhaustive") if t else None
    if out["tune_exhaustive"]:
        out["tune_exhaustive"] = {k: v for k, v in out["tune_exhaustive"].items() if k != "plans"}
        out["tune_exhaustive"]["plans"] = len(t["exhaustive"]["plans"])
    r = load(os.path.join(work, "real_224.json"))
    out["real_224"] = {k: r.get(k) for k in ("gpu", "cpu", "commit", "size", "batch", "steps", "teacher", "student",
                                             "kdflow_samples_per_s", "peer_samples_per_s", "ratio",
                                             "kdflow_test_accuracy", "peer_test_accuracy",
                                             "kdflow_teacher_busy_fraction", "kdflow_student_stall_fraction",
                                             "kdflow_plan", "kdflow_pace", "kdflow_cache", "kdflow_sets",
                                             "kdflow_teacher_int8", "teacher_weights", "time_to_accuracy",
                                             "time_to_accuracy_ratio")} if r else None
    out["teacher"] = teacher_rows(work)
    try:
        tune_log = open(os.path.join(work, "ctest_tune.log")).read()
        m = re.search(r"(\d+)% tests passed(?:, (\d+) tests failed)? out of (\d+)", tune_log)
        out["ctest_elastic_pipeline_tuner"] = m.group(0) if m else "not parsed"
    except OSError:
        out["ctest_elastic_pipeline_tuner"] = None

    lines = []
    c = out["ctest"]
    if c and c.get("parsed", True):
        lines.append(f"ctest: {c['total'] - c['failed']}/{c['total']} passed"
                     + (f"; failed: {', '.join(c['failed_tests'])}" if c["failed"] else "")
                     + (f"; skipped: {', '.join(c['skipped_tests'])}" if c["skipped_tests"] else "; none skipped"))
    else:
        lines.append("ctest: not run or not parsed")
    for setup in ("default", "default_tuned", "gpu"):
        r = out[f"overlap_{setup}"]
        if not r:
            lines.append(f"bench-overlap {setup}: not run")
            continue
        sps = r["samples_per_s"]
        lines.append(f"bench-overlap {setup}: {r['student']}, teacher {r['teacher_precision']}, {r['device']}, plan {r['plan']}")
        lines.append("  " + "  ".join(f"{k} {v:,.0f}" for k, v in sps.items()))
        idle = r["student_idle_fraction"]
        met = {None: "n/a (student slower than the teacher)", True: "met", False: "NOT met"}[r["target_met"]]
        lines.append(f"  overlapped/student-alone {r['overlapped_vs_student_alone']:.3f}, efficiency {r['efficiency']:.3f}"
                     f" ({r['bottleneck']}-bound), GPU idle {100 * idle:.1f}%, vs serial-cpu {r['speedup_vs_serial_cpu']:.2f}x,"
                     f" vs colocated {r['speedup_vs_colocated']:.2f}x; target >=0.95 and idle <5%: {met}")
        for which, h in (r["h2d"] or {}).items():
            if h:
                lines.append(f"  H2D {which} ({h['bytes_per_copy']:,} B): slots {h['slots_gb_per_s']:.1f} GB/s, pinned cudaMemcpy "
                             f"{h['memcpy_pinned_gb_per_s']:.1f} GB/s, ratio {h['ratio']:.3f} (target >= 0.85: "
                             f"{'met' if h['ratio'] >= 0.85 else 'NOT met'})")
    no_gpu = out["gpus"] == 0
    t = out["train_cuda"]
    if no_gpu:
        lines.append("train (CUDA), CUDA vs CPU student, NCCL group, GPU-sized job: skipped: no GPU")
    if t:
        lines.append(f"train (CUDA, {t['precision']}): {t['steps']} steps, test accuracy {100 * t['test_accuracy']:.2f}%, "
                     f"{t['samples_per_s']:,.0f} samples/s, stall {100 * (t['student_stall_fraction'] or 0):.1f}%")
    f = out["cuda_follows_cpu"]
    if f:
        lines.append(f"CUDA vs CPU student, same seed, {f['steps']} steps: loss rel. diff max {f['max_rel_loss_diff']:.4f}, "
                     f"median {f['median_rel_loss_diff']:.4f}, first step {f['first_step_rel_diff']:.5f}")
    g = out["torchrun_one_gpu"]
    lines.append(f"torchrun, one rank ({g['device']}): equals the plain run: no group "
                 f"{g['torchrun_auto_equals_plain']}, gloo group of one {g['torchrun_gloo_equals_plain']}, "
                 f"nccl group of one {g['torchrun_nccl_equals_plain']} (groups joined: "
                 f"{', '.join(str(v) for v in g['group_backend'].values())}; two plain runs equal each other: "
                 f"{g['plain_runs_equal']})")
    if out["ctest_elastic_pipeline_tuner"]:
        lines.append(f"elastic/pipeline/tuner tests: {out['ctest_elastic_pipeline_tuner']}")
    j = out["real_224"]
    if j:
        lines.append(f"real job {j['size']} px, {j['teacher']} -> {j['student']}, batch {j['batch']}, {j['steps']} steps: "
                     f"kdflow {', '.join(f'{v:,.0f}' for v in j['kdflow_samples_per_s'])} samples/s, the PyTorch loop "
                     f"{', '.join(f'{v:,.0f}' for v in j['peer_samples_per_s'])}: {j['ratio']:.2f}x (kdflow's teacher busy "
                     f"{', '.join(f'{100 * (v or 0):.0f}%' for v in j['kdflow_teacher_busy_fraction'])}, student stalled "
                     f"{', '.join(f'{100 * (v or 0):.0f}%' for v in j['kdflow_student_stall_fraction'])}; plan {j['kdflow_plan']})")
        if j.get("kdflow_sets"):
            lines.append(f"  kdflow's settings: {' '.join(j['kdflow_sets'])}")
        for c in j.get("kdflow_teacher_int8") or []:
            lines.append(f"  int8 teacher: calibrated on {c['calibration_samples']} images; against fp32 on the next "
                         f"{c['check_samples']}: top-1 agreement {100 * c['top1_agreement']:.2f}%, KL {c['kl']:.1e}")
            if c.get("warning"):
                lines.append(f"    warning: {c['warning']}")
        trained = (j.get("teacher_weights") or {}).get("trained")
        if trained:
            lines.append(f"  teacher trained {trained['epochs']} epochs ({trained['steps']} steps, {trained['train_s']:.0f} s on "
                         f"{trained['device']}): val top-1 {trained['val_accuracy']:.4f}")
        for row in j.get("time_to_accuracy") or []:
            lines.append(f"  time to top-1 {row['target_accuracy']:.4f} (the highest every arm reached): " + "; ".join(
                f"{name} {v['seconds']:.1f} s (step {v['step']})" for name, v in row.items() if name != "target_accuracy")
                + (f"; the loop's time over kdflow's {j['time_to_accuracy_ratio']:.2f}" if j.get("time_to_accuracy_ratio") else ""))
            for name, v in row.items():
                if name != "target_accuracy":
                    lines.append(f"    {name} accuracy by step: " + ", ".join(f"{st}: {a:.3f}" for st, a in v["curve"]))
        for line in j.get("kdflow_pace") or []:
            lines.append(f"  kdflow's start-up line: {line}")
        c = j.get("kdflow_cache")
        if c:
            lines.append(f"  with kd.cache (first views' outputs): {', '.join(f'{v:,.0f}' for v in c['samples_per_s'])} "
                         f"samples/s, {c['ratio_to_peer']:.2f}x the loop; test accuracy "
                         f"{', '.join(f'{v:.4f}' for v in c['test_accuracy'])} against kdflow's "
                         f"{', '.join(f'{v:.4f}' for v in j['kdflow_test_accuracy'])} and the loop's "
                         f"{', '.join(f'{v:.4f}' for v in j['peer_test_accuracy'])}")
            for r, rows in enumerate(c.get("epochs") or []):
                lines.append(f"  kd.cache arm, repeat {r + 1}, per epoch: " + "; ".join(
                    f"{e['epoch']}: {e['samples_per_s']:,.0f} samples/s, student waiting "
                    f"{100 * e['student_wait_share']:.0f}%" for e in rows))
    elif no_gpu:
        lines.append("real job (224 px, GPU students): skipped: no GPU")
    rows = out["teacher"]
    if rows:
        fp32 = max((x["images_per_s"] for x in rows if x["precision"] == "fp32"), default=None)
        for x in rows:
            vs = f", {x['images_per_s'] / fp32:.2f}x the best fp32" if fp32 and x["precision"] != "fp32" else ""
            agree = (f", top-1 agreement with fp32 {100 * x['top1_agreement']:.2f}%, KL {x['kl']:.1e}"
                     if x["top1_agreement"] is not None else "")
            lines.append(f"teacher {x['model']} batch {x['batch']} {x['precision']} {x['replicas']}x{x['threads']}: "
                         f"{x['images_per_s']:,.1f} images/s{vs}{agree}")
    e = out["tune_exhaustive"]
    if e:
        sweep = f", {e['sweep_tuned_vs_best']:.3f} in the one-window sweep" if "sweep_tuned_vs_best" in e else ""
        lines.append(f"tune-cores vs exhaustive ({e['plans']} plans): tuned plan at {e['tuned_vs_best']:.3f} of the best{sweep} "
                     f"(target >= 0.95: {'met' if e['tuned_vs_best'] >= 0.95 else 'NOT met'}), time ratio {e['time_ratio']:.2f} "
                     f"(target <= 0.33: {'met' if e['time_ratio'] <= 1 / 3 else 'NOT met'})")
    if out["failed_phases"]:
        lines.append(f"FAILED phases: {', '.join(out['failed_phases'])}")
    elif out["failed_phases"] is not None:
        lines.append("every phase passed")
    print("\n".join(lines))
    with open(os.path.join(work, "summary.json"), "w") as fh:
        json.dump(out, fh, indent=2, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)


if __name__ == "__main__":
    main()
