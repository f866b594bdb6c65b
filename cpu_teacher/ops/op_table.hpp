// The teacher's op table (internal): every ONNX op kdflow reads is declared once, in the file of
// its family (ops/*.cpp), with its shape rule, its reference loop, its oneDNN lowering and the
// traits the passes, the importer and the engine ask about. Everything dispatches through it.
#pragma once

#include "kdflow/cpu_teacher/reference.hpp"

#include <oneapi/dnnl/dnnl_types.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace kdflow::teacher {

class Lowering; // ops/lowering.hpp: the plan builder, as the lowerings see it

// What a shape rule reads besides the node: its inputs' shapes and element types, the data of the
// inputs that are constants (nullptr otherwise) and the model's opset.
struct InferArgs {
  const std::vector<Shape>& in;
  const std::vector<ElemType>& types;
  const std::vector<const Tensor*>& constants;
  std::int64_t opset;
};

// Output shapes and types; also normalizes the node's attributes (see infer in reference.hpp).
using InferFn = std::vector<InferredOutput> (*)(Node& node, const InferArgs& args);
// The plain-loop reference on full tensors (node already normalized by its InferFn).
using EvaluateFn = std::vector<Tensor> (*)(const Node& node, const std::vector<const Tensor*>& x,
                                           const std::vector<InferredOutput>& outs);
// Adds the node's steps to the execution plan.
using LowerFn = void (*)(Lowering& plan, const Node& node);

// An elementwise activation: a node of its own, or fused as an eltwise post-op.
struct Activation {
  dnnl_alg_kind_t algorithm;
  // The node's attributes (after its shape rule) that hold PostOp::alpha and PostOp::beta.
  const char* alpha_attr = "alpha";
  const char* beta_attr = "beta";
  // oneDNN's alpha and beta for `algorithm` where they are not the node's: HardSwish's fixed
  // slope and offset, Relu's zero slope.
  std::optional<std::pair<float, float>> onednn_params;
  float (*scalar)(float x, float alpha, float beta);
  // Where an attribute picks the formula (Gelu's approximate = "tanh", read into alpha): oneDNN's
  // algorithm when alpha != 0.
  dnnl_alg_kind_t algorithm_if_alpha = dnnl_alg_kind_undef;

  [[nodiscard]] dnnl_alg_kind_t algorithm_for(float alpha) const {
    return alpha != 0 && algorithm_if_alpha != dnnl_alg_kind_undef ? algorithm_if_alpha : algorithm;
  }
};

// Post-ops a node can absorb: activations (eltwise), and also a residual Add (sum).
enum class PostOps { none, eltwise, eltwise_and_sum };

struct OpDef {
  std::string_view name;      // ONNX op type
  std::size_t min_inputs = 1; // checked before the shape rule runs
  // The first this many inputs (those given) must hold floats: the data and parameters its float
  // kernel reads (a Conv's weight and bias, a BatchNormalization's statistics); checked before
  // the shape rule runs, so that an integer initializer there is refused, never read as floats.
  std::size_t float_inputs = 0;
  InferFn infer = nullptr; // shape rule and attribute normalization
  EvaluateFn evaluate = nullptr;
  LowerFn lower = nullptr; // nullptr: load-time only (folded at import, never run per batch)
  const Activation* activation = nullptr;
  // Same bytes seen with another shape (Reshape, Flatten, Identity, ...): no data moves, and a
  // view that keeps its input's shape is removed by the passes.
  bool view = false;
  PostOps (*post_ops)(const Graph& g, const Node& node) = nullptr; // nullptr: takes none
  // Outputs past the first are training-only (Dropout's mask, BatchNorm's running statistics):
  // the importer drops them.
  bool training_outputs = false;
  // Reads its inputs' shapes only (Shape): folded at import whatever the inputs are.
  bool reads_shapes_only = false;
  double (*flops_per_sample)(const Graph& g, const Node& node) = nullptr; // multiply-adds count 2
};

// The entry for `op`, or nullptr. A map lookup: call it while building, never per batch.
// (teacher_ops() in kdflow/cpu_teacher/ops.hpp lists the entries.)
const OpDef* find_op(std::string_view op);

// Each family file's entries (ops/<family>.cpp); ops/table.cpp joins them into the one table.
std::span<const OpDef> activation_ops();
std::span<const OpDef> binary_ops();
std::span<const OpDef> conv_ops();
std::span<const OpDef> folding_ops();
std::span<const OpDef> gemm_ops();
std::span<const OpDef> indexing_ops();
std::span<const OpDef> norm_ops();
std::span<const OpDef> pool_ops();
std::span<const OpDef> resize_ops();
std::span<const OpDef> shape_ops();
std::span<const OpDef> softmax_ops();

} // namespace kdflow::teacher
