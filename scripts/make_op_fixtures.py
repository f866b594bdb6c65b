#!/usr/bin/env python3
"""Writes one small ONNX model per supported op and edge case (onnx.helper, no exporter), plus a
few models that must be rejected, for kdflow's op-level teacher tests. Run with the kdflow venv's
python (it has onnx and numpy).

usage: make_op_fixtures.py OUT_DIR

Each model takes one float input "x" whose first dimension is the batch; constants are
initializers with fresh random values every run. manifest.json lists {name, input shape} for the
models kdflow must run, and {name, error} for those it must refuse with that text in the message.
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def model(nodes, x_shape, inits=(), opset=17, out="y", out_shape=None, functions=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"] + list(x_shape[1:]))
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)
    g = helper.make_graph(nodes, "g", [x], [y], initializer=list(inits))
    domains = sorted({f.domain for f in functions})
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains],
                          functions=list(functions))
    m.ir_version = 8 if opset <= 18 else 10  # opsets 19 on come with IR 9 and 10
    # Give the output its inferred type and shape, as exporters write it (the checker wants one).
    inferred = onnx.shape_inference.infer_shapes(m)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name == out and vi.type.tensor_type.HasField("shape"):
            m.graph.output[0].CopyFrom(vi)
    return m


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), name=f"{op.lower()}_node", **attrs)


def cases():
    c = {}
    X = (2, 4, 9, 11)
    # Conv: groups, depthwise, strides, dilations, pads, auto_pad, no bias
    c["conv_basic"] = model([node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], X, [const("w", rand(6, 4, 3, 3)), const("b", rand(6))])
    c["conv_groups_stride_dil"] = model([node("Conv", ["x", "w"], group=2, strides=[2, 1], dilations=[2, 2], pads=[2, 1, 0, 3])], X, [const("w", rand(6, 2, 3, 3))])
    c["conv_depthwise"] = model([node("Conv", ["x", "w", "b"], group=4, pads=[1, 1, 1, 1], strides=[2, 2])], X, [const("w", rand(4, 1, 3, 3)), const("b", rand(4))])
    # int8 at full range: every weight of a row and every input of a product near its largest
    # magnitude and of one sign, so that a kernel summing pairs of u8 x s8 products in 16 bits
    # would saturate on 8-bit weights (255 x 127 x 2 > 32767): a depthwise convolution reading u8
    # (after the first Relu), its negative bias making its output s8 for the 3x3 convolution after
    # it, and a pointwise convolution reading u8 again.
    def near_one(*shape):
        return rng.uniform(0.9, 1.0, shape).astype(np.float32)
    c["int8_full_range"] = model([node("Relu", ["x"], ["r"]),
                                  helper.make_node("Conv", ["r", "wd", "bd"], ["d"], name="depthwise", group=8, pads=[1, 1, 1, 1]),
                                  helper.make_node("Conv", ["d", "w"], ["c"], name="dense", pads=[1, 1, 1, 1]),
                                  helper.make_node("Relu", ["c"], ["cr"], name="relu2"),
                                  helper.make_node("Conv", ["cr", "wp"], ["y"], name="pointwise")],
                                 (2, 8, 9, 11), [const("wd", near_one(8, 1, 3, 3)), const("bd", np.full(8, -6.0, np.float32)),
                                                 const("w", near_one(6, 8, 3, 3)), const("wp", near_one(4, 6, 1, 1))])
    # int8 weights bounded in pairs: in each row (of either sign, all its weights of that sign) the
    # weights of neighbouring input channels at one tap are one large (0.9-1) and one small (0.15
    # of that), and every input is near its largest magnitude. Without int8 dot products kdflow
    # holds each neighbouring pair within 128 (the large weights get about 110 levels); a kernel
    # that summed any other two products in 16 bits (channels two apart, neighbouring taps, the
    # last channel of one tap with the first of the next: 5 channels) would saturate
    # (255 x 110 x 2 > 32767). A 3x3 convolution on u8 (after the Relu), one on its s8 output, a
    # pointwise one on u8; and a Gemm on u8 (two axes, after the Relu) whose reduction (258)
    # oneDNN's GEMM splits into two blocks of 129 on AVX2.
    def paired(o, c, *taps):
        w = rng.uniform(0.9, 1.0, (o, c) + taps).astype(np.float32)
        w[:, 1::2] *= 0.15
        return w * np.where(np.arange(o) % 2 == 0, 1.0, -1.0).astype(np.float32).reshape((o,) + (1,) * (1 + len(taps)))
    c["int8_paired_conv"] = model([node("Relu", ["x"], ["r"]),
                                   helper.make_node("Conv", ["r", "w1"], ["a"], name="dense_u8", pads=[1, 1, 1, 1]),
                                   helper.make_node("Conv", ["a", "w2"], ["b"], name="dense_s8", pads=[1, 1, 1, 1]),
                                   helper.make_node("Relu", ["b"], ["br"], name="relu2"),
                                   helper.make_node("Conv", ["br", "w3"], ["y"], name="pointwise")],
                                  (2, 5, 9, 11), [const("w1", paired(6, 5, 3, 3)), const("w2", paired(8, 6, 3, 3)),
                                                  const("w3", paired(4, 8, 1, 1))])
    c["int8_paired_gemm"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("Relu", ["f"], ["r"], name="relu"),
                                   helper.make_node("Gemm", ["r", "w1"], ["h"], name="gemm_u8", transB=1),
                                   helper.make_node("Relu", ["h"], ["hr"], name="relu2"),
                                   helper.make_node("Gemm", ["hr", "w2"], ["y"], name="head", transB=1)],
                                  (2, 258, 1, 1), [const("w1", paired(12, 258)), const("w2", rand(3, 12))])
    c["conv_same_upper"] = model([node("Conv", ["x", "w"], auto_pad="SAME_UPPER", strides=[2, 2])], X, [const("w", rand(5, 4, 4, 4))])
    c["conv_same_lower"] = model([node("Conv", ["x", "w"], auto_pad="SAME_LOWER", strides=[2, 3])], X, [const("w", rand(5, 4, 2, 3))])
    c["conv_valid"] = model([node("Conv", ["x", "w"], auto_pad="VALID", kernel_shape=[3, 5])], X, [const("w", rand(3, 4, 3, 5))])
    # Kernel taps that read only padding (trimmed at load): 3x3 on a 1x1 map, stride 2 on 2x2,
    # dilated and grouped on a 1-row map (rows trimmed, columns kept).
    c["conv_taps_in_padding"] = model([node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], (2, 8, 1, 1), [const("w", rand(6, 8, 3, 3)), const("b", rand(6))])
    c["conv_taps_in_padding_stride"] = model([node("Conv", ["x", "w"], strides=[2, 2], pads=[1, 1, 1, 1])], (2, 4, 2, 2), [const("w", rand(5, 4, 3, 3))])
    c["conv_taps_in_padding_dilated"] = model([node("Conv", ["x", "w"], group=2, dilations=[2, 2], pads=[2, 2, 2, 2])], (2, 4, 1, 3), [const("w", rand(4, 2, 3, 3))])
    c["batchnorm_alone"] = model([node("BatchNormalization", ["x", "s", "bb", "m", "v"], epsilon=1e-3)], X,
                                 [const("s", rand(4)), const("bb", rand(4)), const("m", rand(4)), const("v", np.abs(rand(4)) + 0.5)])
    c["conv_bn_relu"] = model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["d"], name="bn"),
                               helper.make_node("Relu", ["d"], ["y"], name="relu")], X,
                              [const("w", rand(6, 4, 3, 3)), const("s", rand(6)), const("bb", rand(6)), const("m", rand(6)), const("v", np.abs(rand(6)) + 0.5)])
    # Activations, alone and fused after a conv
    for op, attrs, opset in [("Relu", {}, 17), ("LeakyRelu", {"alpha": 0.2}, 17), ("Sigmoid", {}, 17),
                             ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, 17), ("HardSwish", {}, 17)]:
        c[f"{op.lower()}_alone"] = model([node(op, ["x"], **attrs)], X, opset=opset)
        c[f"conv_{op.lower()}"] = model([node("Conv", ["x", "w"], ["c"]), helper.make_node(op, ["c"], ["y"], name="act", **attrs)], X, [const("w", rand(3, 4, 1, 1))], opset=opset)
    # SiLU as exporters write it, x * Sigmoid(x): after a conv (fused into it), alone, and with the
    # Sigmoid read twice (not fused).
    c["conv_silu"] = model([node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
                            helper.make_node("Mul", ["c", "s"], ["y"], name="mul")], X, [const("w", rand(3, 4, 1, 1))])
    c["silu_alone"] = model([node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"], name="mul")], X)
    c["silu_gate_read_twice"] = model([node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"], name="mul"),
                                       helper.make_node("Add", ["m", "s"], ["y"], name="add")], X)
    # Gelu's erf form as the legacy exporter writes it (fused into one Gelu), and with the scale
    # as a product by 1/sqrt(2) and every sum and product the other way round.
    c["gelu_erf_form"] = model([node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"], name="erf"),
                                helper.make_node("Add", ["e", "one"], ["a"], name="add"), helper.make_node("Mul", ["x", "a"], ["m"], name="mul"),
                                helper.make_node("Mul", ["m", "half"], ["y"], name="half")], X,
                               [const("r2", np.float32(np.sqrt(2))), const("one", np.float32(1)), const("half", np.float32(0.5))])
    c["gelu_erf_form_swapped"] = model([node("Mul", ["inv", "x"], ["d"]), helper.make_node("Erf", ["d"], ["e"], name="erf"),
                                        helper.make_node("Add", ["one", "e"], ["a"], name="add"), helper.make_node("Mul", ["a", "x"], ["m"], name="mul"),
                                        helper.make_node("Mul", ["half", "m"], ["y"], name="half")], X,
                                       [const("inv", np.float32(1 / np.sqrt(2))), const("one", np.float32(1)), const("half", np.float32(0.5))])
    # Attention's scaled products: q * s and k^T * s before the product as the dynamo exporter
    # writes them, the product / sqrt(d) after it as the legacy one does (both fused into the
    # MatMul's scale), a product followed by an activation (fused), a Gemm with C scaled after it
    # (alpha and beta), and a scaled operand read twice (not fused).
    def att(nodes, inits):
        return model(nodes + [helper.make_node("Softmax", ["p"], ["sm"], name="softmax", axis=-1),
                              helper.make_node("MatMul", ["sm", "x"], ["y"], name="context")], X, inits)
    c["attention_scaled_operands"] = att([node("Mul", ["x", "s"], ["q"]), helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
                                          helper.make_node("Mul", ["s", "kt"], ["ks"], name="ks"),
                                          helper.make_node("MatMul", ["q", "ks"], ["p"], name="scores")],
                                         [const("s", np.float32(11 ** -0.25))])
    c["attention_divided_product"] = att([helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
                                          helper.make_node("MatMul", ["x", "kt"], ["qk"], name="scores"),
                                          node("Div", ["qk", "d"], ["p"])],
                                         [const("d", np.array([np.sqrt(11)], np.float32))])
    c["matmul_computed_relu"] = model([helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
                                       helper.make_node("MatMul", ["x", "kt"], ["qk"], name="scores"), node("Relu", ["qk"])], X)
    c["gemm_scaled_after"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w", "c"], ["g"], name="gemm", transB=1),
                                    helper.make_node("Mul", ["g", "half"], ["y"], name="half")], X,
                                   [const("w", rand(5, 396)), const("c", rand(5)), const("half", np.float32(0.5))])
    c["scaled_operand_read_twice"] = model([node("Mul", ["x", "s"], ["q"]), helper.make_node("Transpose", ["q"], ["qt"], name="qt", perm=[0, 1, 3, 2]),
                                            helper.make_node("MatMul", ["q", "qt"], ["p"], name="scores"),
                                            helper.make_node("MatMul", ["p", "q"], ["y"], name="context")], X, [const("s", np.float32(0.3))])
    # LayerNormalization as exporters before opset 17 write it (fused into one), with and without
    # the affine part.
    def decomposed_ln(affine):
        nodes = [node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"], name="sub"),
                 helper.make_node("Pow", ["d", "two"], ["p"], name="pow"), helper.make_node("ReduceMean", ["p"], ["v"], name="var", axes=[-1]),
                 helper.make_node("Add", ["v", "eps"], ["ve"], name="addeps"), helper.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
                 helper.make_node("Div", ["d", "s"], ["n" if affine else "y"], name="div")]
        inits = [const("two", np.float32(2)), const("eps", np.float32(1e-5))]
        if affine:
            nodes += [helper.make_node("Mul", ["n", "gamma"], ["o"], name="scale"), helper.make_node("Add", ["o", "beta"], ["y"], name="shift")]
            inits += [const("gamma", rand(11)), const("beta", rand(11))]
        return model(nodes, X, inits, opset=13)
    c["layernorm_decomposed"] = decomposed_ln(True)
    c["layernorm_decomposed_plain"] = decomposed_ln(False)
    # Resize: nearest (each rounding, each coordinate transformation) and linear, up and down, by
    # scales and by sizes.
    R = (2, 3, 5, 7)
    for i, (mode, transform, rounding) in enumerate([
            ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
            ("nearest", "align_corners", "round_prefer_ceil"), ("nearest", "pytorch_half_pixel", "ceil"),
            ("linear", "half_pixel", "round_prefer_floor"), ("linear", "pytorch_half_pixel", "round_prefer_floor"),
            ("linear", "align_corners", "round_prefer_floor"), ("linear", "asymmetric", "round_prefer_floor")]):
        scales = [1, 1, 2.0, 1.5] if i % 2 == 0 else [1, 1, 0.6, 2.5]
        c[f"resize_{mode}_{transform}_scales"] = model(
            [node("Resize", ["x", "", "scales"], mode=mode, coordinate_transformation_mode=transform, nearest_mode=rounding)], R,
            [const("scales", np.array(scales, np.float32))], opset=13)
    c["resize_linear_sizes"] = model([node("Resize", ["x", "", "", "sizes"], mode="linear")], R,
                                     [const("sizes", np.array([2, 3, 9, 4], np.int64))], opset=13)
    c["resize_nearest_sizes_opset19"] = model([node("Resize", ["x", "", "", "sizes"], mode="nearest")], R,
                                              [const("sizes", np.array([2, 3, 4, 11], np.int64))], opset=19)
    c["clip_inputs"] = model([node("Clip", ["x", "lo", "hi"])], X, [const("lo", np.float32(-0.5)), const("hi", np.float32(0.7))], opset=11)
    c["clip_max_only"] = model([node("Clip", ["x", "", "hi"])], X, [const("hi", np.float32(6.0))], opset=13)
    c["conv_clip_relu6"] = model([node("Conv", ["x", "w"], ["c"]), helper.make_node("Clip", ["c", "lo", "hi"], ["y"], name="clip")], X,
                                 [const("w", rand(3, 4, 1, 1)), const("lo", np.float32(0)), const("hi", np.float32(6))])
    # Binary ops with broadcasting (second operand, first operand, both computed)
    for op in ["Add", "Sub", "Mul", "Div"]:
        c[f"{op.lower()}_bcast_channel"] = model([node(op, ["x", "k"])], X, [const("k", rand(1, 4, 1, 1) + (3 if op == "Div" else 0))])
        c[f"{op.lower()}_bcast_first"] = model([node(op, ["k", "x"])], X, [const("k", rand(4, 1, 11) + 2)])
        c[f"{op.lower()}_two_computed"] = model([helper.make_node("Relu", ["x"], ["r"], name="r"), node(op, ["x", "r"] if op != "Div" else ["r", "x"])], X)
    c["conv_residual_add_relu"] = model([node("Relu", ["x"], ["a"]), helper.make_node("Conv", ["a", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                                         helper.make_node("Add", ["c", "a"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu2")], X,
                                        [const("w", rand(4, 4, 3, 3))])
    # Pooling
    c["maxpool_pads"] = model([node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])], X)
    c["maxpool_ceil"] = model([node("MaxPool", ["x"], kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)], X)
    c["maxpool_dilated"] = model([node("MaxPool", ["x"], kernel_shape=[2, 2], dilations=[2, 2])], X)
    c["avgpool_exclude_ceil"] = model([node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)], X)
    c["avgpool_include_pad"] = model([node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)], X)
    c["avgpool_same_upper"] = model([node("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")], X)
    c["global_avgpool"] = model([node("GlobalAveragePool", ["x"])], X)
    c["reducemean_keep"] = model([node("ReduceMean", ["x"], axes=[2, 3], keepdims=1)], X, opset=13)
    c["reducemean_drop"] = model([node("ReduceMean", ["x"], axes=[-1, -2], keepdims=0)], X, opset=13)
    # Shape ops
    c["flatten_gemm"] = model([node("Flatten", ["x"], ["f"], axis=1), helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="gemm", transB=1)], X,
                              [const("w", rand(7, 4 * 9 * 11)), const("b", rand(7))])
    c["gemm_alpha_beta"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w", "b"], ["y"], name="gemm", alpha=0.5, beta=2.0)], X,
                                 [const("w", rand(4 * 9 * 11, 5)), const("b", rand(1, 5))])
    c["gemm_relu"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["g"], name="gemm", transB=1), helper.make_node("Relu", ["g"], ["y"], name="relu")], X,
                           [const("w", rand(6, 4 * 9 * 11))])
    c["matmul_const"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("MatMul", ["f", "w"], ["y"], name="mm")], X, [const("w", rand(4 * 9 * 11, 3))])
    c["matmul_batched"] = model([node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]), helper.make_node("MatMul", ["x", "t"], ["y"], name="mm")], X)
    c["reshape_shape_subgraph"] = model([
        node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"], name="unsq"), helper.make_node("Concat", ["nu", "minus1"], ["shape"], name="cat", axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], X,
        [const("zero", np.array(0, np.int64)), const("ax0", np.array([0], np.int64)), const("minus1", np.array([-1], np.int64))], opset=13,
        out_shape=["N", 4 * 9 * 11])
    c["reshape_zero_copy"] = model([node("Reshape", ["x", "shape"])], X, [const("shape", np.array([0, 4, -1], np.int64))])
    c["transpose"] = model([node("Transpose", ["x"], perm=[0, 2, 3, 1])], X)
    c["concat_axis1"] = model([node("Relu", ["x"], ["r"]), helper.make_node("Concat", ["x", "r", "k"], ["y"], name="cat", axis=1)], X, [const("k", rand(2, 3, 9, 11))])
    c["split_attr_opset11"] = model([node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3]), helper.make_node("Sub", ["b", "a"], ["y"], name="sub")], X, opset=11)
    c["split_input_opset13"] = model([node("Split", ["x", "sp"], ["a", "b"], axis=3), helper.make_node("Concat", ["b", "a"], ["y"], name="cat", axis=3)], X,
                                     [const("sp", np.array([5, 6], np.int64))], opset=13)
    c["slice_steps"] = model([node("Slice", ["x", "st", "en", "ax", "sp"])], X,
                             [const("st", np.array([1, 0], np.int64)), const("en", np.array([8, 100], np.int64)), const("ax", np.array([2, 3], np.int64)), const("sp", np.array([2, 3], np.int64))])
    c["slice_negative_step"] = model([node("Slice", ["x", "st", "en", "ax", "sp"])], X,
                                     [const("st", np.array([-1], np.int64)), const("en", np.array([-100], np.int64)), const("ax", np.array([3], np.int64)), const("sp", np.array([-1], np.int64))])
    for mode in ["constant", "reflect", "edge"]:
        inputs = ["x", "p", "v"] if mode == "constant" else ["x", "p"]
        inits = [const("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))] + ([const("v", np.float32(0.25))] if mode == "constant" else [])
        c[f"pad_{mode}"] = model([node("Pad", inputs, mode=mode)], X, inits, opset=13)
    # A constant Pad of channels and both spatial axes (a copy into the padded buffer's window and a
    # fill of its border), one that pads nothing (the input itself) and one that crops two sides
    # (negative pads: element by element).
    c["pad_constant_three_axes"] = model([node("Pad", ["x", "p", "v"], mode="constant")], X,
                                         [const("p", np.array([0, 2, 1, 3, 0, 1, 2, 1], np.int64)), const("v", np.float32(-1.5))], opset=13)
    c["pad_constant_nothing"] = model([node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "p"], ["y"], name="pad")], X,
                                      [const("p", np.zeros(8, np.int64))], opset=13)
    c["pad_constant_crop"] = model([node("Pad", ["x", "p", "v"], mode="constant")], X,
                                   [const("p", np.array([0, 0, -1, 2, 0, 0, 1, -3], np.int64)), const("v", np.float32(0.5))], opset=13)
    # A Pad of zeros before a Conv or an AveragePool (folded into its padding), and the cases that
    # must stay two nodes: a MaxPool, a non-zero value, an AveragePool that leaves its own padding
    # out of its averages.
    zeros = [const("p", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)), const("v", np.float32(0))]
    c["pad_then_conv"] = model([node("Pad", ["x", "p", "v"], ["q"], mode="constant"),
                                helper.make_node("Conv", ["q", "w", "b"], ["y"], name="conv", pads=[1, 0, 0, 1])], X,
                               zeros + [const("w", rand(6, 4, 3, 3)), const("b", rand(6))], opset=13)
    c["pad_then_avgpool"] = model([node("Pad", ["x", "p"], ["q"]),
                                   helper.make_node("AveragePool", ["q"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2])], X,
                                  zeros[:1], opset=13)
    c["pad_then_avgpool_own_pads"] = model([node("Pad", ["x", "p", "v"], ["q"]),
                                            helper.make_node("AveragePool", ["q"], ["y"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1])], X,
                                           zeros, opset=13)
    c["pad_then_maxpool"] = model([node("Pad", ["x", "p"], ["q"]),
                                   helper.make_node("MaxPool", ["q"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])], X,
                                  zeros[:1], opset=13)
    c["pad_value_then_conv"] = model([node("Pad", ["x", "p", "v"], ["q"]),
                                      helper.make_node("Conv", ["q", "w"], ["y"], name="conv")], X,
                                     [zeros[0], const("v", np.float32(0.5)), const("w", rand(3, 4, 3, 3))], opset=13)
    c["softmax_opset11"] = model([node("Flatten", ["x"], ["f"]), helper.make_node("Softmax", ["f"], ["y"], name="sm", axis=1)], X, opset=11)
    c["softmax_opset13_axis"] = model([node("Softmax", ["x"], axis=1)], X, opset=13)
    c["identity_dropout"] = model([node("Identity", ["x"], ["i"]), helper.make_node("Dropout", ["i"], ["d"], name="drop"), helper.make_node("Relu", ["d"], ["y"], name="relu")], X, opset=13)
    c["constant_cast_squeeze"] = model([
        helper.make_node("Constant", [], ["k"], name="const", value=numpy_helper.from_array(rand(1, 4, 1, 1), "k")),
        helper.make_node("Cast", ["k"], ["kc"], name="cast", to=1),
        helper.make_node("Squeeze", ["kc", "sq"], ["ks"], name="squeeze"),
        helper.make_node("Unsqueeze", ["ks", "usq"], ["ku"], name="unsqueeze"),
        node("Mul", ["x", "ku"])], X, [const("sq", np.array([0, 2, 3], np.int64)), const("usq", np.array([1, 2], np.int64))], opset=13)
    # Transformer and modern-CNN ops (opset 17 on) and the shape logic exporters write around them.
    c["layer_norm_last_axis"] = model([node("LayerNormalization", ["x", "s", "b"], epsilon=1e-3)], X, [const("s", rand(11)), const("b", rand(11))])
    c["layer_norm_two_axes"] = model([node("LayerNormalization", ["x", "s"], axis=2)], X, [const("s", rand(1, 11))])
    c["gelu_opset20"] = model([node("Gelu", ["x"])], X, opset=20)
    c["gelu_tanh_opset20"] = model([node("Gelu", ["x"], approximate="tanh")], X, opset=20)
    c["erf_tanh"] = model([node("Erf", ["x"], ["e"]), helper.make_node("Tanh", ["e"], ["y"], name="tanh")], X)
    c["sqrt_pow"] = model([node("Mul", ["x", "x"], ["sq"]), helper.make_node("Sqrt", ["sq"], ["r"], name="sqrt"),
                           helper.make_node("Pow", ["r", "e"], ["y"], name="pow")], X, [const("e", np.float32(3.0))])
    c["conv_gelu_fused"] = model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Gelu", ["c"], ["y"], name="gelu")], X, [const("w", rand(5, 4, 3, 3))], opset=20)
    # Two residual sums after one convolution (Add(Add(conv, a), b), both summands ready before
    # it and dead after): the convolution takes the first as its sum post-op, the second stays
    # an Add (it once took both and wrote conv + 2a).
    c["conv_two_residual_adds"] = model([node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"], name="sig"),
                                         helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                                         helper.make_node("Add", ["c", "a"], ["s"], name="add1"), helper.make_node("Add", ["s", "b"], ["y"], name="add2")], X,
                                        [const("w", rand(4, 4, 3, 3))])
    # 3x3 convolutions of stride 1 with 16 channels and more, which the Winograd ways take
    # (TeacherOps.WinogradWaysMatchTheReference): channels that fill no whole vector (20 in, 18
    # out), maps that are no whole number of tiles, asymmetric padding of up to 2, no padding,
    # and every kind of post-op: activations vectorized (Relu) and elementwise (LeakyRelu, Clip,
    # Gelu), a residual sum into another convolution's output.
    W = (2, 20, 9, 11)
    c["winograd_tails"] = model([node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1])], W, [const("w", rand(18, 20, 3, 3)), const("b", rand(18))])
    c["winograd_pads"] = model([node("Conv", ["x", "w"], pads=[2, 0, 1, 2])], W, [const("w", rand(17, 20, 3, 3))])
    c["winograd_valid"] = model([node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"], name="relu")], (2, 32, 10, 7),
                                [const("w", rand(16, 32, 3, 3)), const("b", rand(16))])
    c["winograd_leaky_clip"] = model([node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("LeakyRelu", ["c1"], ["l"], name="leaky", alpha=0.1),
                                      helper.make_node("Conv", ["l", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
                                      helper.make_node("Clip", ["c2", "lo", "hi"], ["y"], name="clip")], W,
                                     [const("w1", rand(20, 20, 3, 3)), const("w2", rand(24, 20, 3, 3)), const("lo", np.float32(-300)), const("hi", np.float32(400))])
    # Enough tiles for several chunks per matmul (and a short last one with the 2x2 tiles).
    c["winograd_chunks"] = model([node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"], name="relu")], (2, 16, 66, 66),
                                 [const("w", rand(16, 16, 3, 3)), const("b", rand(16))])
    c["winograd_residual_gelu"] = model([node("Conv", ["x", "w1"], ["s"]), helper.make_node("Conv", ["x", "w2"], ["h"], name="conv3x3", pads=[1, 1, 1, 1]),
                                         helper.make_node("Add", ["h", "s"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
                                         helper.make_node("Conv", ["r", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
                                         helper.make_node("Gelu", ["c3"], ["y"], name="gelu")], W,
                                        [const("w1", rand(18, 20, 1, 1)), const("w2", rand(18, 20, 3, 3)), const("w3", rand(16, 18, 3, 3))], opset=20)
    # 5x5 convolutions of stride 1, which F(4x4, 5x5) and F(2x2, 5x5) take (the same test; named
    # winograd5_ so that the 3x3 fixtures' bf16 test leaves them, as bf16 offers neither): channels that
    # fill no whole vector, maps of no whole number of tiles, padding of 2, asymmetric and none,
    # a residual sum, Relu and Gelu, and enough tiles for several chunks.
    c["winograd5_tails"] = model([node("Conv", ["x", "w", "b"], pads=[2, 2, 2, 2])], W, [const("w", rand(18, 20, 5, 5)), const("b", rand(18))])
    c["winograd5_pads"] = model([node("Conv", ["x", "w"], pads=[2, 0, 1, 3])], W, [const("w", rand(17, 20, 5, 5))])
    c["winograd5_residual_gelu"] = model([node("Conv", ["x", "w1"], ["s"]), helper.make_node("Conv", ["x", "w2"], ["h"], name="conv5x5", pads=[2, 2, 2, 2]),
                                          helper.make_node("Add", ["h", "s"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
                                          helper.make_node("Conv", ["r", "w3"], ["c3"], name="conv3"),
                                          helper.make_node("Gelu", ["c3"], ["y"], name="gelu")], W,
                                         [const("w1", rand(18, 20, 1, 1)), const("w2", rand(18, 20, 5, 5)), const("w3", rand(16, 18, 5, 5))], opset=20)
    c["winograd5_chunks"] = model([node("Conv", ["x", "w", "b"], ["c"], pads=[2, 2, 2, 2]), helper.make_node("Relu", ["c"], ["y"], name="relu")], (2, 16, 40, 40),
                                  [const("w", rand(16, 16, 5, 5)), const("b", rand(16))])
    # Convolutions over few input channels, which the im2col way takes
    # (TeacherOps.Im2colWayMatchesTheReference): an image stem (7x7, stride 2, padding 3, 3
    # channels in, 20 out: no whole vector) with a bias and a Relu; and on one channel a dilated
    # 5x5 kernel (taps read strided, in the padding on every side) over a map of enough pixels for
    # several chunks, whose residual summand is another im2col convolution's output, then a
    # Sigmoid after the sum.
    c["im2col_stem"] = model([node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[3, 3, 3, 3]), helper.make_node("Relu", ["c"], ["y"], name="relu")], (2, 3, 29, 31),
                             [const("w", rand(20, 3, 7, 7)), const("b", rand(20))])
    c["im2col_dilated_residual"] = model([node("Conv", ["x", "w1"], ["s"], pads=[1, 1, 1, 1]),
                                          helper.make_node("Conv", ["x", "w2", "b2"], ["h"], name="dilated", dilations=[2, 3], pads=[4, 6, 4, 6]),
                                          helper.make_node("Add", ["h", "s"], ["a"], name="add"), helper.make_node("Sigmoid", ["a"], ["y"], name="sigmoid")], (2, 1, 97, 101),
                                         [const("w1", rand(8, 1, 3, 3)), const("w2", rand(8, 1, 5, 5)), const("b2", rand(8))])
    # Views (TeacherOps.ViewsAreCopiedOutOnceAndMatchTheReference): shape ops on a computed value
    # leave views of its bytes, copied out once by their reader. Attention as a seq-first
    # exporter writes it: one projection transposed, split into heads and selected into Q, K and
    # V (a reshape that merges the batch with the heads, which no strides say), a negative index.
    VA = (2, 6, 24)
    def r(i, o, shape):
        return [helper.make_node("Reshape", [i, f"{o}_shape"], [o], name=f"reshape_{o}")], [const(f"{o}_shape", np.array(shape, np.int64))]
    nodes, inits = r("t", "r", [6, -1, 3, 8])
    nodes = [node("Relu", ["x"], ["p"]), helper.make_node("Transpose", ["p"], ["t"], name="seq_first", perm=[1, 0, 2])] + nodes
    nodes += [helper.make_node("Unsqueeze", ["r", "zero"], ["u"], name="unsqueeze"),
              helper.make_node("Transpose", ["u"], ["tt"], name="qkv_first", perm=[3, 1, 2, 0, 4]),
              helper.make_node("Squeeze", ["tt", "three"], ["sq"], name="squeeze")]
    inits += [const("zero", np.array([0], np.int64)), const("three", np.array([3], np.int64))]
    for name, index in (("q", 0), ("k", -2), ("v", 2)):
        nodes.append(helper.make_node("Gather", ["sq", f"i_{name}"], [f"{name}_sel"], name=f"select_{name}", axis=0))
        inits.append(const(f"i_{name}", np.array(index, np.int64)))
        n, i = r(f"{name}_sel", f"{name}_heads", [6, -1, 4])
        nodes += n; inits += i
    nodes += [helper.make_node("Transpose", ["q_heads"], ["qt"], name="qt", perm=[1, 0, 2]),
              helper.make_node("Transpose", ["k_heads"], ["kt"], name="kt", perm=[1, 2, 0]),
              helper.make_node("Transpose", ["v_heads"], ["vt"], name="vt", perm=[1, 0, 2]),
              helper.make_node("MatMul", ["qt", "kt"], ["s"], name="scores"),
              helper.make_node("Softmax", ["s"], ["sm"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["sm", "vt"], ["o"], name="context")]
    n, i = r("o", "y", [-1, 2, 6, 4])
    c["view_attention_chain"] = model(nodes + n, VA, inits + i, out_shape=["N", 2, 6, 4])
    # One index of an axis that a reshape merged from two that lie apart (its digit on each), as
    # a scalar and as a list of one; read by elementwise ops.
    c["view_select_in_merged_axis"] = model([
        node("Sigmoid", ["x"], ["p"]), helper.make_node("Transpose", ["p"], ["t"], name="transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t", "shape"], ["r"], name="merge"),
        helper.make_node("Gather", ["r", "i"], ["g"], name="select_scalar", axis=1),
        helper.make_node("Gather", ["r", "j"], ["h"], name="select_list", axis=1),
        helper.make_node("Squeeze", ["h", "one"], ["hs"], name="squeeze"),
        helper.make_node("Mul", ["g", "hs"], ["y"], name="mul")], (2, 4, 6, 5),
        [const("shape", np.array([0, 24, 5], np.int64)), const("i", np.array(13, np.int64)), const("j", np.array([-5], np.int64)),
         const("one", np.array([1], np.int64))], opset=13, out_shape=["N", 5])
    # A view of a buffer that a residual sum then overwrites in place: the view is copied out
    # before the convolution accumulates into the buffer (read after it, it would hold the sum).
    c["view_before_residual_sum"] = model([
        node("Sigmoid", ["x"], ["s"]), helper.make_node("Transpose", ["s"], ["t"], name="view", perm=[0, 2, 3, 1]),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "s"], ["a"], name="residual"),
        helper.make_node("Transpose", ["a"], ["at"], name="after", perm=[0, 2, 3, 1]),
        helper.make_node("Add", ["at", "t"], ["y"], name="add")], (2, 8, 5, 5), [const("w", rand(8, 8, 3, 3))])
    # ShuffleNet's block: a concatenation of a convolution's output and another value, its
    # channels shuffled (reshape, transpose, reshape) and split in two halves, one read by a
    # convolution, the other concatenated again; then every other channel of that sliced out.
    c["view_channel_shuffle"] = model([
        node("Conv", ["x", "w1"], ["a"]), helper.make_node("Sigmoid", ["x"], ["b"], name="sigmoid"),
        helper.make_node("Concat", ["a", "b"], ["cat"], name="cat", axis=1),
        helper.make_node("Reshape", ["cat", "groups"], ["r"], name="reshape_groups"),
        helper.make_node("Transpose", ["r"], ["t"], name="shuffle", perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "flat"], ["r2"], name="reshape_back"),
        helper.make_node("Split", ["r2", "halves"], ["s0", "s1"], name="split", axis=1),
        helper.make_node("Conv", ["s1", "w2"], ["c"], name="conv2"),
        helper.make_node("Concat", ["s0", "c"], ["cat2"], name="cat2", axis=1),
        helper.make_node("Slice", ["cat2", "starts", "ends", "axes", "steps"], ["sl"], name="every_other"),
        helper.make_node("Relu", ["sl"], ["y"], name="relu")], (2, 16, 5, 6),
        [const("w1", rand(16, 16, 1, 1)), const("w2", rand(16, 16, 1, 1)), const("groups", np.array([0, 2, 16, 5, 6], np.int64)),
         const("flat", np.array([0, 32, 5, 6], np.int64)), const("halves", np.array([16, 16], np.int64)),
         const("starts", np.array([3], np.int64)), const("ends", np.array([32], np.int64)), const("axes", np.array([1], np.int64)),
         const("steps", np.array([2], np.int64))], opset=13, out_shape=["N", 15, 5, 6])
    # Swin's patch merging: the four pixels of each 2x2 window of [N, H, W, C] (a convolution's
    # output transposed channels-last: a view) as strided slices (views of it), concatenated
    # along the channels and read by a linear layer.
    win = [helper.make_node("Slice", ["t", f"start{k}", "end", "hw", "two"], [f"p{k}"], name=f"window{k}")
           for k in range(4)]
    c["concat_strided_slices"] = model(
        [node("Conv", ["x", "w1"], ["c"]),
         helper.make_node("Transpose", ["c"], ["t"], name="to_nhwc", perm=[0, 2, 3, 1])] + win +
        [helper.make_node("Concat", ["p0", "p1", "p2", "p3"], ["cat"], name="merge", axis=-1),
         helper.make_node("MatMul", ["cat", "w"], ["y"], name="reduction")], (2, 5, 6, 8),
        [const(f"start{k}", np.array(s, np.int64)) for k, s in enumerate([[0, 0], [1, 0], [0, 1], [1, 1]])] +
        [const("end", np.array([6, 8], np.int64)), const("hw", np.array([1, 2], np.int64)),
         const("two", np.array([2, 2], np.int64)), const("w1", rand(6, 5, 1, 1)), const("w", rand(24, 7))],
        out_shape=["N", 3, 4, 7])
    # as_strided as the dynamo exporter writes it: a Gather of the flattened tensor at constant
    # positions that step evenly (here a transpose of its last two axes; the batch is fixed).
    idx = (np.arange(2)[:, None, None] * 24 + np.arange(4)[None, :, None] + np.arange(6)[None, None, :] * 4).astype(np.int64)
    c["view_gather_as_strided"] = model([
        node("Sigmoid", ["x"], ["s"]), helper.make_node("Reshape", ["s", "flat"], ["f"], name="flatten"),
        helper.make_node("Gather", ["f", "idx"], ["g"], name="as_strided", axis=0),
        helper.make_node("Relu", ["g"], ["y"], name="relu")], (2, 6, 4),
        [const("flat", np.array([-1], np.int64)), const("idx", idx)], out_shape=[2, 4, 6])
    # A residual summand that is a view lying channels-last (an NHWC value transposed to NCHW):
    # the convolution that sums into it must write where the summand is copied to, in that
    # copy's layout (the Winograd ways, which write channels-last, are not offered).
    c["view_residual_summand_channels_last"] = model([
        node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["s"], name="to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Transpose", ["x"], ["t"], name="input_to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["t", "w"], ["c"], name="conv3x3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c", "s"], ["y"], name="residual")], (2, 9, 11, 16), [const("w", rand(16, 16, 3, 3))])
    # A view read by a convolution: one reorder from the view (in no layout a convolution takes)
    # into the one it wants.
    c["view_into_conv"] = model([
        node("Sigmoid", ["x"], ["s"]), helper.make_node("Transpose", ["s"], ["t"], name="swap_axes", perm=[0, 3, 2, 1]),
        helper.make_node("Conv", ["t", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])], (2, 5, 7, 4),
        [const("w", rand(6, 4, 3, 3)), const("b", rand(6))])
    c["gather_runtime_scalar"] = model([node("Gather", ["x", "i"], axis=1)], X, [const("i", np.array(2, np.int64))], out_shape=["N", 9, 11])
    c["gather_runtime_list"] = model([node("Gather", ["x", "i"], axis=3)], X, [const("i", np.array([[4, -1], [0, 0]], np.int64))], out_shape=["N", 4, 9, 2, 2])
    c["reduce_mean_axes_input_opset18"] = model([node("ReduceMean", ["x", "ax"], keepdims=0)], X, [const("ax", np.array([-1, 1], np.int64))], opset=18, out_shape=["N", 9])
    c["reduce_mean_unit_axis_opset18"] = model([node("ReduceMean", ["x", "ax"], ["m"]), helper.make_node("Add", ["x", "m"], ["y"], name="add")], X, [const("ax", np.array([2], np.int64))], opset=18)
    c["batched_matmul_broadcast"] = model([node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], name="sm", axis=-1)], X, [const("w", rand(4, 11, 6))], out_shape=["N", 4, 9, 6])
    c["where_equal_mod_expand_folded"] = model([
        node("Equal", ["a", "b"], ["eq"]), helper.make_node("Where", ["eq", "p", "q"], ["w"], name="where"),
        helper.make_node("Mod", ["w", "m"], ["md"], name="mod"), helper.make_node("Cast", ["md"], ["mf"], name="cast", to=1),
        helper.make_node("Expand", ["mf", "shape"], ["ex"], name="expand"), helper.make_node("Mul", ["x", "ex"], ["y"], name="mul")], X,
        [const("a", np.array([1, 2, 3, 4], np.int64).reshape(4, 1, 1)), const("b", np.array([1, 0, 3, 0], np.int64).reshape(4, 1, 1)),
         const("p", np.array([7, 8, 9, 10], np.int64).reshape(4, 1, 1)), const("q", np.array([-3, -5, 11, 13], np.int64).reshape(4, 1, 1)), const("m", np.array(4, np.int64)), const("shape", np.array([1, 4, 1, 1], np.int64))], opset=20,
        out_shape=["N", 4, 9, 11])
    c["where_mod_fmod_float"] = model([
        node("Mod", ["k", "d"], ["md"], fmod=1), helper.make_node("Add", ["x", "md"], ["y"], name="add")], X,
        [const("k", rand(11) * 5), const("d", np.float32(1.5))], opset=13, out_shape=["N", 4, 9, 11])
    # A residual sum read by an activation and by the next block's residual add (Xception's
    # blocks): once the next add is a sum post-op, the activation must not be fused away from it.
    c["residual_read_by_activation_and_next_sum"] = model([
        node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]), helper.make_node("Conv", ["x", "w2"], ["s"], name="shortcut"),
        helper.make_node("Add", ["h", "s"], ["a2"], name="add2"), helper.make_node("Relu", ["a2"], ["r"], name="act"),
        helper.make_node("Conv", ["r", "w3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "a2"], ["y"], name="add3")], X,
        [const("w1", rand(4, 4, 3, 3)), const("w2", rand(4, 4, 1, 1)), const("w3", rand(4, 4, 3, 3))])
    # A subsampling slice whose strided view overlaps the next axis (x[:, :, ::2] of an odd extent,
    # LeViT's downsampling): oneDNN refuses such a memory descriptor, a plain copy runs it.
    c["slice_step_overlapping_strides"] = model([node("Slice", ["x", "st", "en", "ax", "sp"])], X,
                                                [const("st", np.array([0], np.int64)), const("en", np.array([9], np.int64)),
                                                 const("ax", np.array([2], np.int64)), const("sp", np.array([2], np.int64))],
                                                opset=13, out_shape=["N", 4, 5, 11])
    # The same of a computed value, which a view of it cannot say either (a copy again).
    c["view_slice_overlapping_strides"] = model([node("Relu", ["x"], ["r"]), helper.make_node("Slice", ["r", "st", "en", "ax", "sp"], ["y"], name="slice")], X,
                                                [const("st", np.array([0], np.int64)), const("en", np.array([9], np.int64)),
                                                 const("ax", np.array([2], np.int64)), const("sp", np.array([2], np.int64))],
                                                opset=13, out_shape=["N", 4, 5, 11])
    # Indexing with constant indices: GatherND as the dynamo exporter writes an adaptive pooling
    # (positions gathered from a transposed map), ScatterND folded (a mask built by slice
    # assignment, Swin's) and at run time (into computed data, each reduction).
    tr = lambda i, o: helper.make_node("Transpose", [i], [o], name=f"tr_{o}", perm=[2, 3, 0, 1])
    c["gather_nd_runtime"] = model([tr("x", "t"), node("GatherND", ["t", "i"], ["g"]), tr("g", "y")], X,
                                   [const("i", np.array([[[0, 1], [8, 10], [-1, 0]], [[4, 4], [2, -3], [0, 0]]], np.int64))],
                                   out_shape=["N", 4, 2, 3])
    c["scatter_nd_folded_mask"] = model([
        helper.make_node("ConstantOfShape", ["shape"], ["z"], name="zeros", value=numpy_helper.from_array(np.zeros(1, np.float32))),
        node("ScatterND", ["z", "i", "u"], ["mask"]), helper.make_node("Add", ["x", "mask"], ["y"], name="add")], X,
        [const("shape", np.array([9, 11], np.int64)), const("i", np.array([[0], [3], [-2]], np.int64)), const("u", rand(3, 11))],
        opset=16, out_shape=["N", 4, 9, 11])
    for red in ("none", "add", "mul", "max"):
        c[f"scatter_nd_runtime_{red}"] = model([
            tr("x", "t"), helper.make_node("Slice", ["t", "s0", "s1", "ax"], ["part"], name="slice"),
            helper.make_node("Mul", ["part", "two"], ["u"], name="mul"),
            node("ScatterND", ["t", "i", "u"], ["sc"], reduction=red), tr("sc", "y")], X,
            [const("s0", np.array([2], np.int64)), const("s1", np.array([5], np.int64)), const("ax", np.array([0], np.int64)),
             const("two", np.float32(-1.5)), const("i", np.array([[5], [-1], [2 if red == "none" else 5]], np.int64))],
            opset=18, out_shape=["N", 4, 9, 11])
    # Einsum as attention blocks write it: both operands computed (through strides or reordered),
    # a constant operand, an ellipsis, a permuted output, one operand (a permutation).
    c["einsum_qk"] = model([node("Einsum", ["x", "x"], equation="bhnc,bhmc->bhnm")], X, opset=12, out_shape=["N", 4, 9, 9])
    c["einsum_av_permuted_out"] = model([node("Einsum", ["x", "x"], ["a"], equation="bhnc,bhnd->bhcd"),
                                         helper.make_node("Einsum", ["a", "x"], ["y"], name="einsum2", equation="bhcd, bhnc -> bnhd")], X,
                                        opset=12, out_shape=["N", 9, 4, 11])
    c["einsum_constant_ellipsis"] = model([node("Einsum", ["x", "w"], equation="...c,dc->...d")], X, [const("w", rand(5, 11))], opset=12,
                                          out_shape=["N", 4, 9, 5])
    c["einsum_implicit_contract_two"] = model([node("Einsum", ["x", "w"], equation="bhnc,hcd")], X, [const("w", rand(4, 11, 3))], opset=12,
                                              out_shape=["N", 3, 9])
    c["einsum_permutation"] = model([node("Einsum", ["x"], equation="bhnc->bchn")], X, opset=12, out_shape=["N", 11, 4, 9])
    # Normalization over channel groups: InstanceNormalization over a reshape (the legacy
    # exporter's GroupNorm) and plain; GroupNormalization (opset 21: scale and bias per channel).
    c["instance_norm_groupnorm_pattern"] = model([
        helper.make_node("Reshape", ["x", "s3"], ["r"], name="reshape"),
        node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-5),
        helper.make_node("Reshape", ["n", "s4"], ["nr"], name="reshape_back"),
        helper.make_node("Mul", ["nr", "g"], ["m"], name="mul"), helper.make_node("Add", ["m", "b"], ["y"], name="add")], X,
        [const("s3", np.array([0, 2, -1], np.int64)), const("s4", np.array([0, 4, 9, 11], np.int64)),
         const("ones", np.ones(2, np.float32)), const("zeros", np.zeros(2, np.float32)),
         const("g", rand(4, 1, 1)), const("b", rand(4, 1, 1))], opset=17, out_shape=["N", 4, 9, 11])
    c["instance_norm_affine"] = model([node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3)], X, [const("s", rand(4)), const("b", rand(4))])
    c["group_norm_per_channel_opset21"] = model([node("GroupNormalization", ["x", "s", "b"], num_groups=2, epsilon=1e-4)], X,
                                                [const("s", rand(4)), const("b", rand(4))], opset=21, out_shape=["N", 4, 9, 11])
    # Group normalization after a convolution, as the channels-last way reads it: torch's
    # group_norm as the exporters write it (reshape, InstanceNormalization with a scale and bias
    # per group, reshape back, per-channel scale and bias) over 40 channels in 5 groups (a vector
    # and a half of channels), a Relu that alone reads it, a pointwise convolution after; opset
    # 21's GroupNormalization over 32 channels whose Relu is not its only reader; an
    # InstanceNormalization over 20 channels straight on the convolution's output.
    c["group_norm_reshaped_after_conv_relu"] = model([
        node("Conv", ["x", "w0", "b0"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["h", "s3"], ["r"], name="reshape"),
        helper.make_node("InstanceNormalization", ["r", "gs", "gb"], ["n"], name="instance_norm", epsilon=1e-5),
        helper.make_node("Reshape", ["n", "s4"], ["nr"], name="reshape_back"),
        helper.make_node("Mul", ["nr", "g"], ["m"], name="mul"), helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["u"], name="relu"),
        helper.make_node("Conv", ["u", "w1"], ["y"], name="conv_after")], X,
        [const("w0", rand(40, 4, 3, 3)), const("b0", rand(40)), const("s3", np.array([0, 5, -1], np.int64)),
         const("s4", np.array([0, 40, 9, 11], np.int64)), const("gs", rand(5)), const("gb", rand(5)),
         const("g", rand(40, 1, 1)), const("b", rand(1, 40, 1, 1)), const("w1", rand(6, 40, 1, 1))],
        opset=17, out_shape=["N", 6, 9, 11])
    c["group_norm_opset21_after_conv_shared_relu"] = model([
        node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("GroupNormalization", ["h", "s", "b"], ["n"], name="group_norm", num_groups=4, epsilon=1e-4),
        helper.make_node("Relu", ["n"], ["u"], name="relu"), helper.make_node("Add", ["u", "n"], ["y"], name="add")], X,
        [const("w0", rand(32, 4, 3, 3)), const("s", rand(32)), const("b", rand(32))], opset=21, out_shape=["N", 32, 9, 11])
    c["instance_norm_after_conv"] = model([
        node("Conv", ["x", "w0"], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("InstanceNormalization", ["h", "s", "b"], ["y"], name="instance_norm", epsilon=1e-3)], X,
        [const("w0", rand(20, 4, 3, 3)), const("s", rand(20)), const("b", rand(20))], out_shape=["N", 20, 9, 11])
    # DenseNet's layer: a Concat over channels read alone by a BatchNormalization (a depthwise 1x1
    # convolution after the passes) and a Relu, then a pointwise convolution; the network input
    # (plain) among the inputs; 28 channels (no whole vector in the last input). And a
    # BatchNormalization without a Relu writing the graph's output.
    bn = lambda p, c: [const(p + "s", rand(c)), const(p + "b", rand(c)), const(p + "m", rand(c)),  # noqa: E731
                       const(p + "v", np.abs(rand(c)) + 0.5)]
    c["concat_bn_relu_after_convs"] = model([
        node("Conv", ["x", "w1"], ["h1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2", "b2"], ["h2"], name="conv2", pads=[0, 0, 0, 0]),
        helper.make_node("Concat", ["x", "h1", "h2"], ["cat"], name="concat", axis=1),
        helper.make_node("BatchNormalization", ["cat", "ns", "nb", "nm", "nv"], ["n"], name="norm", epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["u"], name="relu"),
        helper.make_node("Conv", ["u", "w3"], ["y"], name="conv3")], X,
        [const("w1", rand(16, 4, 3, 3)), const("w2", rand(8, 4, 1, 1)), const("b2", rand(8)),
         const("w3", rand(6, 28, 1, 1))] + bn("n", 28), out_shape=["N", 6, 9, 11])
    c["concat_bn_output"] = model([
        node("Conv", ["x", "w1"], ["h1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["h2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["h1", "h2"], ["cat"], name="concat", axis=-3),
        helper.make_node("BatchNormalization", ["cat", "ns", "nb", "nm", "nv"], ["y"], name="norm", epsilon=1e-3)], X,
        [const("w1", rand(32, 4, 3, 3)), const("w2", rand(16, 4, 3, 3))] + bn("n", 48), out_shape=["N", 48, 9, 11])
    # The same with channel counts that fill no whole vector (20 + 12), each input a convolution's
    # (in bf16 plans every input and the concatenation are then bf16) and a Relu after the norm.
    c["concat_bn_relu_odd_channels"] = model([
        node("Conv", ["x", "w1"], ["h1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w2"], ["h2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["h1", "h2"], ["cat"], name="concat", axis=1),
        helper.make_node("BatchNormalization", ["cat", "ns", "nb", "nm", "nv"], ["n"], name="norm", epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["y"], name="relu")], X,
        [const("w1", rand(20, 4, 3, 3)), const("w2", rand(12, 4, 3, 3))] + bn("n", 32), out_shape=["N", 32, 9, 11])
    # A Concat over channels that only convolutions read is never written (split_conv_over_concat:
    # each reader becomes one convolution per input, summing into the one before); a pool that
    # alone reads one moves before it (pool_before_concat). It stays where a reader widens (more
    # output channels than the Concat joins) or an input has fewer than 16 channels.
    def cat_inputs(c1, c2):
        return [helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], name="conv1", pads=[1, 1, 1, 1]),
                helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
                helper.make_node("Conv", ["x", "w2"], ["h2"], name="conv2")], \
            [const("w1", rand(c1, 4, 3, 3)), const("b1", rand(c1)), const("w2", rand(c2, 4, 1, 1))]
    nodes, inits = cat_inputs(16, 24)
    c["concat_read_by_convs"] = model(nodes + [
        helper.make_node("Concat", ["r1", "h2", "r1"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        helper.make_node("Conv", ["cat", "w4"], ["c4"], name="conv4"),
        helper.make_node("Add", ["r3", "c4"], ["y"], name="add")], X,
        inits + [const("w3", rand(8, 56, 3, 3)), const("b3", rand(8)), const("w4", rand(8, 56, 1, 1))],
        out_shape=["N", 8, 9, 11])
    nodes, inits = cat_inputs(16, 16)
    c["concat_pooled_read_by_conv"] = model(nodes + [
        helper.make_node("Concat", ["r1", "h2"], ["cat"], name="concat", axis=-3),
        helper.make_node("MaxPool", ["cat"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node("Conv", ["p", "w3", "b3"], ["y"], name="conv3")], X,
        inits + [const("w3", rand(10, 32, 1, 1)), const("b3", rand(10))], out_shape=["N", 10, 4, 5])
    c["concat_read_by_widening_conv"] = model(nodes + [
        helper.make_node("Concat", ["r1", "h2"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w3"], ["y"], name="conv3")], X,
        inits + [const("w3", rand(40, 32, 1, 1))], out_shape=["N", 40, 9, 11])
    nodes, inits = cat_inputs(8, 24)
    c["concat_narrow_input_read_by_conv"] = model(nodes + [
        helper.make_node("Concat", ["r1", "h2"], ["cat"], name="concat", axis=1),
        helper.make_node("Conv", ["cat", "w3"], ["y"], name="conv3")], X,
        inits + [const("w3", rand(4, 32, 1, 1))], out_shape=["N", 4, 9, 11])
    # Reductions as attention and pooling write them: the L2 norm F.normalize takes (clamped,
    # expanded to its input and divided by: Expand at run time), a sum (axes an input since opset
    # 13), a max without keepdims.
    c["reduce_l2_normalize_expand"] = model([
        node("ReduceL2", ["x", "ax"], ["n"], keepdims=1), helper.make_node("Clip", ["n", "lo"], ["c"], name="clip"),
        helper.make_node("Expand", ["c", "shape"], ["e"], name="expand"), helper.make_node("Div", ["x", "e"], ["y"], name="div")], X,
        [const("ax", np.array([-1], np.int64)), const("lo", np.float32(1e-12)), const("shape", np.array([1, 4, 9, 11], np.int64))],
        opset=18, out_shape=["N", 4, 9, 11])
    # An Expand that a Relu reads stays (only broadcasting arithmetic reads the Expand's input
    # in its place).
    c["expand_read_by_relu"] = model([
        node("ReduceMax", ["x", "ax"], ["n"], keepdims=1), helper.make_node("Expand", ["n", "shape"], ["e"], name="expand"),
        helper.make_node("Relu", ["e"], ["y"], name="relu")], X,
        [const("ax", np.array([-1], np.int64)), const("shape", np.array([1, 4, 9, 11], np.int64))], opset=18, out_shape=["N", 4, 9, 11])
    # A block with a layer scale and residual sums (ConvNeXt's shape): under bf16 the convolutions
    # write bf16, the layer scale (a parameter tensor) promotes to f32, and the residual stream
    # stays f32, the last sum fused into a convolution writing f32 (TeacherBf16).
    c["layer_scale_residual"] = model([
        helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["h", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c", "gamma"], ["s"], name="scale"),
        helper.make_node("Add", ["h", "s"], ["r"], name="residual"),
        helper.make_node("Relu", ["r"], ["a"], name="relu"),
        helper.make_node("Conv", ["a", "w3"], ["z"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["z", "r"], ["y"], name="residual_fused")], X,
        [const("w1", rand(4, 4, 3, 3) * 0.2), const("w2", rand(4, 4, 3, 3) * 0.2), const("gamma", rand(4, 1, 1) * 0.1),
         const("w3", rand(4, 4, 3, 3) * 0.2)])
    # ConvNeXt's block as exporters write it: a depthwise convolution, permuted to channels-last
    # for two linear layers, permuted back, then a layer scale and the residual sum, read by the
    # next convolution. The scale folds into the second layer's weights, and the sum reads the
    # permuted output where it lies, in the layout the next convolution reads
    # (TeacherOps.TransposedBlockOutputIsNotCopied).
    def transposed_block(gamma):
        return model([
            helper.make_node("Conv", ["x", "w0"], ["h"], name="stem"),
            helper.make_node("Conv", ["h", "wd", "bd"], ["d"], name="dw", group=16, pads=[3, 3, 3, 3]),
            helper.make_node("Transpose", ["d"], ["t1"], name="to_channels_last", perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", ["t1", "f1"], ["m1"], name="fc1"),
            helper.make_node("Relu", ["m1"], ["a1"], name="act"),
            helper.make_node("MatMul", ["a1", "f2"], ["m2"], name="fc2"),
            helper.make_node("Add", ["m2", "b2"], ["m2b"], name="fc2_bias"),
            helper.make_node("Transpose", ["m2b"], ["t2"], name="to_channels_first", perm=[0, 3, 1, 2]),
            helper.make_node("Mul", ["gamma", "t2"], ["s"], name="scale"),
            helper.make_node("Add", ["s", "h"], ["r"], name="residual"),
            helper.make_node("Conv", ["r", "wd2", "bd2"], ["y"], name="dw2", group=16, pads=[3, 3, 3, 3])], X,
            [const("w0", rand(16, 4, 1, 1) * 0.5), const("wd", rand(16, 1, 7, 7) * 0.2), const("bd", rand(16)),
             const("f1", rand(16, 32) * 0.25), const("f2", rand(32, 16) * 0.2), const("b2", rand(16)), const("gamma", gamma),
             const("wd2", rand(16, 1, 7, 7) * 0.2), const("bd2", rand(16))], out_shape=["N", 16, 9, 11])
    c["transposed_block_scale_residual"] = transposed_block(rand(16, 1, 1))
    # The same block scaled along its rows, not its channels: not a per-channel scale of the layer.
    c["transposed_block_scale_along_rows"] = transposed_block(rand(9, 1))
    # Attention's heads put back beside each other (a Transpose and a Reshape of the context
    # product) and projected: the product is written in the layout the Transpose's output lies
    # plain in, so neither the Transpose nor the projection's rows copy it
    # (TeacherOps.ProductWritesTheLayoutOfTheTransposeAfterIt). V is a strided view (a slice of a
    # computed value), so the context product has both ways, "strided" and "plain". Batch-first
    # (the heads and rows swapped, as ViTs write it) and sequence-first (rows first, as a
    # seq-first encoder writes it, projected then transposed back to batch-first).
    def heads_projected(perm, merged, after):
        return model([
            node("Relu", ["x"], ["p"]),
            helper.make_node("Slice", ["p", "v_start", "v_end", "v_axis"], ["v"], name="v_slice"),
            helper.make_node("Transpose", ["x"], ["kt"], name="kt", perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["x", "kt"], ["qk"], name="scores"),
            helper.make_node("Softmax", ["qk"], ["sm"], name="softmax", axis=-1),
            helper.make_node("MatMul", ["sm", "v"], ["o"], name="context"),
            helper.make_node("Transpose", ["o"], ["ot"], name="heads_last", perm=perm),
            helper.make_node("Reshape", ["ot", "merged"], ["r"], name="heads_merged"),
            helper.make_node("MatMul", ["r", "wp"], ["pm"], name="projection"),
            helper.make_node("Add", ["pm", "bp"], ["y" if not after else "pb"], name="projection_bias")] + after, X,
            [const("v_start", np.array([1], np.int64)), const("v_end", np.array([11], np.int64)),
             const("v_axis", np.array([3], np.int64)), const("merged", np.array(merged, np.int64)),
             const("wp", rand(40, 7) * 0.2), const("bp", rand(7))], out_shape=["N", 9, 7])
    c["attention_heads_projected"] = heads_projected([0, 2, 1, 3], [-1, 9, 40], [])
    c["attention_heads_projected_seq_first"] = heads_projected(
        [2, 0, 1, 3], [9, -1, 40], [helper.make_node("Transpose", ["pb"], ["y"], name="batch_first", perm=[1, 0, 2])])
    c["reduce_sum_opset13"] = model([node("ReduceSum", ["x", "ax"], keepdims=1)], X, [const("ax", np.array([1, 3], np.int64))], opset=13,
                                    out_shape=["N", 1, 9, 1])
    c["reduce_max_no_keepdims"] = model([node("ReduceMax", ["x"], axes=[2], keepdims=0)], X, opset=17, out_shape=["N", 4, 11])
    # Reductions over middle axes, which oneDNN 3.2 runs in its reference loop: a classifier's mean
    # over the tokens of [N, T, D] after a linear layer (70 tokens: two blocks of 32 and a partial
    # one; 300 features: a chunk of 256 and a partial one), and an L2 norm over two middle axes of
    # a convolution's output (in bf16 plans both read a product's bf16 output).
    c["reduce_mean_tokens"] = model([
        helper.make_node("MatMul", ["x", "w"], ["h"], name="linear"),
        node("ReduceMean", ["h"], axes=[1], keepdims=0)], (2, 70, 300), [const("w", rand(300, 300) * 0.1)], opset=17, out_shape=["N", 300])
    c["reduce_l2_middle_axes"] = model([
        helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
        node("ReduceL2", ["h"], axes=[1, 2], keepdims=1)], X, [const("w", rand(6, 4, 1, 1))], opset=17, out_shape=["N", 1, 1, 11])
    # BatchNorm1d after a linear layer (rank 2 and 3 inputs): not foldable into a convolution.
    bn_params = lambda n: [const("s", rand(n)), const("b", rand(n)), const("m", rand(n)), const("v", np.abs(rand(n)) + 0.5)]
    c["batchnorm_rank3_alone"] = model(
        [helper.make_node("Reshape", ["x", "r3"], ["x3"], name="reshape"), node("BatchNormalization", ["x3", "s", "b", "m", "v"])], X,
        [const("r3", np.array([0, 4, -1], np.int64))] + bn_params(4), opset=15, out_shape=["N", 4, 99])
    c["batchnorm_rank2_after_gemm"] = model(
        [helper.make_node("Flatten", ["x"], ["f"], name="flatten"), helper.make_node("Gemm", ["f", "w"], ["g"], name="gemm", transB=1),
         node("BatchNormalization", ["g", "s", "b", "m", "v"])], X, [const("w", rand(6, 396) * 0.05)] + bn_params(6), opset=15,
        out_shape=["N", 6])
    c["exp_log_abs_neg"] = model([node("Neg", ["x"], ["n"]), helper.make_node("Exp", ["n"], ["e"], name="exp"),
                                  helper.make_node("Abs", ["x"], ["a"], name="abs"), helper.make_node("Log", ["a"], ["l"], name="log"),
                                  helper.make_node("Add", ["e", "l"], ["y"], name="add")], X)
    c["conv_exp_fused"] = model([node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Neg", ["c"], ["n"], name="neg"),
                                 helper.make_node("Exp", ["n"], ["y"], name="exp")], X, [const("w", rand(5, 4, 3, 3) * 0.2)])
    # A mask built from comparisons (folded): where(not(i < 4 or i >= 7), -100, 0) added to x.
    c["mask_not_compare_folded"] = model([
        node("Less", ["i", "four"], ["lt"]), helper.make_node("GreaterOrEqual", ["i", "seven"], ["ge"], name="ge"),
        helper.make_node("Or", ["lt", "ge"], ["o"], name="or"), helper.make_node("Not", ["o"], ["m"], name="not"),
        helper.make_node("Where", ["m", "neg", "zero"], ["w"], name="where"), helper.make_node("Add", ["x", "w"], ["y"], name="add")], X,
        [const("i", np.arange(11, dtype=np.int64)), const("four", np.int64(4)), const("seven", np.int64(7)),
         const("neg", np.float32(-100.0)), const("zero", np.float32(0.0))], opset=17, out_shape=["N", 4, 9, 11])
    # A model-local function with an attribute reference, as exporters write modules.
    fn = helper.make_function("kdflow.test", "ScaledLeaky", ["inp"], ["out"],
                              [helper.make_node("LeakyRelu", ["inp"], ["t"], alpha=0.0),
                               helper.make_node("Mul", ["t", "two"], ["out"])],
                              [helper.make_opsetid("", 17)], attributes=[])
    fn.node[0].attribute[0].CopyFrom(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    fn.node.insert(0, helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.float32(2.0))))
    fn.attribute.append("alpha")
    c["local_function_inlined"] = model([helper.make_node("ScaledLeaky", ["x"], ["h"], name="call1", domain="kdflow.test", alpha=0.3),
                                         helper.make_node("ScaledLeaky", ["h"], ["y"], name="call2", domain="kdflow.test", alpha=0.1)], X, functions=[fn])
    return c


def bomb(nodes, x_shape, functions):
    """model() without ONNX's shape inference, which expands every call of a local function."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"] + list(x_shape[1:]))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"] + list(x_shape[1:]))
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("kdflow.test", 1)],
                          functions=list(functions))
    m.ir_version = 8
    return m


