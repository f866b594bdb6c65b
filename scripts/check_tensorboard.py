"""Reads a kdflow run folder's TensorBoard event files with TensorBoard's own EventAccumulator and
checks them against the folder's metrics.jsonl: every number of every line is a scalar tagged
"<event>/<key>" ("train/<key>" for the interval lines) at the line's step (kd-ctl's moves: their
batch), with the same value as a float32, no scalar more; the configuration (config.toml) and the
core plan are text summaries. Run with the venv's python (the kdflow app tests do).
Usage: check_tensorboard.py RUN_FOLDER [--files N] [--out report.json]; exit 1 on a mismatch."""
import argparse
import glob
import json
import os
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util


def expected_scalars(run):
    """tag -> [(step, float32 value)] in metrics.jsonl's order."""
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            group = m.get("event", "train")
            step = m["step"] if "step" in m else m.get("batch", 0)
            for key, value in m.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                out.setdefault(f"{group}/{key}", []).append((step, np.float32(value)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--files", type=int, help="how many event files the folder must hold")
    ap.add_argument("--out", help="write the report here too")
    args = ap.parse_args()
    problems = []
    files = sorted(glob.glob(os.path.join(args.run, "events.out.tfevents.*")))
    if args.files is not None and len(files) != args.files:
        problems.append(f"{len(files)} event files, not {args.files}: {files}")
    acc = EventAccumulator(args.run, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    want = expected_scalars(args.run)
    got_tags = set(tags.get("scalars", []))
    if got_tags != set(want):
        problems.append(f"scalar tags differ: only in the events {sorted(got_tags - set(want))}, "
                        f"only in metrics.jsonl {sorted(set(want) - got_tags)}")
    compared = 0
    for tag in sorted(got_tags & set(want)):
        got = [(e.step, np.float32(e.value)) for e in acc.Scalars(tag)]
        if got != want[tag]:
            problems.append(f"{tag}: events {got[:5]}... against metrics.jsonl {want[tag][:5]}...")
        compared += len(got)
    texts = {}
    for tag in tags.get("tensors", []):
        events = acc.Tensors(tag)
        texts[tag] = tensor_util.make_ndarray(events[-1].tensor_proto).reshape(-1)[0].decode()
    with open(os.path.join(args.run, "config.toml")) as f:
        config = f.read()
    if config not in texts.get("config", ""):
        problems.append("the 'config' text summary is not config.toml")
    if "cores" not in texts:
        problems.append("no 'cores' text summary (the core plan)")
    report = {"run": args.run, "event_files": len(files), "scalar_tags": len(got_tags),
              "scalars_compared": compared, "texts": sorted(texts), "problems": problems}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    print(json.dumps(report))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
