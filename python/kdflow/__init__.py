"""kdflow from Python: what the `kdflow` command does, in-process.

    import kdflow
    summary = kdflow.train(overrides={"train.max_steps": 20, "student.device": "cpu"},
                           callback=lambda row: print(row["step"], row.get("loss")))
    teacher = kdflow.Teacher("models/fmnist_teacher.onnx", threads=1)
    logits = teacher.infer(images)          # float32, batch first: the oneDNN teacher's output

Each function runs the same code as its command (src/app), with the GIL released while it works.
Bad input raises kdflow.InputError (a ValueError) with the command line's one-line message; a
training run stopped by Ctrl-C (SIGINT) or SIGTERM saves its checkpoint and raises
KeyboardInterrupt; any other failure raises kdflow.Error (a RuntimeError).
"""
import json
import os
import tempfile

from . import _kdflow
from ._kdflow import Error, InputError

__all__ = ["train", "eval", "export", "cores", "Teacher", "Error", "InputError"]


def _sets(overrides):
    """{"train.max_steps": 20, "data.hflip": True} -> ["train.max_steps=20", "data.hflip=true"]."""
    out = []
    for key, value in (overrides or {}).items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            text = json.dumps(list(value))
        else:
            text = str(value)
        out.append(f"{key}={text}")
    return out


def train(config=None, overrides=None, out="runs/latest", resume=None, cores=None, callback=None):
    """Trains a student as `kdflow train` does; returns the run's summary.json as a dict.

    config: a TOML file; overrides: {key: value} as --set; out: the run folder; resume: "auto" or
    a checkpoint; cores: a tune-cores plan file; callback(row): each metrics.jsonl line as a dict,
    as it is written (an exception there stops the run, checkpoint saved, and is raised here)."""
    hook = None
    if callback is not None:
        def hook(line):
            callback(json.loads(line))
    path = _kdflow.train(config or "", _sets(overrides), str(out), resume or "", cores or "", hook)
    with open(path) as f:
        return json.load(f)


def eval(model, config=None, overrides=None):  # noqa: A001 (the command's name)
    """A model's accuracy on the data's test split, as `kdflow eval --json` reports it."""
    with tempfile.TemporaryDirectory(prefix="kdflow-eval-") as d:
        path = os.path.join(d, "eval.json")
        _kdflow.eval(str(model), config or "", _sets(overrides), path)
        with open(path) as f:
            return json.load(f)


def export(run, out, step=None, format="auto", force=False):  # noqa: A002
    """A run's trained student as ONNX or TorchScript, checked, as `kdflow export` writes it;
    returns `out`."""
    _kdflow.export(str(run), str(out), -1 if step is None else int(step), format, bool(force))
    return str(out)


def cores(config=None, overrides=None):
    """The topology and the core plan of a configuration, as `kdflow cores --json` prints them."""
    return json.loads(_kdflow.cores(config or "", _sets(overrides)))


class Teacher:
    """An ONNX teacher on kdflow's oneDNN engine, run as `kdflow teacher infer` runs it: pinned to
    `threads` physical cores (0: all), in `precision` (fp32, bf16 where the CPU has it), returning
    `features` (names of the graph's values) beside its logits."""

    def __init__(self, path, precision="fp32", threads=0, features=(), tune=None):
        self._t = _kdflow.Teacher(str(path), precision, int(threads), list(features), tune or "")

    def infer(self, x):
        """The teacher's outputs for a float32 batch (batch first): its logits, or with features
        a tuple (logits, feature, ...)."""
        outs = self._t.infer(x)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def info(self):
        """The model, its input and outputs with their shapes, parameters, FLOPs per sample, the
        plan's steps and precision."""
        return json.loads(self._t.info())

    def output_names(self):
        return self._t.output_names()
