#!/usr/bin/env python3
"""The README's table of the teacher's throughput on N cores against ONNX Runtime's, generated from
a committed result of `bench/teacher_vs_ort.py --throughput N...`: a row per model and core count,
each side's best split of the cores into replicas (sessions) x threads and its images/s, the ratio
of the two bests (measured side by side in one run), and each side's other splits. Writes the
table between the README's teacher-throughput markers; with --check, exits 1 when the README's
table is not what the result file gives (a ctest runs that). Standard library only.

usage: throughput_table.py [--check] [RESULT.json]   (default: RESULT below)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_block  # noqa: E402

RESULT = os.path.join("bench", "results", "teacher_throughput_224_zen4_a6e9a63.json")
BAR = 1.5  # issue 38's bar for fp32 against ONNX Runtime


def split(entry, count_key):
    return f"{entry['images_per_s']:.1f} ({entry[count_key]}x{entry['threads']})"


def others(entries, best, count_key):
    rest = [e for e in entries if e != best]
    return ", ".join(split(e, count_key) for e in rest) if rest else "-"


def ratio_text(ratio, bold=True):
    """Two decimals, bold at or above the bar; three for a miss that two would round up to it."""
    if ratio >= BAR:
        return f"**{ratio:.2f}x**" if bold else f"{ratio:.2f}x"
    return f"{ratio:.3f}x" if round(ratio, 2) >= BAR else f"{ratio:.2f}x"


def table(doc, source):
    machine = doc["machine"]
    rows = doc["throughput"]
    if not rows:
        raise SystemExit(f"{source}: no throughput rows (run bench/teacher_vs_ort.py --throughput)")
    lines = [
        f"Result: `{source}` ({readme_block.machine_text(machine)}; commit {doc['commit']}; "
        f"onnxruntime {doc['onnxruntime']}; "
        f"batch {doc['batch']}, fp32, `tune = {doc['tune']}` with an empty plan cache, the "
        f"{doc['exporter']} exporter); images/s:",
        "",
        "| model | input | cores | kdflow best (replicas x threads) | ORT best (sessions x "
        "threads) | best vs best | kdflow's other splits | ORT's other splits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_cores = {}
    for r in rows:
        text = ratio_text(r["best_vs_best"])
        lines.append(
            f"| {r['model']} | {r['size']} | {r['cores']} | "
            f"{split(r['kdflow_best'], 'replicas')} | {split(r['onnxruntime_best'], 'sessions')} | "
            f"{text} | "
            f"{others(r['kdflow'], r['kdflow_best'], 'replicas')} | "
            f"{others(r['onnxruntime'], r['onnxruntime_best'], 'sessions')} |")
        by_cores.setdefault(r["cores"], []).append(r)
    lines.append("")
    for cores, group in sorted(by_cores.items()):
        below = [f"{r['model']} {ratio_text(r['best_vs_best'], bold=False)}" for r in group
                 if r["best_vs_best"] < BAR]
        ratios = sorted(r["best_vs_best"] for r in group)
        lines.append(f"On {cores} core{'s' if cores > 1 else ''}: {len(group) - len(below)} of "
                     f"{len(group)} models at or above {BAR}x ONNX Runtime's best, "
                     f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x"
                     + (f"; below: {', '.join(below)}." if below else "."))
    return "\n".join(lines)


def main():
    return readme_block.from_result("teacher-throughput", table, RESULT,
                                    "table of the teacher's throughput on N cores",
                                    "scripts/throughput_table.py")


if __name__ == "__main__":
    sys.exit(main())
