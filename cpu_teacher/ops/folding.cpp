// Load-time-only ops (Shape, Gather, Cast, Constant, ConstantOfShape): the shape arithmetic of
// exported graphs, folded into constants at import. They have no lowering: a graph that would run
// one per batch (Gather on the image data, say) is refused as unsupported.
#include "common.hpp"
#include "op_table.hpp"

#include <algorithm>

namespace kdflow::teacher {
namespace {

// ONNX TensorProto element types that stay float (FLOAT, FLOAT16, DOUBLE, BFLOAT16); integer and
// bool targets become int64 (shape arithmetic).
bool is_float_type(std::int64_t onnx_type) {
  return onnx_type == 1 || onnx_type == 10 || onnx_type == 11 || onnx_type == 16;
}

std::vector<InferredOutput> infer_shape(Node& node, const InferArgs& a) {
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  std::int64_t start = node.int_attr("start", 0), end = node.int_attr("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<std::int64_t>(start, 0, rank);
  end = std::clamp<std::int64_t>(end, 0, rank);
  node.attrs["start"] = int_attribute(start);
  node.attrs["end"] = int_attribute(end);
  return {{{std::max<std::int64_t>(0, end - start)}, ElemType::i64}};
}

std::vector<Tensor> evaluate_shape(const Node& node, const std::vector<const Tensor*>& x,
                                   const std::vector<InferredOutput>& outs) {
  std::vector<std::int64_t> dims(x[0]->shape.begin() + node.int_attr("start", 0),
                                 x[0]->shape.begin() + node.int_attr("end", 0));
  return {Tensor::ints(outs[0].shape, dims)};
}

std::vector<InferredOutput> infer_gather(Node& node, const InferArgs& a) {
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  const std::int64_t axis = norm_axis(node, node.int_attr("axis", 0), rank);
  node.attrs["axis"] = int_attribute(axis);
  Shape out(a.in[0].begin(), a.in[0].begin() + axis);
  out.insert(out.end(), a.in[1].begin(), a.in[1].end());
  out.insert(out.end(), a.in[0].begin() + axis + 1, a.in[0].end());
  return {{out, a.types[0]}};
}

std::vector<Tensor> evaluate_gather(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const Tensor& data = *x[0];
  const auto axis = static_cast<std::size_t>(node.int_attr("axis", 0));
  const std::int64_t outer =
      numel(Shape(data.shape.begin(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis)));
  const std::int64_t dim = data.shape[axis];
  const std::int64_t inner =
      numel(Shape(data.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.shape.end()));
  const auto idx = x[1]->as_ints();
  Tensor r;
  r.type = data.type;
  r.shape = outs[0].shape;
  for (std::int64_t o = 0; o < outer; ++o)
    for (auto q : idx) {
      if (q < 0) q += dim;
      if (q < 0 || q >= dim) bad(node, "index out of range");
      for (std::int64_t in = 0; in < inner; ++in) {
        const std::int64_t src = (o * dim + q) * inner + in;
        if (r.type == ElemType::f32)
          r.f.push_back(data.f[static_cast<std::size_t>(src)]);
        else
          r.i.push_back(data.i[static_cast<std::size_t>(src)]);
      }
    }
  return {r};
}

std::vector<InferredOutput> infer_cast(Node& node, const InferArgs& a) {
  const ElemType t = is_float_type(node.int_attr("to", 1)) ? ElemType::f32 : ElemType::i64;
  return {{a.in[0], t}};
}

std::vector<Tensor> evaluate_cast(const Node&, const std::vector<const Tensor*>& x,
                                  const std::vector<InferredOutput>& outs) {
  const Tensor& t = *x[0];
  if (outs[0].type == ElemType::f32) {
    std::vector<float> r(static_cast<std::size_t>(t.size()));
    for (std::int64_t k = 0; k < t.size(); ++k)
      r[static_cast<std::size_t>(k)] = static_cast<float>(t.at(k));
    return {Tensor::floats(outs[0].shape, std::move(r))};
  }
  return {Tensor::ints(outs[0].shape, t.as_ints())};
}

std::vector<InferredOutput> infer_constant(Node& node, const InferArgs&) {
  if (node.has("value") && node.attrs.at("value").t)
    return {{node.attrs.at("value").t->shape, node.attrs.at("value").t->type}};
  if (node.has("value_float")) return {{{}, ElemType::f32}};
  if (node.has("value_floats"))
    return {
        {{static_cast<std::int64_t>(node.attrs.at("value_floats").floats.size())}, ElemType::f32}};
  if (node.has("value_int")) return {{{}, ElemType::i64}};
  if (node.has("value_ints"))
    return {{{static_cast<std::int64_t>(node.attrs.at("value_ints").ints.size())}, ElemType::i64}};
  bad(node, "has no value kdflow can read");
}

std::vector<Tensor> evaluate_constant(const Node& node, const std::vector<const Tensor*>&,
                                      const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  if (node.has("value")) return {*node.attrs.at("value").t};
  if (node.has("value_float")) return {Tensor::floats({}, {node.attrs.at("value_float").f})};
  if (node.has("value_floats")) return {Tensor::floats(os, node.attrs.at("value_floats").floats)};
  if (node.has("value_int")) return {Tensor::ints({}, {node.attrs.at("value_int").i})};
  return {Tensor::ints(os, node.attrs.at("value_ints").ints)};
}

std::vector<InferredOutput> infer_constant_of_shape(Node& node, const InferArgs& a) {
  const auto shape = need_constant(node, a.constants, 0, "shape").as_ints();
  ElemType t = ElemType::f32;
  if (node.has("value") && node.attrs.at("value").t) t = node.attrs.at("value").t->type;
  return {{shape, t}};
}

std::vector<Tensor> evaluate_constant_of_shape(const Node& node, const std::vector<const Tensor*>&,
                                               const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const std::int64_t n = numel(os);
  if (outs[0].type == ElemType::i64) {
    const std::int64_t v = node.has("value") ? node.attrs.at("value").t->int_at(0) : 0;
    return {Tensor::ints(os, std::vector<std::int64_t>(static_cast<std::size_t>(n), v))};
  }
  const float v = node.has("value") ? static_cast<float>(node.attrs.at("value").t->at(0)) : 0.f;
  return {Tensor::floats(os, std::vector<float>(static_cast<std::size_t>(n), v))};
}

constexpr OpDef kOps[] = {
    {.name = "Shape", .infer = infer_shape, .evaluate = evaluate_shape, .reads_shapes_only = true},
    {.name = "Gather", .min_inputs = 2, .infer = infer_gather, .evaluate = evaluate_gather},
    {.name = "Cast", .infer = infer_cast, .evaluate = evaluate_cast},
    {.name = "Constant", .min_inputs = 0, .infer = infer_constant, .evaluate = evaluate_constant},
    {.name = "ConstantOfShape",
     .infer = infer_constant_of_shape,
     .evaluate = evaluate_constant_of_shape},
};

} // namespace

std::span<const OpDef> folding_ops() { return kOps; }

} // namespace kdflow::teacher
