#!/usr/bin/env python3
"""The README's teacher-coverage table, generated from the committed result of
scripts/teacher_zoo.py (bench/results/teacher_zoo_*.json): a row per model family (torchvision
builders, timm models, extras), how many of its models each exporter's file loads and matches
PyTorch within the tolerance, the largest error, and every model that did not, with why. Writes
it between the README's teacher-zoo markers; with --check, exits 1 when the README's table is not
what the result file gives (a ctest runs that). Standard library only (any python3).

usage: zoo_table.py [--check] [RESULT.json]   (default: bench/results/teacher_zoo_epyc.json)
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_block  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORTERS = ("dynamo", "legacy")


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


def table(doc):
    groups = {}
    for r in doc["models"]:
        groups.setdefault(family(r["model"]), []).append(r)
    rows = [f"Result: `bench/results/{os.path.basename(doc['_path'])}` ({doc['cpu']}, "
            f"{doc['cpus']} CPUs, commits {doc.get('base_commit', doc['commit'])} to "
            f"{doc['commit']}: each row names its own, torch {doc['torch']}, batch "
            f"{doc['batch']}, tolerance {doc['tolerance']:g} normalized).", "",
            "| source | family | models | dynamo ok | legacy ok | largest error | plain kernels | reference loops | not ok, and why |",
            "|---|---|---|---|---|---|---|---|---|"]
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
        rows.append(f"| {source} | {fam} | {names} | {ok['dynamo']}/{len(models)} | "
                    f"{ok['legacy']}/{len(models)} | {err} | {plain} | {reference} | {'; '.join(notes)} |")
    rows.append("")
    rows.append("plain kernels: the largest share of `teacher bench --profile`'s time (1 thread, "
                "batch 8) in kdflow's own code rather than oneDNN primitives, over the family's "
                "profiled files (`--profile`; - where none was profiled), with the kinds of step "
                "that ran so; reference loops: the part of it in loops that go element by element "
                "(the reference's own way, kept for rare variants), the rest being kernels by rows "
                "or blocks (copies, fills, broadcasts, per-row norms).")
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
    return readme_block.update("teacher-zoo", table(doc), "--check" in sys.argv[1:],
                               "teacher coverage table", os.path.relpath(path, ROOT),
                               "scripts/zoo_table.py")


if __name__ == "__main__":
    sys.exit(main())