def rejects(out):
    X = (2, 4, 9, 11)
    bad = {}
    bad["unsupported_op"] = (model([node("Hardmax", ["x"], axis=-1)], X, opset=13), "Hardmax")
    bad["einsum_diagonal"] = (model([node("Einsum", ["x"], equation="nchh->nch")], (2, 4, 9, 9), opset=12, out_shape=["N", 4, 9]),
                              "a label repeated in one operand (a diagonal) is not supported")
    bad["einsum_sum_one_operand"] = (model([node("Einsum", ["x", "x"], equation="nchw,nchv->nch")], X, opset=12, out_shape=["N", 4, 9]),
                                     "summing label 'w' of one operand only is not supported")
    bad["opset_too_old"] = (model([node("Relu", ["x"])], X, opset=9), "opset 9")
    bad["opset_too_new"] = (model([node("Relu", ["x"])], X, opset=23), "opset 23")
    m = model([node("Relu", ["x"])], X)
    m.ir_version = 99
    bad["ir_too_new"] = (m, "IR version 99")
    m = model([node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["r"], name="again"), helper.make_node("Relu", ["r"], ["y"], name="last")], X)
    bad["value_assigned_twice"] = (m, "already assigned")

    def external_at(location):
        """A Mul whose constant is external data at `location`."""
        m = model([node("Mul", ["x", "k"])], X, [const("k", rand(1, 4, 1, 1))], out_shape=["N", 4, 9, 11])
        m.graph.initializer[0].ClearField("raw_data")
        m.graph.initializer[0].data_location = TensorProto.EXTERNAL
        for key, value in [("location", location), ("length", "16")]:
            m.graph.initializer[0].external_data.add(key=key, value=value)
        return m
    bad["external_data_outside"] = (external_at("../outside.bin"), "not a file inside the model's folder")
    bad["external_data_location_dot"] = (external_at("."), "a folder, not a file")
    one = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    m = model([node("ConstantOfShape", ["k"], ["c"], value=one), helper.make_node("Add", ["x", "c"], ["y"], name="add")], X,
              [const("k", np.array([-2, 4, 9, 11], dtype=np.int64))], out_shape=["N", 4, 9, 11])
    bad["constant_of_shape_negative"] = (m, "negative dimension")
    m = model([node("ConstantOfShape", ["k"], ["c"], value=one), helper.make_node("Relu", ["c"], ["y"], name="relu")], X,
              [const("k", np.array([2, 4, 9, 11], dtype=np.int64))], out_shape=[2, 4, 9, 11])
    bad["output_folded_to_constant"] = (m, "does not depend on the input")
    m = model([node("Mul", ["x", "k"])], X, [const("k", rand(1, 4, 1, 1))], out_shape=["N", 4, 9, 11])
    m.graph.initializer[0].dims[:] = [1 << 40, 1 << 30]  # a lying header: 2^70 elements, 16 bytes
    bad["lying_initializer_header"] = (m, "more elements than can be addressed")
    m = model([node("Mul", ["x", "k"])], X, [const("k", rand(1, 4, 1, 1))], out_shape=["N", 4, 9, 11])
    m.graph.initializer[0].dims[:] = [1 << 20, 4]
    bad["short_initializer"] = (m, "holds 4 values")
    fn = helper.make_function("kdflow.test", "Loop", ["a"], ["b"], [helper.make_node("Loop", ["a"], ["b"], domain="kdflow.test")], [helper.make_opsetid("", 17)])
    m = model([helper.make_node("Relu", ["x"], ["y"], name="call")], X)
    m.functions.append(fn)
    m.opset_import.append(helper.make_opsetid("kdflow.test", 1))
    m.graph.node[0].op_type, m.graph.node[0].domain = "Loop", "kdflow.test"
    bad["function_calls_itself"] = (m, "calls itself")
    # Functions that each call the next twice: 2^30 nodes from a file of a few KB, refused before
    # any is copied; 2^10 calls that each pass the same 1 MB tensor on to a Constant; and a chain
    # of calls 40 deep.
    fns = [helper.make_function("kdflow.test", "F30", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 17)])]
    for k in range(29, -1, -1):
        fns.append(helper.make_function("kdflow.test", f"F{k}", ["a"], ["b"],
                                        [helper.make_node(f"F{k + 1}", ["a"], ["t"], domain="kdflow.test"),
                                         helper.make_node(f"F{k + 1}", ["t"], ["b"], domain="kdflow.test")],
                                        [helper.make_opsetid("", 17), helper.make_opsetid("kdflow.test", 1)]))
    m = bomb([helper.make_node("F0", ["x"], ["y"], name="call", domain="kdflow.test")], X, fns)
    bad["function_doubling_bomb"] = (m, "more than 1048576 nodes and function calls once its functions are expanded")
    # The same with a leaf function that has no node: 2^31 calls and no node to count (a fuzzer's
    # find: the calls alone took minutes); each call counts.
    fns[0] = helper.make_function("kdflow.test", "F30", ["a"], ["a"], [], [helper.make_opsetid("", 17)])
    bad["function_empty_doubling_bomb"] = (bomb([helper.make_node("F0", ["x"], ["y"], name="call", domain="kdflow.test")], X, fns),
                                           "more than 1048576 nodes and function calls")
    leaf = helper.make_function("kdflow.test", "G10", ["a"], ["b"],
                                [helper.make_node("Constant", [], ["c"]), helper.make_node("Add", ["a", "c"], ["b"])],
                                [helper.make_opsetid("", 17)], attributes=["w"])
    leaf.node[0].attribute.append(helper.make_attribute_ref("value", onnx.AttributeProto.TENSOR))
    leaf.node[0].attribute[0].ref_attr_name = "w"
    fns = [leaf]
    for k in range(9, -1, -1):
        fns.append(helper.make_function("kdflow.test", f"G{k}", ["a"], ["b"],
                                        [helper.make_node(f"G{k + 1}", ["a"], ["t"], domain="kdflow.test"),
                                         helper.make_node(f"G{k + 1}", ["t"], ["b"], domain="kdflow.test")],
                                        [helper.make_opsetid("", 17), helper.make_opsetid("kdflow.test", 1)],
                                        attributes=["w"]))
        for n in fns[-1].node:
            n.attribute.append(helper.make_attribute_ref("w", onnx.AttributeProto.TENSOR))
    call = helper.make_node("G0", ["x"], ["y"], name="call", domain="kdflow.test",
                            w=numpy_helper.from_array(np.zeros((1, 4, 1, 1 << 16), np.float32)))
    bad["function_attribute_bomb"] = (bomb([call], X, fns), "its functions expand to more than")
    fns = [helper.make_function("kdflow.test", "H40", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 17)])]
    fns += [helper.make_function("kdflow.test", f"H{k}", ["a"], ["b"],
                                 [helper.make_node(f"H{k + 1}", ["a"], ["b"], domain="kdflow.test")],
                                 [helper.make_opsetid("", 17), helper.make_opsetid("kdflow.test", 1)])
            for k in range(39, -1, -1)]
    bad["functions_nested_too_deep"] = (bomb([helper.make_node("H0", ["x"], ["y"], name="call", domain="kdflow.test")], X, fns),
                                        "functions nest more than 32 deep")
    bad["two_inputs"] = (None, "more than one input")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    g = helper.make_graph([helper.make_node("Add", ["x", "x2"], ["y"], name="add")], "g", [x, x2], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    bad["two_inputs"] = (m, "more than one input")
    bad["resize_huge"] = (model([node("Resize", ["x", "", "", "sizes"])], X, [const("sizes", np.array([2, 4, 1 << 19, 1 << 19], np.int64))], opset=13),
                          "too large")
    bad["resize_cubic"] = (model([node("Resize", ["x", "", "scales"], mode="cubic")], X, [const("scales", np.array([1, 1, 2, 2], np.float32))], opset=13),
                           "mode = 'cubic' is not supported")
    bad["resize_channels"] = (model([node("Resize", ["x", "", "scales"])], X, [const("scales", np.array([1, 2, 1, 1], np.float32))], opset=13),
                              "only the two spatial axes")
    # Attributes and parameters that once crashed the importer (issue 20): checked before use.
    bad["transpose_bad_perm"] = (model([node("Transpose", ["x"], perm=[0, 1, 3, 7])], X, out_shape=["N", 4, 9, 11]),
                                 "not a permutation")
    bad["conv_zero_stride"] = (model([node("Conv", ["x", "w"], strides=[0, 1])], X, [const("w", rand(2, 4, 3, 3))]),
                               "must be from 1")
    bad["maxpool_zero_stride"] = (model([node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[0, 0])], X),
                                  "must be from 1")
    bad["batchnorm_short_scale"] = (model([node("BatchNormalization", ["x", "s", "b", "m", "v"])], X,
                                          [const("s", np.ones(0, np.float32)), const("b", rand(4)), const("m", rand(4)),
                                           const("v", np.ones(4, np.float32))], out_shape=["N", 4, 9, 11]),
                                    "scale has shape [0]")
    bad["clip_empty_min"] = (model([node("Clip", ["x", "lo"])], X, [const("lo", np.ones(0, np.float32))], out_shape=["N", 4, 9, 11]),
                             "min must be one value")
    # Integer initializers where a float kernel reads its parameters (a fuzzer's find: they were
    # read as floats, out of an empty buffer).
    bad["batchnorm_int_var"] = (model([node("BatchNormalization", ["x", "s", "b", "m", "v"])], X,
                                      [const("s", rand(4)), const("b", rand(4)), const("m", rand(4)),
                                       const("v", np.ones(4, np.int32))], out_shape=["N", 4, 9, 11]),
                                "input 'v' holds integers, and BatchNormalization takes floats")
    bad["conv_int_weight"] = (model([node("Conv", ["x", "w"])], X, [const("w", np.ones((2, 4, 3, 3), np.int32))]),
                              "input 'w' holds integers, and Conv takes floats")
    bad["gemm_int_weight"] = (model([node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w"], ["y"], name="gemm", transB=1)], X,
                                    [const("w", np.ones((3, 396), np.int64))], out_shape=["N", 3]),
                              "input 'w' holds integers, and Gemm takes floats")
    # Integer constants folded at load through ops whose evaluation reads floats (they crashed the
    # import: read out of an empty float buffer): refused by name.
    k4 = const("k", np.arange(4, dtype=np.int64).reshape(4, 1, 1))

    def folded(op_node, *inits):
        nodes = [op_node, node("Cast", ["f"], ["c"], to=TensorProto.FLOAT), node("Add", ["x", "c"])]
        return model(nodes, X, [k4, *inits], out_shape=["N", 4, 9, 11])

    bad["erf_int_constant"] = (folded(node("Erf", ["k"], ["f"])), "input 'k' holds integers, and Erf takes floats")
    bad["softmax_int_constant"] = (folded(node("Softmax", ["k"], ["f"], axis=0)),
                                   "input 'k' holds integers, and Softmax takes floats")
    bad["reducemax_int_constant"] = (folded(node("ReduceMax", ["k"], ["f"], axes=[0])),
                                     "input 'k' holds integers, and ReduceMax takes floats")
    bad["reducesum_int_constant"] = (folded(node("ReduceSum", ["k"], ["f"])),
                                     "input 'k' holds integers, and ReduceSum takes floats")
    bad["pad_int_constant"] = (folded(node("Pad", ["k", "pads"], ["f"]), const("pads", np.zeros(6, np.int64))),
                               "input 'k' holds integers, and Pad takes floats")
    bad["maxpool_int_constant"] = (model([node("MaxPool", ["k"], ["f"], kernel_shape=[1, 1]),
                                          node("Cast", ["f"], ["c"], to=TensorProto.FLOAT), node("Add", ["x", "c"])], X,
                                         [const("k", np.ones((1, 4, 9, 11), np.int64))], out_shape=["N", 4, 9, 11]),
                                   "input 'k' holds integers, and MaxPool takes floats")
    bad["resize_int_constant"] = (model([node("Resize", ["k", "", "scales"], ["f"]),
                                         node("Cast", ["f"], ["c"], to=TensorProto.FLOAT), node("Add", ["x", "c"])], X,
                                        [const("k", np.ones((1, 4, 9, 11), np.int64)), const("scales", np.ones(4, np.float32))],
                                        out_shape=["N", 4, 9, 11], opset=13),
                                  "input 'k' holds integers, and Resize takes floats")
    # An integer operand beside the input's: a float kernel would read the constant's bytes.
    bad["einsum_int_operand"] = (model([node("Einsum", ["x", "k"], equation="nchw,wv->nchv")], X,
                                       [const("k", np.ones((11, 11), np.int64))], opset=12, out_shape=["N", 4, 9, 11]),
                                 "input 'k' holds integers, and Einsum takes floats")
    bad["add_int_float"] = (model([node("Add", ["x", "k"])], X, [const("k", np.ones((4, 1, 1), np.int32))], out_shape=["N", 4, 9, 11]),
                            "inputs differ in element type")
    bad["bad_broadcast"] = (model([node("Add", ["x", "k"])], X, [const("k", rand(3, 1, 1))], out_shape=["N", 4, 9, 11]), "do not broadcast")
    return bad


def image_teachers():
    """Small image classifiers (10 logits) whose input is not Fashion-MNIST's 1x28x28: the app
    tests make their input from the data's images (teacher.input_size, teacher.mean/std)."""
    def classifier(x_dims, channels):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
        nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                 node("Relu", ["c"], ["r"]),
                 node("GlobalAveragePool", ["r"], ["p"]),
                 node("Flatten", ["p"], ["f"]),
                 node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1)]
        inits = [const("w", rand(8, channels, 3, 3)), const("b", rand(8)),
                 const("fc_w", rand(10, 8)), const("fc_b", rand(10))]
        m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], initializer=inits),
                              opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m
    return {"teacher_rgb40": classifier(["N", 3, 40, 40], 3),  # fixed: 3 channels, 40x40
            "teacher_open_hw": classifier(["N", 1, "H", "W"], 1)}  # height and width left open


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    manifest = {"models": [], "rejects": []}
    for name, m in cases().items():
        try:
            onnx.checker.check_model(m)
        except Exception as e:
            raise SystemExit(f"{name}: {e}")
        onnx.save(m, os.path.join(out, name + ".onnx"))
        dims = m.graph.input[0].type.tensor_type.shape.dim[1:]
        manifest["models"].append({"name": name, "input": [2] + [d.dim_value for d in dims]})
    # The same conv with its weights stored as external data beside the model.
    m = cases()["conv_basic"]
    onnx.save(m, os.path.join(out, "conv_external_data.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="conv_external_data.bin", size_threshold=0)
    manifest["models"].append({"name": "conv_external_data", "input": [2, 4, 9, 11]})
    manifest["image_teachers"] = []
    for name, m in image_teachers().items():
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(out, name + ".onnx"))
        manifest["image_teachers"].append(name)
    for name, (m, err) in rejects(out).items():
        onnx.save(m, os.path.join(out, name + ".onnx"))
        manifest["rejects"].append({"name": name, "error": err})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"op fixtures: {len(manifest['models'])} models, {len(manifest['rejects'])} rejects, in {out}")


if __name__ == "__main__":
    main()
