"""A generated block of README.md between two HTML-comment markers: written, or with check=True
compared (exit status 1 and one line naming the generator when it differs). Standard library
only; used by fuzz_table.py, zoo_table.py, ort_table.py and throughput_table.py."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def update(name, text, check, what, source, script):
    """Puts `text` between <!-- NAME:begin --> and <!-- NAME:end -->; returns the exit status."""
    path = os.path.join(ROOT, "README.md")
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    readme = open(path).read()
    start, stop = readme.index(begin) + len(begin), readme.index(end)
    updated = readme[:start] + "\n" + text + "\n" + readme[stop:]
    if check:
        if updated != readme:
            print(f"README.md's {what} differs from {source}: run {script}", file=sys.stderr)
            return 1
        print(f"README.md's {what} is {source}'s")
        return 0
    with open(path, "w") as f:
        f.write(updated)
    return 0


def machine_text(machine):
    """A result file's machine in a phrase: its CPU, the ISA flags that decide the kernels, its CPUs
    and oneDNN's ISA cap (bench/teacher_vs_ort.py's `machine`)."""
    kept = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    isa = ", ".join(f for f in machine["isa_flags"] if f in kept)
    capped = machine.get("onednn_max_cpu_isa") or "none"
    core = machine.get("cpu_id", {}).get("core")
    cpu = f"{machine['cpu']} ({core})" if core else machine["cpu"]
    return f"{cpu}; {isa}; {machine['cpus']} CPUs; ONEDNN_MAX_CPU_ISA {capped}"


def from_result(name, table, default, what, script):
    """The command line of a table made from one result file: [--check] [RESULT.json] (default
    `default`, relative to the tree); `table(doc, source)` gives the block's text."""
    args = [a for a in sys.argv[1:] if a != "--check"]
    source = args[0] if args else default
    with open(os.path.join(ROOT, source)) as f:
        doc = json.load(f)
    return update(name, table(doc, source), "--check" in sys.argv[1:], what, source, script)
