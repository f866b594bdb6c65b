#!/usr/bin/env python3
"""The README's teacher-coverage table, generated from the committed result of
scripts/teacher_zoo.py (bench/results/teacher_zoo_*.json): a row per model family (torchvision
builders, timm models, extras), how many of its models each exporter's file loads and matches
PyTorch within the tolerance, the largest error, and every model that did not, with why. Writes
it between the README's teacher-zoo markers; with --check, exits 1 when the README's table is not
what the result file gives (a ctest runs that). Standard library only (any python3).

usage: zoo_table.py [--check] [RESULT.json]   (default: bench/results/teacher_zoo_epyc.json; the
bf16 column from bench/results/teacher_zoo_bf16_zen4.json, teacher_zoo.py --bf16 on a CPU with
native bf16)
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_block  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORTERS = ("dynamo", "legacy")
# teacher_zoo.py --bf16 on a CPU with native bf16: the table's bf16 column.
BF16 = os.path.join(ROOT, "bench", "results", "teacher_zoo_bf16_zen4.json")


def family(model):
    source, base = model.split(".", 1)
    return source, re.match(r"[a-z]+(?:v\d)?", base).group(0)


def largest_share(models, key, kinds_key):
    """The largest share `key` of a profiled file of the family, with its model, exporter and
    the kinds of step in it; - where no file was profiled so."""
    prof = [(r[e][key], r[e].get(kinds_key, {}), r["model"].split(".", 1)[1], e)
            for r in models for e in EXPORTERS if key in r.get(e, {})]
    if not prof:
        return "-"
    share, kinds, name, e = max(prof, key=lambda t: t[0])
    return f"{100 * share:.1f}% ({name} {e}" + (f": {', '.join(sorted(kinds))})" if kinds else ")")


def bf16_cell(models, bf16):
    """The family's files under --precision bf16 (the bf16 result, by model): how many of those run
    were ok, and the worst kdflow error beside PyTorch's own bf16 error on the same file."""
    runs = [(r["model"], e, bf16[r["model"]][e]["bf16"]) for r in models if r["model"] in bf16
            for e in EXPORTERS if "bf16" in bf16[r["model"]].get(e, {})]
    runs = [(m, e, b) for m, e, b in runs if b.get("status") != "not native"]
    if not runs:
        return "-", []
    ok = [b for _, _, b in runs if b["status"] == "ok"]
    worst = max(runs, key=lambda t: t[2].get("error", 0))[2]
    cell = (f"{len(ok)}/{len(runs)} ({worst['error']:.1e} vs PyTorch "
            f"{worst['torch_bf16_error']:.1e})")
    bad = [f"{m.split('.', 1)[1]} {e} bf16: {b['status']} (error {b.get('error', 0):.1e}, PyTorch "
           f"{b.get('torch_bf16_error', 0):.1e})" for m, e, b in runs if b["status"] != "ok"]
    return cell, bad


def table(doc, bf16_doc=None):
    bf16 = {r["model"]: r for r in bf16_doc["models"]} if bf16_doc else {}
    groups = {}
    for r in doc["models"]:
        groups.setdefault(family(r["model"]), []).append(r)
    rows = [f"Result: `bench/results/{os.path.basename(doc['_path'])}` ({doc['cpu']}, "
            f"{doc['cpus']} CPUs, commits {doc.get('base_commit', doc['commit'])} to "
            f"{doc['commit']}: each row names its own, torch {doc['torch']}, batch "
            f"{doc['batch']}, tolerance {doc['tolerance']:g} normalized).", "",
            "| source | family | models | dynamo ok | legacy ok | largest error | bf16 ok (worst error) | plain kernels | reference loops | not ok, and why |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for (source, fam), models in sorted(groups.items()):
        names = ", ".join(r["model"].split(".", 1)[1] for r in models)
        ok = {e: sum(1 for r in models if r.get(e, {}).get("status") == "ok") for e in EXPORTERS}
        errors = [r[e]["error"] for r in models for e in EXPORTERS if r.get(e, {}).get("status") == "ok"]
        notes = []
        for r in models:
            for e in EXPORTERS:
                res = r.get(e, {})
                if res.get("status") not in (None, "ok"):
                    why = re.sub(r"\x1b\[[0-9;]*m", "", res.get("why", "")).replace("|", "\\|")
                    why = re.sub(r"kdflow: \S+\.onnx: ", "", why)[:160]
                    notes.append(f"{r['model'].split('.', 1)[1]} {e}: {res['status']} ({why})")
        plain = largest_share(models, "plain_kernel_share", "plain_kinds")
        reference = largest_share(models, "reference_share", "reference_kinds")
        err = f"{max(errors):.1e}" if errors else "-"
        b16, bad = bf16_cell(models, bf16)
        notes += bad
        rows.append(f"| {source} | {fam} | {names} | {ok['dynamo']}/{len(models)} | "
                    f"{ok['legacy']}/{len(models)} | {err} | {b16} | {plain} | {reference} | {'; '.join(notes)} |")
    rows.append("")
    rows.append("plain kernels: the largest share of `teacher bench --profile`'s time (1 thread, "
                "batch 8) in kdflow's own code rather than oneDNN primitives, over the family's "
                "profiled files (`--profile`; - where none was profiled), with the kinds of step "
                "that ran so; reference loops: the part of it in loops that go element by element "
                "(the reference's own way, kept for rare variants), the rest being kernels by rows "
                "or blocks (copies, fills, broadcasts, per-row norms).")
    if bf16_doc:
        rows.append("")
        rows.append(f"bf16 ok: `bench/results/{os.path.basename(bf16_doc['_path'])}` "
                    f"({bf16_doc['cpu']} with {', '.join(bf16_doc.get('isa', [])) or 'its ISA unnamed'}, "
                    f"{bf16_doc['cpus']} CPUs, commits {bf16_doc['base_commit']} to {bf16_doc['commit']}): "
                    "each fp32-ok file run under `--precision bf16` against PyTorch's own bf16 (CPU "
                    "autocast) on the same input, ok where kdflow's normalized error from the fp32 "
                    "logits is at most PyTorch's plus 2e-2; the worst file's two errors.")
    total = len(doc["models"])
    for e in EXPORTERS:
        n = sum(1 for r in doc["models"] if r.get(e, {}).get("status") == "ok")
        rows.append("")
        rows.append(f"{e}: {n} of {total} models ok.")
    return "\n".join(rows)


def main():
    args = [a for a in sys.argv[1:] if a != "--check"]
    path = args[0] if args else os.path.join(ROOT, "bench", "results", "teacher_zoo_epyc.json")
    doc = json.load(open(path))
    doc["_path"] = path
    bf16_doc = None
    if os.path.exists(BF16):
        bf16_doc = json.load(open(BF16))
        bf16_doc["_path"] = BF16
    return readme_block.update("teacher-zoo", table(doc, bf16_doc), "--check" in sys.argv[1:],
                               "teacher coverage table", os.path.relpath(path, ROOT),
                               "scripts/zoo_table.py")


if __name__ == "__main__":
    sys.exit(main())
