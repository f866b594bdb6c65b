// The shape arithmetic of exported graphs (Shape, Gather, Cast, Constant, ConstantOfShape, Equal,
// Where, Mod, Expand, Range, Not and the comparisons), folded into constants at import. Only
// Gather (constant indices into computed data) and Expand (a broadcast copy) also run per batch;
// the others have no lowering, and a graph that would run one per batch is refused as
// unsupported.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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
  // Folded into a constant here: a negative or huge shape is the model's error, not an allocation.
  constexpr std::int64_t kMaxFolded = std::int64_t{1} << 28;
  for (const std::int64_t d : shape)
    if (d < 0) bad(node, fmt::format("shape {} has a negative dimension", format_shape(shape)));
  if (numel(shape) > kMaxFolded)
    bad(node, fmt::format("shape {} has more than the {} elements a folded constant may hold",
                          format_shape(shape), kMaxFolded));
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

// Gather on computed data with constant indices (the class token taken from a sequence): each
// index is one reorder of the input's slice at that index into its place in the output. One
// index (attention's Q, K and V taken from one projection), or indices that step evenly (an
// exporter's as_strided), make a view of the input instead (Lowering::view_selected,
// view_gathered): its reader copies it out.
void lower_gather(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  if (!g.is_constant(node.inputs[1]))
    plan.fail(node, "indices computed from the input data are not supported");
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const auto axis = static_cast<std::size_t>(node.int_attr("axis", 0));
  const Tensor& indices = g.constants.at(node.inputs[1]);
  const std::size_t index_rank = indices.shape.size();
  std::vector<std::int64_t> positions(static_cast<std::size_t>(indices.size()));
  for (std::size_t p = 0; p < positions.size(); ++p) {
    std::int64_t q = indices.int_at(static_cast<std::int64_t>(p));
    if (q < 0) q += xs[axis];
    if (q < 0 || q >= xs[axis]) plan.fail(node, "index out of range");
    positions[p] = q;
  }
  if (positions.size() == 1 ? plan.view_selected(node, axis, positions[0], index_rank)
                            : plan.view_gathered(node, axis, positions, indices.shape))
    return;
  const Shape xst = strides_of(xs), ost = strides_of(os);
  // The slice at one index: the input's axes but `axis`, read with the input's strides and
  // written with the output's (its leading axes, then the ones after the index axes).
  memory::dims dims, src_strides, dst_strides;
  for (std::size_t d = 0; d < xs.size(); ++d) {
    if (d == axis) continue;
    dims.push_back(xs[d]);
    src_strides.push_back(xst[d]);
    dst_strides.push_back(d < axis ? ost[d] : ost[d - 1 + index_rank]);
  }
  if (dims.empty()) dims = src_strides = dst_strides = {1};
  const std::int64_t inner =
      numel(Shape(xs.begin() + static_cast<std::ptrdiff_t>(axis) + 1, xs.end()));
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  const std::size_t elem = memory::data_type_size(type);
  const ArgRef src = plan.get_plain(node.inputs[0], type);
  const ArgRef dst = plan.new_buffer(plain(os, type));
  for (std::size_t p = 0; p < positions.size(); ++p) {
    const std::int64_t q = positions[p];
    plan.add_reorder(
        ArgRef{src.kind, src.index, src.offset + static_cast<std::size_t>(q * xst[axis]) * elem,
               memory::desc(dims, type, src_strides)},
        ArgRef{dst.kind, dst.index,
               dst.offset + static_cast<std::size_t>(static_cast<std::int64_t>(p) * inner) * elem,
               memory::desc(dims, type, dst_strides)},
        node.describe());
  }
  plan.set(node.outputs[0], dst);
}

// --- shape logic of exported graphs: Equal, Where, Mod, Expand (folded at import) ----------------

std::vector<InferredOutput> infer_equal(Node& node, const InferArgs& a) {
  return {{broadcast(node, a.in[0], a.in[1]), ElemType::i64}};
}

std::vector<InferredOutput> infer_where(Node& node, const InferArgs& a) {
  return {{broadcast(node, broadcast(node, a.in[0], a.in[1]), a.in[2]), a.types[1]}};
}

std::vector<InferredOutput> infer_mod(Node& node, const InferArgs& a) {
  node.attrs["fmod"] = int_attribute(node.int_attr("fmod", 0));
  if (a.types[0] == ElemType::f32 && node.int_attr("fmod", 0) == 0)
    bad(node, "fmod = 0 on floats (ONNX requires fmod = 1 for them)");
  return {{broadcast(node, a.in[0], a.in[1]), a.types[0]}};
}

