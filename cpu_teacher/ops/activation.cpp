// Elementwise activations (Relu, LeakyRelu, Clip, Sigmoid, Swish, HardSigmoid, HardSwish, Gelu,
// Tanh, Sqrt, Pow by a constant): one scalar function each for the reference, one oneDNN eltwise
// algorithm for the engine, where they run as a primitive of their own or fused as a post-op of
// the convolution or matrix product before them. Erf, which oneDNN has no eltwise for, is a plain
// kernel.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include "kdflow/cpu_teacher/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

// --- shape rules: the shape is the input's; defaults written out so every reader sees them -----

std::vector<InferredOutput> infer_leaky_relu(Node& node, const InferArgs& a) {
  node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 0.01f));
  return same_shape(node, a);
}

// Swish (ONNX opset 24; the passes make it from the exporters' SiLU, x * Sigmoid(x)): alpha 1.
std::vector<InferredOutput> infer_swish(Node& node, const InferArgs& a) {
  node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 1.f));
  return same_shape(node, a);
}

std::vector<InferredOutput> infer_hard_sigmoid(Node& node, const InferArgs& a) {
  node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 0.2f));
  node.attrs["beta"] = float_attribute(node.float_attr("beta", 0.5f));
  return same_shape(node, a);
}

// Clip's bounds are attributes before opset 11 and constant inputs since: both become min / max.
std::vector<InferredOutput> infer_clip(Node& node, const InferArgs& a) {
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
  if (a.opset < 11) {
    lo = node.float_attr("min", lo);
    hi = node.float_attr("max", hi);
  } else {
    const auto bound = [&](std::size_t k, const char* what) {
      const Tensor& t = need_constant(node, a.constants, k, what);
      if (t.size() != 1) bad(node, fmt::format("{} must be one value, has {}", what, t.size()));
      return static_cast<float>(t.at(0));
    };
    if (has_input(node, 1)) lo = bound(1, "min");
    if (has_input(node, 2)) hi = bound(2, "max");
  }
  node.attrs["min"] = float_attribute(lo);
  node.attrs["max"] = float_attribute(hi);
  return {{a.in[0], ElemType::f32}};
}

