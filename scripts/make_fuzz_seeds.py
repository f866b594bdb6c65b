"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/): small valid inputs of every
reader, and known bad ones. Run with the project's venv python (onnx, numpy, pillow):
    $(cat .kdflow-venv)/bin/python scripts/make_fuzz_seeds.py fuzz/corpus
Deterministic (fixed seed); the outputs are committed, a few KB each."""
import gzip
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

rng = np.random.default_rng(20261123)


def put(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def model(nodes, inits, inp, out, opset=13):
    g = helper.make_graph(nodes, "g", [inp], [out],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def onnx_seeds(d):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    # A small CNN: Conv, BatchNormalization, Relu, MaxPool, GlobalAveragePool, Flatten, Gemm.
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "o", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    inits = {"w": f32(4, 1, 3, 3), "b": f32(4), "s": f32(4), "o": f32(4), "m": f32(4),
             "v": np.abs(f32(4)) + 1, "fw": f32(3, 4), "fb": f32(3)}
    put(d, "cnn.onnx", model(nodes, inits, x, y))
    # An MLP: Flatten, MatMul, Add, Relu, Gemm, Softmax.
    nodes = [
        helper.make_node("Flatten", ["x"], ["f"]),
        helper.make_node("MatMul", ["f", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=1),
    ]
    put(d, "mlp.onnx", model(nodes, {"w1": f32(36, 8), "b1": f32(8), "w2": f32(8, 3),
                                     "b2": f32(3)}, x, y))
    # Reshape and Transpose (the perm the importer range-checks).
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
        helper.make_node("ReduceMean", ["t"], ["m"], axes=[2], keepdims=0),
        helper.make_node("Gemm", ["m", "w", "b"], ["y"], transB=1),
    ]
    put(d, "transpose.onnx", model(nodes, {"shape": np.array([0, 6, 6], np.int64),
                                           "w": f32(3, 6), "b": f32(3)}, x, y))
    # Known bad: a perm out of range, zero strides, short BatchNormalization parameters.
    bad = [
        ("bad_perm.onnx", [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 7, 1, 2]),
                           helper.make_node("GlobalAveragePool", ["t"], ["g"]),
                           helper.make_node("Flatten", ["g"], ["y"])], {}),
        ("bad_stride.onnx", [helper.make_node("Conv", ["x", "w"], ["c"], strides=[0, 0]),
                             helper.make_node("GlobalAveragePool", ["c"], ["g"]),
                             helper.make_node("Flatten", ["g"], ["y"])], {"w": f32(3, 1, 3, 3)}),
        ("bad_bn.onnx", [helper.make_node("BatchNormalization", ["x", "s", "o", "m", "v"], ["n"]),
                         helper.make_node("GlobalAveragePool", ["n"], ["g"]),
                         helper.make_node("Flatten", ["g"], ["y"])],
         {"s": np.zeros((0,), np.float32), "o": f32(1), "m": f32(1), "v": f32(1)}),
    ]
    for name, nodes, inits in bad:
        put(d, name, model(nodes, inits, x, y))
    # Resource bombs (no random numbers: the seeds after these stay as they were): an input that
    # declares 10^10 pixels, and local functions that each call the next twice (2^30 nodes).
    big = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 100000, 100000])
    put(d, "huge_input.onnx", model([helper.make_node("GlobalAveragePool", ["x"], ["g"]),
                                     helper.make_node("Flatten", ["g"], ["y"])], {}, big, y))
    funcs = [helper.make_function("local", "f30", ["a"], ["b"],
                                  [helper.make_node("Relu", ["a"], ["b"])],
                                  [helper.make_opsetid("", 13)])]
    for k in range(29, -1, -1):
        funcs.append(helper.make_function(
            "local", f"f{k}", ["a"], ["b"],
            [helper.make_node(f"f{k + 1}", ["a"], ["t"], domain="local"),
             helper.make_node(f"f{k + 1}", ["t"], ["b"], domain="local")],
            [helper.make_opsetid("", 13), helper.make_opsetid("local", 1)]))
    g = helper.make_graph([helper.make_node("f0", ["x"], ["r"], domain="local"),
                           helper.make_node("GlobalAveragePool", ["r"], ["g"]),
                           helper.make_node("Flatten", ["g"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("local", 1)], functions=funcs)
    m.ir_version = 8
    put(d, "function_bomb.onnx", m.SerializeToString())


def idx_seeds(d):
    src = "/usr/share/datasets/fashion-mnist"
    with gzip.open(f"{src}/t10k-images-idx3-ubyte.gz") as f:
        images = f.read()
    with gzip.open(f"{src}/t10k-labels-idx1-ubyte.gz") as f:
        labels = f.read()
    n = 3
    img = struct.pack(">IIII", 0x803, n, 28, 28) + images[16:16 + n * 784]
    lab = struct.pack(">II", 0x801, n) + labels[8:8 + n]
    for gz in (False, True):
        a, b = (gzip.compress(lab, mtime=0), gzip.compress(img, mtime=0)) if gz else (lab, img)
        put(d, "gz" if gz else "plain", struct.pack("<I", len(a) << 1 | gz) + a + b)
    # Known bad: a header whose n * h * w wraps to 0 in 64 bits.
    lying = struct.pack(">IIII", 0x803, 1 << 31, 1 << 16, 1 << 16)
    lab = struct.pack(">II", 0x801, 1 << 31)
    put(d, "wrapping_header", struct.pack("<I", len(lab) << 1) + lab + lying)


def cifar_seeds(d):
    rec = lambda label_bytes: bytes(label_bytes) + rng.integers(0, 256, 3072, np.uint8).tobytes()
    put(d, "cifar10", b"\0" + rec(1) + rec(1))
    put(d, "cifar100", b"\1" + rec(2))
    put(d, "truncated", b"\0" + rec(1)[:1000])


def image_seeds(d):
    for w, h in ((8, 8), (40, 30), (1, 64)):
        pixels = rng.integers(0, 256, (h, w, 3), np.uint8)
        for fmt, ext in (("JPEG", "jpg"), ("PNG", "png")):
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, fmt)
            put(d, f"{w}x{h}.{ext}", buf.getvalue())
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (5, 7), np.uint8), "L").save(buf, "PNG")
    put(d, "gray.png", buf.getvalue())
    # Known bad: a PNG whose header claims 100000 x 100000 pixels.
    ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    chunk = lambda t, b: struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
    put(d, "huge_header.png", b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
        chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def config_seeds(d):
    put(d, "train.toml", b'[data]\nbatch_size = 32\n[kd]\ntemperature = 4.0\nalpha = 0.5\n'
        b'[train]\nepochs = 2\nlr = 0.1\n\0student.width=0.5\nkd.loss=dkd\n')
    put(d, "sets_only", b"\0ring.slots=4\ncores.loader_cpus=0-3,8\ntrain.seed=7\n")
    put(d, "nan", b"[train]\nlr = nan\n\0")


def checkpoint_seeds(d):
    payload = rng.integers(0, 256, 64, np.uint8).tobytes()
    header = b"KDFLOWC1" + struct.pack("<QI", len(payload), zlib.crc32(payload))
    put(d, "raw", b"\0" + header + payload)
    put(d, "wrapped", b"\1" + payload)
    put(d, "lying_length", b"\0" + b"KDFLOWC1" + struct.pack("<QI", 1 << 62, 0) + payload)


def plan_seeds(d):
    plan = {"student": [0], "copy": [0], "loader": [1, 2], "teacher": [[3], [4, 5]]}
    put(d, "plan.json", json.dumps({"plan": plan, "teacher_precision": "fp32"}).encode())
    put(d, "bare.json", json.dumps(plan).encode())
    put(d, "huge_cpu.json", json.dumps({"student": [2147483647], "loader": [1],
                                        "teacher": [[2]]}).encode())


def npy_seeds(d):
    for name, a in (("f32.npy", f32(2, 3)), ("f64.npy", rng.standard_normal(4)),
                    ("scalar.npy", np.float32(1.5))):
        buf = io.BytesIO()
        np.save(buf, a)
        put(d, name, buf.getvalue())
    put(d, "huge_shape.npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, "
        b"'shape': (1000000000, 1000000000), }" + b" " * 44 + b"\n")


def teacher_cache_seeds(d):
    # The payload TeacherOutputCache::save writes (8 samples x 5 classes, the fuzz target's key),
    # after a first byte that picks every logit (bit 0 clear) or the 2 largest (set), and 3
    # feature floats per sample beside the logits (bit 1).
    key = b"kdflow teacher outputs\nfuzz=1\n"
    for first, kept in ((0, 5), (1, 2), (2, 5), (3, 2)):
        stride = (5 if kept == 5 else kept + 1) + (3 if first & 2 else 0)
        flags = bytes([1, 0, 1, 1, 0, 0, 1, 1])
        values = rng.standard_normal(8 * stride).astype("<f4").tobytes()
        indices = b"" if kept == 5 else np.tile(np.array([3, 1], "<u4"), 8).tobytes()
        payload = (b"KDTCACHE" + struct.pack("<II", 1, len(key)) + key +
                   struct.pack("<QQQ", 8, 5, kept) + flags + values + indices)
        name = f"kept{kept}" + ("_features" if first & 2 else "")
        put(d, name, bytes([first]) + payload)
        put(d, f"{name}_other_key", bytes([first]) + payload.replace(b"fuzz=1", b"fuzz=2"))


if __name__ == "__main__":
    root = sys.argv[1]
    for target, make in (("onnx", onnx_seeds), ("idx", idx_seeds), ("cifar", cifar_seeds),
                         ("image", image_seeds), ("config", config_seeds),
                         ("checkpoint", checkpoint_seeds), ("plan", plan_seeds),
                         ("npy", npy_seeds), ("teacher_cache", teacher_cache_seeds)):
        make(os.path.join(root, target))