std::vector<InferredOutput> infer_expand(Node& node, const InferArgs& a) {
  const auto shape = need_constant(node, a.constants, 1, "shape").as_ints();
  return {{broadcast(node, a.in[0], shape), a.types[0]}};
}

// Range(start, limit, delta): max(0, ceil((limit - start) / delta)) values.
std::vector<InferredOutput> infer_range(Node& node, const InferArgs& a) {
  const double start = need_constant(node, a.constants, 0, "start").at(0);
  const double limit = need_constant(node, a.constants, 1, "limit").at(0);
  const double delta = need_constant(node, a.constants, 2, "delta").at(0);
  if (delta == 0) bad(node, "delta is 0");
  const double n = std::max(0.0, std::ceil((limit - start) / delta));
  if (n > 1e9) bad(node, "more than 10^9 values");
  return {{{static_cast<std::int64_t>(n)}, a.types[0]}};
}

std::vector<Tensor> evaluate_range(const Node&, const std::vector<const Tensor*>& x,
                                   const std::vector<InferredOutput>& outs) {
  const double start = x[0]->at(0), delta = x[2]->at(0);
  const std::int64_t n = outs[0].shape[0];
  if (outs[0].type == ElemType::f32) {
    std::vector<float> r(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k)
      r[static_cast<std::size_t>(k)] = static_cast<float>(start + static_cast<double>(k) * delta);
    return {Tensor::floats(outs[0].shape, std::move(r))};
  }
  std::vector<std::int64_t> r(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k)
    r[static_cast<std::size_t>(k)] = x[0]->int_at(0) + k * x[2]->int_at(0);
  return {Tensor::ints(outs[0].shape, std::move(r))};
}

// out[k] = f(x0, x1, ...) over the broadcast output shape: each input read at its broadcast
// position, as a double (exact for the int64 values of shape arithmetic).
template <typename F>
Tensor broadcast_map(const std::vector<const Tensor*>& x, const InferredOutput& out, F&& f) {
  std::vector<Shape> strides;
  for (const Tensor* t : x) strides.push_back(broadcast_strides(t->shape, out.shape));
  const std::int64_t n = numel(out.shape);
  std::vector<double> r(static_cast<std::size_t>(n));
  std::vector<double> args(x.size());
  for_each_index(out.shape, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::int64_t off = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[i][d];
      args[i] =
          x[i]->type == ElemType::f32 ? x[i]->at(off) : static_cast<double>(x[i]->int_at(off));
    }
    r[static_cast<std::size_t>(k)] = f(args);
  });
  if (out.type == ElemType::f32)
    return Tensor::floats(out.shape, std::vector<float>(r.begin(), r.end()));
  std::vector<std::int64_t> ints(r.size());
  for (std::size_t k = 0; k < r.size(); ++k) ints[k] = static_cast<std::int64_t>(r[k]);
  return Tensor::ints(out.shape, std::move(ints));
}

std::vector<Tensor> evaluate_equal(const Node&, const std::vector<const Tensor*>& x,
                                   const std::vector<InferredOutput>& outs) {
  return {broadcast_map(x, outs[0], [](const std::vector<double>& v) { return v[0] == v[1]; })};
}

std::vector<Tensor> evaluate_where(const Node&, const std::vector<const Tensor*>& x,
                                   const std::vector<InferredOutput>& outs) {
  return {broadcast_map(x, outs[0],
                        [](const std::vector<double>& v) { return v[0] != 0 ? v[1] : v[2]; })};
}

std::vector<Tensor> evaluate_mod(const Node& node, const std::vector<const Tensor*>& x,
                                 const std::vector<InferredOutput>& outs) {
  const bool fmod = node.int_attr("fmod", 0) != 0;
  return {broadcast_map(x, outs[0], [&](const std::vector<double>& v) {
    if (v[1] == 0) bad(node, "division by zero");
    const double r = std::fmod(v[0], v[1]);
    // fmod = 0: the result takes the divisor's sign, as Python's %.
    return !fmod && r != 0 && ((r < 0) != (v[1] < 0)) ? r + v[1] : r;
  })};
}

std::vector<Tensor> evaluate_expand(const Node&, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  return {broadcast_map({x[0]}, outs[0], [](const std::vector<double>& v) { return v[0]; })};
}

