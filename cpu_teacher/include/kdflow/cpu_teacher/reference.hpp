// Plain-loop reference implementations of every supported ONNX op, and static shape inference,
// each from the op's entry in the teacher's op table. They fold constant subgraphs at load and
// check the oneDNN engine in the tests; the engine runs the same loops (on preallocated plain
// buffers, nothing allocated per batch) for the rare op variants oneDNN has no primitive for
// (reflect/edge Pad, broadcasting the first operand of Sub or Div, negative Slice steps).
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"

#include <vector>

namespace kdflow::teacher {

// Output shapes (and element types) of `node` from its input shapes; `constant` holds the data of
// inputs that are constants (nullptr otherwise), which shape-carrying inputs (Reshape's shape,
// Slice's starts, ...) must be. Also normalizes the node: auto_pad becomes explicit pads, and
// attribute/input variants of different opsets become one form. Throws InputError naming the node.
struct InferredOutput {
  Shape shape;
  ElemType type;
};
std::vector<InferredOutput> infer(Node& node, const std::vector<Shape>& in_shapes,
                                  const std::vector<ElemType>& in_types,
                                  const std::vector<const Tensor*>& constant, std::int64_t opset);

// Evaluates `node` (already normalized by infer) on full input tensors.
std::vector<Tensor> evaluate(const Node& node, const std::vector<const Tensor*>& inputs,
                             const std::vector<InferredOutput>& outputs, std::int64_t opset);

} // namespace kdflow::teacher
