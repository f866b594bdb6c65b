#!/usr/bin/env python3
"""The README's table of kdflow's fp32 teacher against ONNX Runtime at 224 pixels, generated from a
committed result of bench/teacher_vs_ort.py: a row per model and thread count, both rates (measured
side by side in one run), their ratio, and the arithmetic behind each miss of the 1.5x bar: the
share of the machine's FMA peak each side reaches and the share kdflow would need for 1.5x ONNX
Runtime. Shares count the network's direct multiply-adds (a convolution as its plain loop), so a
plan that does fewer (Winograd) can pass 100%; a miss whose bar needs more than 100% is beyond any
kernel for these multiply-adds and needs fewer of them (Winograd, bf16, int8) or another algorithm.
Writes the table between the README's teacher-vs-ort markers; with --check, exits 1 when the
README's table is not what the result file gives (a ctest runs that). Standard library only.

A second block, between the teacher-vs-ort-avx2 markers, is the same from a host without AVX-512,
where ONNX Runtime's kernels are AVX2 as kdflow's are: a table per file of RESULTS_AVX2 (runs of
one model set split over several runs, each table naming its own commit).

A third, between the teacher-vs-ort-amx markers, is the same from an Intel Xeon with AMX, a table
per file of RESULTS_AMX (fp32 runs no AMX kernel: its shares are of the AVX-512 FMA peak).

usage: ort_table.py [--check] [RESULT.json]   (default: RESULT below; the AVX2 and AMX blocks
                                               always from RESULTS_AVX2 and RESULTS_AMX)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_block  # noqa: E402

RESULT = os.path.join("bench", "results", "teacher_vs_ort_zen4_224_8653be6.json")
RESULTS_AVX2 = [os.path.join("bench", "results", "teacher_vs_ort_zen3_224_2986e9d.json"),
                os.path.join("bench", "results", "teacher_vs_ort_zen3_224_rest_a9da4b9.json"),
                os.path.join("bench", "results", "teacher_vs_ort_zen3_224_maxvit_2thr_8076644.json"),
                os.path.join("bench", "results", "teacher_vs_ort_zen3_224_small_b466de5.json")]
RESULTS_AMX = [os.path.join("bench", "results", "teacher_vs_ort_xeon_amx_224_3646ad7.json")]
BAR = 1.5  # issue 38: fp32 >= 1.5x ONNX Runtime on every model


def shares(run):
    """kdflow's and ONNX Runtime's shares of the FMA peak (the same multiply-adds, the same peak
    that kdflow's bench measured), and the share kdflow would need for the bar."""
    kd = run["fp32_peak_fraction"]
    ort = run.get("onnxruntime_peak_fraction",
                  kd * run["onnxruntime_images_per_s"] / run["kdflow_fp32_images_per_s"])
    return kd, ort, BAR * ort


def kinds(run, batch):
    """The three largest kinds of step of kdflow's profiled batch, ms, beside the batch's time;
    with each one's share of the FMA peak where the run recorded it (results from 73a1077 on)."""
    ms = 1000.0 * batch / run["kdflow_fp32_images_per_s"]
    peak = run.get("fp32_slowest_kinds_peak_share", {})
    parts = ", ".join(f"{k} {v:.0f}" + (f" ({100 * peak[k]:.0f}% of peak)" if peak.get(k) is not None else "")
                      for k, v in run["fp32_slowest_kinds_ms"].items())
    return f"{parts} (of {ms:.0f})"


def table(doc, source):
    machine = doc["machine"]
    runs = [r for r in doc["runs"] if "kdflow_fp32_images_per_s" in r]
    failed = [r for r in doc["runs"] if "kdflow_fp32_images_per_s" not in r]
    lines = [
        f"Result: `{source}` ({readme_block.machine_text(machine)}; commit {doc['commit']}; "
        f"onnxruntime {doc['onnxruntime']}, "
        f"torch {doc['torch']}; batch {doc['batch']}, fp32, `tune = {doc['tune']}` with an empty "
        f"plan cache, the {doc['exporter']} exporter).",
        "",
        "| model | threads | ORT img/s | kdflow img/s | vs ORT | kdflow, of the FMA peak | ORT, "
        f"of the peak | {BAR}x ORT needs | kdflow's largest kinds, ms of the batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    met, beyond, within = [], [], []
    for r in runs:
        kd, ort, need = shares(r)
        ratio = r["fp32_vs_onnxruntime"]
        name = f"{r['model']} ({r['threads']} thr)"
        if ratio >= BAR:
            met.append(name)
        elif need > 1.0:
            beyond.append(name)
        else:
            within.append(f"{name}: {100 * need:.0f}%")
        # a miss that two decimals would round up to the bar shows three
        ratio_text = (f"**{ratio:.2f}x**" if ratio >= BAR else
                      f"{ratio:.3f}x" if round(ratio, 2) >= BAR else f"{ratio:.2f}x")
        lines.append(
            f"| {r['model']} | {r['threads']} | {r['onnxruntime_images_per_s']:.1f} | "
            f"{r['kdflow_fp32_images_per_s']:.1f} | {ratio_text} | {100 * kd:.0f}% | "
            f"{100 * ort:.0f}% | {100 * need:.0f}% | {kinds(r, doc['batch'])} |")
    lines += ["", f"At or above {BAR}x ONNX Runtime: {len(met)} of {len(runs)} runs"
              + (f" ({', '.join(met)})." if met else ".")]
    lines.append(f"Below, where {BAR}x needs more than the FMA peak at the network's direct "
                 f"multiply-adds: {len(beyond)} runs" + (f" ({', '.join(beyond)})." if beyond else "."))
    lines.append(f"Below, where {BAR}x is within the peak: {len(within)} runs"
                 + (f" ({'; '.join(within)})." if within else "."))
    for r in failed:
        lines.append(f"Not run: {r['model']} at {r['size']} ({r.get('export_error', 'no rate')}).")
    return "\n".join(lines)


def main():
    status = readme_block.from_result("teacher-vs-ort", table, RESULT,
                                      "table of the teacher against ONNX Runtime",
                                      "scripts/ort_table.py")
    for name, sources in (("avx2", RESULTS_AVX2), ("amx", RESULTS_AMX)):
        tables = []
        for source in sources:
            with open(os.path.join(readme_block.ROOT, source)) as f:
                tables.append(table(json.load(f), source))
        status = status or readme_block.update(
            f"teacher-vs-ort-{name}", "\n\n".join(tables), "--check" in sys.argv[1:],
            f"block of {name.upper()} tables of the teacher against ONNX Runtime",
            " and ".join(sources), "scripts/ort_table.py")
    return status


if __name__ == "__main__":
    sys.exit(main())