// Expand of computed data (F.normalize's norm expanded to its input before the division): a
// broadcast copy, each output row from its source row.
void lower_expand(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  Shape padded = xs;
  while (padded.size() < os.size()) padded.insert(padded.begin(), 1);
  const Shape st = broadcast_strides(padded, os);
  // The innermost run the source and the output share: copied whole (or one value repeated).
  const std::size_t last = os.size() - 1;
  const std::int64_t run = os.empty() ? 1 : os[last];
  const bool repeat = !os.empty() && st[last] == 0;
  const ArgRef src = plan.get_plain(node.inputs[0], dt::f32);
  const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
  std::vector<std::int64_t> rows; // each output row's source offset
  const Shape outer(os.begin(), os.end() - (os.empty() ? 0 : 1));
  for_each_index(outer, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * st[d];
    rows.push_back(off);
  });
  plan.add_kernel(
      [rows = std::move(rows), run, repeat](std::byte* const* p) {
        const auto* x = reinterpret_cast<const float*>(p[0]);
        auto* y = reinterpret_cast<float*>(p[1]);
        for (const std::int64_t off : rows) {
          if (repeat)
            std::fill(y, y + run, x[off]);
          else
            std::copy(x + off, x + off + run, y);
          y += run;
        }
      },
      {src, dst}, node.describe());
  plan.set(node.outputs[0], dst);
}

// Boolean logic on shape data and masks (folded; booleans are int64 0 and 1).
std::vector<InferredOutput> infer_not(Node&, const InferArgs& a) {
  return {{a.in[0], ElemType::i64}};
}

std::vector<Tensor> evaluate_not(const Node&, const std::vector<const Tensor*>& x,
                                 const std::vector<InferredOutput>& outs) {
  return {broadcast_map(x, outs[0], [](const std::vector<double>& v) { return v[0] == 0; })};
}

template <bool (*F)(double, double)>
std::vector<Tensor> evaluate_compare(const Node&, const std::vector<const Tensor*>& x,
                                     const std::vector<InferredOutput>& outs) {
  return {broadcast_map(x, outs[0], [](const std::vector<double>& v) { return F(v[0], v[1]); })};
}

constexpr bool less(double a, double b) { return a < b; }
constexpr bool greater(double a, double b) { return a > b; }
constexpr bool less_equal(double a, double b) { return a <= b; }
constexpr bool greater_equal(double a, double b) { return a >= b; }
constexpr bool logical_and(double a, double b) { return a != 0 && b != 0; }
constexpr bool logical_or(double a, double b) { return a != 0 || b != 0; }
constexpr bool logical_xor(double a, double b) { return (a != 0) != (b != 0); }

constexpr OpDef kOps[] = {
    {.name = "Shape", .infer = infer_shape, .evaluate = evaluate_shape, .reads_shapes_only = true},
    {.name = "Gather",
     .min_inputs = 2,
     .infer = infer_gather,
     .evaluate = evaluate_gather,
     .lower = lower_gather},
    {.name = "Equal", .min_inputs = 2, .infer = infer_equal, .evaluate = evaluate_equal},
    {.name = "Where", .min_inputs = 3, .infer = infer_where, .evaluate = evaluate_where},
    {.name = "Mod", .min_inputs = 2, .infer = infer_mod, .evaluate = evaluate_mod},
    {.name = "Expand",
     .min_inputs = 2,
     .infer = infer_expand,
     .evaluate = evaluate_expand,
     .lower = lower_expand},
    {.name = "Not", .infer = infer_not, .evaluate = evaluate_not},
    {.name = "Less", .min_inputs = 2, .infer = infer_equal, .evaluate = evaluate_compare<less>},
    {.name = "Greater",
     .min_inputs = 2,
     .infer = infer_equal,
     .evaluate = evaluate_compare<greater>},
    {.name = "LessOrEqual",
     .min_inputs = 2,
     .infer = infer_equal,
     .evaluate = evaluate_compare<less_equal>},
    {.name = "GreaterOrEqual",
     .min_inputs = 2,
     .infer = infer_equal,
     .evaluate = evaluate_compare<greater_equal>},
    {.name = "And",
     .min_inputs = 2,
     .infer = infer_equal,
     .evaluate = evaluate_compare<logical_and>},
    {.name = "Or", .min_inputs = 2, .infer = infer_equal, .evaluate = evaluate_compare<logical_or>},
    {.name = "Xor",
     .min_inputs = 2,
     .infer = infer_equal,
     .evaluate = evaluate_compare<logical_xor>},
    {.name = "Range", .min_inputs = 3, .infer = infer_range, .evaluate = evaluate_range},
    {.name = "Cast", .infer = infer_cast, .evaluate = evaluate_cast},
    {.name = "Constant", .min_inputs = 0, .infer = infer_constant, .evaluate = evaluate_constant},
    {.name = "ConstantOfShape",
     .infer = infer_constant_of_shape,
     .evaluate = evaluate_constant_of_shape},
};

} // namespace

std::span<const OpDef> folding_ops() { return kOps; }

} // namespace kdflow::teacher
