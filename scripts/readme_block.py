"""A generated block of README.md between two HTML-comment markers: written, or with check=True
compared (exit status 1 and one line naming the generator when it differs). Standard library
only; used by fuzz_table.py and zoo_table.py."""
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
