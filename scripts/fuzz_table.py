#!/usr/bin/env python3
"""The README's table of fuzz targets, generated from the target list (fuzz/CMakeLists.txt's
KD_FUZZ_TARGETS) and each target's own header comment (its first sentence after "Fuzz target:").
Writes it between the README's fuzz-targets markers; with --check, exits 1 when the README's
table is not what the list gives (a ctest runs that). Standard library only (any python3).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import readme_block  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def targets():
    text = open(os.path.join(ROOT, "fuzz", "CMakeLists.txt")).read()
    return re.search(r"set\(KD_FUZZ_TARGETS ([^)]*)\)", text).group(1).split()


def what(target):
    lines = []
    for line in open(os.path.join(ROOT, "fuzz", f"{target}_fuzz.cpp")):
        if not line.startswith("//"):
            break
        lines.append(line[2:].strip())
    text = " ".join(lines)
    text = re.sub(r"^Fuzz target:\s*", "", text)
    first = re.split(r"(?<=[a-z)\]'`])\. ", text, maxsplit=1)[0].rstrip(".")
    return first.replace("|", "\\|")


def table():
    rows = ["| target | what it runs |", "|---|---|"]
    rows += [f"| `{t}` | {what(t)} |" for t in targets()]
    return "\n".join(rows)


def main():
    return readme_block.update("fuzz-targets", table(), "--check" in sys.argv[1:],
                               f"fuzz table ({len(targets())} targets)", "fuzz/CMakeLists.txt",
                               "scripts/fuzz_table.py")


if __name__ == "__main__":
    sys.exit(main())