// Gelu (opset 20): approximate = "none" (erf) or "tanh", read into alpha (1 for tanh).
std::vector<InferredOutput> infer_gelu(Node& node, const InferArgs& a) {
  const std::string approximate = node.string_attr("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    bad(node, "approximate = '" + approximate + "' is neither 'none' nor 'tanh'");
  node.attrs["alpha"] = float_attribute(approximate == "tanh" ? 1.f : 0.f);
  return same_shape(node, a);
}

// Pow by a constant scalar exponent: oneDNN's pow (alpha * x^beta) with alpha 1.
std::vector<InferredOutput> infer_pow(Node& node, const InferArgs& a) {
  const Tensor& e = need_constant(node, a.constants, 1, "the exponent");
  if (e.size() != 1) bad(node, "the exponent must be one constant value");
  if (broadcast(node, a.in[0], a.in[1]) != a.in[0]) bad(node, "the exponent broadcasts the base");
  node.attrs["alpha"] = float_attribute(1.f);
  node.attrs["beta"] = float_attribute(static_cast<float>(e.at(0)));
  return same_shape(node, a);
}

// --- one activation, from the table: reference loop and oneDNN primitive
// --------------------------

const Activation& activation_of(const Node& node) {
  const OpDef* op = find_op(node.op);
  if (op == nullptr || op->activation == nullptr)
    throw std::logic_error(node.describe() + " is not an activation");
  return *op->activation;
}

std::vector<Tensor> evaluate_activation(const Node& node, const std::vector<const Tensor*>& x,
                                        const std::vector<InferredOutput>& outs) {
  const Activation& act = activation_of(node);
  const PostOp p = activation_post_op(node);
  if (x[0]->type != ElemType::f32) bad(node, "its input holds integers");
  std::vector<float> r(x[0]->f.size());
  for (std::size_t k = 0; k < r.size(); ++k) r[k] = act.scalar(x[0]->f[k], p.alpha, p.beta);
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

void lower_activation(Lowering& plan, const Node& node) {
  const Activation& act = activation_of(node);
  const PostOp p = activation_post_op(node);
  const auto [alpha, beta] = act.onednn_params.value_or(std::pair{p.alpha, p.beta});
  const ArgRef src = plan.at(node.inputs[0]);
  const auto pd = dnnl::eltwise_forward::primitive_desc(
      plan.eng(), dnnl::prop_kind::forward_inference,
      static_cast<dnnl::algorithm>(act.algorithm_for(p.alpha)), src.md, src.md, alpha, beta,
      Lowering::plain_attr());
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  plan.add_primitive(dnnl::eltwise_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                     node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// --- the activations -----------------------------------------------------------------------------

// Relu is oneDNN's relu with slope 0 below 0 (LeakyRelu's alpha).
constexpr Activation kRelu{.algorithm = dnnl_eltwise_relu,
                           .onednn_params = std::pair{0.f, 0.f},
                           .scalar = [](float x, float, float) { return x > 0 ? x : 0.f; }};
constexpr Activation kLeakyRelu{
    .algorithm = dnnl_eltwise_relu,
    .scalar = [](float x, float alpha, float) { return x >= 0 ? x : alpha * x; }};
constexpr Activation kClip{
    .algorithm = dnnl_eltwise_clip_v2,
    .alpha_attr = "min",
    .beta_attr = "max",
    .scalar = [](float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }};
constexpr Activation kSigmoid{
    .algorithm = dnnl_eltwise_logistic,
    .scalar = [](float x, float, float) { return 1.f / (1.f + std::exp(-x)); }};
constexpr Activation kSwish{
    .algorithm = dnnl_eltwise_swish,
    .scalar = [](float x, float alpha, float) { return x / (1.f + std::exp(-alpha * x)); }};
constexpr Activation kHardSigmoid{.algorithm = dnnl_eltwise_hardsigmoid,
                                  .scalar = [](float x, float alpha, float beta) {
                                    return std::max(0.f, std::min(1.f, alpha * x + beta));
                                  }};
// HardSwish has no attributes; oneDNN's hardswish takes the slope and offset of its hard sigmoid.
constexpr Activation kHardSwish{.algorithm = dnnl_eltwise_hardswish,
                                .onednn_params = std::pair{1.f / 6.f, 0.5f},
                                .scalar = [](float x, float, float) {
                                  return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f));
                                }};

// Gelu: erf form, or the tanh approximation where alpha (approximate = "tanh") is 1.
constexpr Activation kGelu{
    .algorithm = dnnl_eltwise_gelu_erf,
    .onednn_params = std::pair{0.f, 0.f},
    .scalar =
        [](float x, float tanh_form, float) {
          if (tanh_form != 0)
            return 0.5f * x * (1.f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
          return 0.5f * x * (1.f + std::erf(x * 0.70710678118f));
        },
    .algorithm_if_alpha = dnnl_eltwise_gelu_tanh};
constexpr Activation kTanh{.algorithm = dnnl_eltwise_tanh,
                           .scalar = [](float x, float, float) { return std::tanh(x); }};
constexpr Activation kSqrt{.algorithm = dnnl_eltwise_sqrt,
                           .scalar = [](float x, float, float) { return std::sqrt(x); }};
constexpr Activation kExp{.algorithm = dnnl_eltwise_exp,
                          .scalar = [](float x, float, float) { return std::exp(x); }};
constexpr Activation kLog{.algorithm = dnnl_eltwise_log,
                          .scalar = [](float x, float, float) { return std::log(x); }};
constexpr Activation kAbs{.algorithm = dnnl_eltwise_abs,
                          .scalar = [](float x, float, float) { return std::fabs(x); }};
// Neg: oneDNN's linear eltwise, -1 * x + 0.
constexpr Activation kNeg{.algorithm = dnnl_eltwise_linear,
                          .onednn_params = std::pair{-1.f, 0.f},
                          .scalar = [](float x, float, float) { return -x; }};
constexpr Activation kPow{.algorithm = dnnl_eltwise_pow,
                          .scalar = [](float x, float, float e) { return std::pow(x, e); }};

// Erf: no oneDNN eltwise computes it alone; a plain float32 loop.
std::vector<Tensor> evaluate_erf(const Node&, const std::vector<const Tensor*>& x,
                                 const std::vector<InferredOutput>& outs) {
  std::vector<float> r(x[0]->f.size());
  for (std::size_t k = 0; k < r.size(); ++k) r[k] = std::erf(x[0]->f[k]);
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

void lower_erf(Lowering& plan, const Node& node) {
  const Shape& xs = plan.graph().shape(node.inputs[0]);
  const ArgRef src = plan.get_plain(node.inputs[0], dt::f32);
  const ArgRef dst = plan.new_buffer(plain(xs, dt::f32));
  const auto n = static_cast<std::size_t>(numel(xs));
  plan.add_kernel(
      [n](std::byte* const* p) {
        const auto* x = reinterpret_cast<const float*>(p[0]);
        auto* y = reinterpret_cast<float*>(p[1]);
        for (std::size_t k = 0; k < n; ++k) y[k] = std::erf(x[k]);
      },
      {src, dst}, node.describe());
  plan.set(node.outputs[0], dst);
}

constexpr OpDef kOps[] = {
    {.name = "Gelu",
     .infer = infer_gelu,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kGelu},
    {.name = "Tanh",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kTanh},
    {.name = "Sqrt",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kSqrt},
    {.name = "Exp",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kExp},
    {.name = "Log",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kLog},
    {.name = "Abs",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kAbs},
    {.name = "Neg",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kNeg},
    {.name = "Pow",
     .min_inputs = 2,
     .infer = infer_pow,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kPow},
    {.name = "Erf",
     .float_inputs = 1,
     .infer = same_shape,
     .evaluate = evaluate_erf,
     .lower = lower_erf},
    {.name = "Relu",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kRelu},
    {.name = "LeakyRelu",
     .infer = infer_leaky_relu,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kLeakyRelu},
    {.name = "Clip",
     .infer = infer_clip,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kClip},
    {.name = "Sigmoid",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kSigmoid},
    {.name = "Swish",
     .infer = infer_swish,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kSwish},
    {.name = "HardSigmoid",
     .infer = infer_hard_sigmoid,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kHardSigmoid},
    {.name = "HardSwish",
     .infer = same_shape,
     .evaluate = evaluate_activation,
     .lower = lower_activation,
     .activation = &kHardSwish},
};

} // namespace

std::span<const OpDef> activation_ops() { return kOps; }

PostOp activation_post_op(const Node& node) {
  const Activation& act = activation_of(node);
  PostOp post;
  post.kind = PostOp::Kind::eltwise;
  post.op = node.op;
  post.alpha = node.float_attr(act.alpha_attr, 0);
  post.beta = node.float_attr(act.beta_attr, 0);
  post.fused_node = node.name;
  return post;
}

} // namespace kdflow::teacher
