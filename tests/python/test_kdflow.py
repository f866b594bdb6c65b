"""kdflow from Python (python/kdflow): train with a callback, the teacher against `kdflow teacher
infer` bit for bit, bad input raising the command line's message, Ctrl-C and a raising callback
stopping a run with its checkpoint saved, cores and export. Run by the ctest `python_module` (the
venv's python, PYTHONPATH at the module just built, the working folder the repository's)."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

import kdflow

KDFLOW = os.environ["KDFLOW_BIN"]
TEACHER = os.path.join(os.environ["KDFLOW_SOURCE_DIR"], "models", "fmnist_teacher.onnx")
FAST = {"student.arch": "mlp", "student.width": 0.25, "student.device": "cpu",
        "train.log_every": 5, "ring.slots": 4, "teacher.model": TEACHER}


def lines_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_train_returns_the_summary_and_calls_back_with_every_metrics_line(tmp_path):
    rows = []
    out = tmp_path / "run"
    summary = kdflow.train(overrides={**FAST, "train.max_steps": 10}, out=out,
                           callback=rows.append)
    assert summary["steps"] == 10
    assert summary == json.load(open(out / "summary.json"))
    assert 0 < summary["test_accuracy"] <= 1
    # Each line as metrics.jsonl holds it, in its order: the teacher's evaluation, the intervals,
    # the final evaluation.
    assert rows == lines_of(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "event" not in r] == [5, 10]
    assert any(r.get("event") == "eval" and "test_accuracy" in r for r in rows)


def test_teacher_infer_is_the_command_lines_bit_for_bit(tmp_path):
    cpus = os.sched_getaffinity(0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 1, 28, 28)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    subprocess.run([KDFLOW, "teacher", "infer", "--model", TEACHER, "--input",
                    str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"), "--threads",
                    "1"], check=True)
    want = np.load(tmp_path / "y.npy")
    teacher = kdflow.Teacher(TEACHER, threads=1)
    got = teacher.infer(x)
    assert got.dtype == np.float32 and got.shape == (16, 10)
    assert np.array_equal(got, want)  # bit for bit
    # Another batch size loads the model at that size; the first size still gives the same.
    assert teacher.infer(x[:4]).shape == (4, 10)
    assert np.array_equal(teacher.infer(x), want)
    info = teacher.info()
    assert info["input_shape"] == [16, 1, 28, 28]
    assert info["outputs"][0]["shape"] == [16, 10]
    assert info["precision"] == "fp32" and info["flops_per_sample"] > 0
    # The calling thread's CPUs are its own again.
    assert os.sched_getaffinity(0) == cpus


def test_bad_input_raises_the_command_lines_one_line_message(tmp_path):
    with pytest.raises(kdflow.InputError) as e:
        kdflow.train(overrides={**FAST, "teacher.model": str(tmp_path / "none.onnx")},
                     out=tmp_path / "run")
    assert isinstance(e.value, ValueError)
    message = str(e.value)
    assert "teacher.model" in message and "none.onnx" in message and "\n" not in message
    with pytest.raises(kdflow.InputError, match="train.max_steps"):
        kdflow.train(overrides={**FAST, "train.max_steps": -3}, out=tmp_path / "run2")
    with pytest.raises(kdflow.InputError, match="none.onnx"):
        kdflow.Teacher(tmp_path / "none.onnx").infer(np.zeros((2, 1, 28, 28), np.float32))
    with pytest.raises(kdflow.InputError, match="shape"):
        kdflow.Teacher(TEACHER, threads=1).infer(np.zeros((2, 3), np.float32))
    with pytest.raises(kdflow.InputError, match="no config.toml"):
        kdflow.export(tmp_path, tmp_path / "s.onnx")


def test_ctrl_c_stops_the_run_with_its_checkpoint_and_it_resumes(tmp_path):
    out = tmp_path / "run"
    steps = {**FAST, "train.max_steps": 60}
    cpus = os.sched_getaffinity(0)

    def interrupt(row):
        if row.get("step") == 10 and "event" not in row:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends

    with pytest.raises(KeyboardInterrupt):
        kdflow.train(overrides=steps, out=out, callback=interrupt)
    summary = json.load(open(out / "summary.json"))
    assert summary["interrupted"] and summary["steps"] < 60
    checkpoints = os.listdir(out / "checkpoints")
    assert f"step-{summary['steps']:09d}.ckpt" in checkpoints
    assert kdflow.train(overrides=steps, out=out, resume="auto")["steps"] == 60
    # Python's own SIGINT handler is back after the run, and the thread's CPUs are its own.
    assert os.sched_getaffinity(0) == cpus
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


def test_a_raising_callback_stops_the_run_and_its_error_is_raised(tmp_path):
    out = tmp_path / "run"

    def fail(row):
        if row.get("step") == 5:
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        kdflow.train(overrides={**FAST, "train.max_steps": 60}, out=out, callback=fail)
    summary = json.load(open(out / "summary.json"))
    assert summary["interrupted"] and summary["steps"] < 60


def test_cores_export_and_eval(tmp_path):
    plan = kdflow.cores(overrides={"student.device": "cpu"})
    assert plan["plan"]["student"] and plan["topology"]["cores"]
    out = tmp_path / "run"
    kdflow.train(overrides={**FAST, "train.max_steps": 5, "train.export": "off"}, out=out)
    onnx = kdflow.export(out, tmp_path / "student.onnx")
    assert os.path.getsize(onnx) > 0
    result = kdflow.eval(TEACHER, overrides={"student.device": "cpu"})
    assert 0.5 < result["top1"] <= 1
