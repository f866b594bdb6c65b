// Reference ops: shape inference (with normalization of opset variants) and plain-loop evaluation,
// each dispatched to the node's op table entry (ops/*.cpp), and the helpers the entries share.
#include "kdflow/cpu_teacher/reference.hpp"

#include "kdflow/core/error.hpp"
#include "ops/common.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

const OpDef& op_of(const Node& node) {
  const OpDef* op = find_op(node.op);
  if (op == nullptr)
    bad(node, fmt::format("op type '{}' is not supported by kdflow's teacher", node.op));
  return *op;
}

} // namespace

std::vector<InferredOutput> infer(Node& node, const std::vector<Shape>& in,
                                  const std::vector<ElemType>& types,
                                  const std::vector<const Tensor*>& c, std::int64_t opset) {
  const OpDef& op = op_of(node);
  if (in.size() < op.min_inputs)
    bad(node, fmt::format("needs {} inputs, has {}", op.min_inputs, in.size()));
  for (std::size_t k = 0; k < std::min(op.float_inputs, in.size()); ++k)
    if (!node.inputs[k].empty() && types[k] != ElemType::f32)
      bad(node, fmt::format("input '{}' holds integers, and {} takes floats there", node.inputs[k],
                            node.op));
  return op.infer(node, InferArgs{in, types, c, opset});
}

std::vector<Tensor> evaluate(const Node& node, const std::vector<const Tensor*>& x,
                             const std::vector<InferredOutput>& outs, std::int64_t opset) {
  (void)opset;
  return op_of(node).evaluate(node, x, outs);
}

// --- helpers of the op families (ops/common.hpp) -------------------------------------------------

void bad(const Node& node, const std::string& what) {
  throw InputError(fmt::format("{}: {}", node.describe(), what));
}

std::int64_t norm_axis(const Node& node, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= std::max<std::int64_t>(rank, 1))
    bad(node, fmt::format("axis {} out of range for rank {}", axis, rank));
  return axis < 0 ? axis + rank : axis;
}

Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

Shape broadcast(const Node& node, const Shape& a, const Shape& b) {
  const std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t k = 0; k < r; ++k) {
    const std::int64_t da = k + a.size() >= r ? a[k + a.size() - r] : 1;
    const std::int64_t db = k + b.size() >= r ? b[k + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      bad(node, fmt::format("shapes {} and {} do not broadcast", format_shape(a), format_shape(b)));
    out[k] = da == 1 ? db : da;
  }
  return out;
}

Shape broadcast_strides(const Shape& in, const Shape& out) {
  const Shape st = strides_of(in);
  Shape bs(out.size(), 0);
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::size_t o = k + out.size() - in.size();
    bs[o] = in[k] == 1 ? 0 : st[k];
  }
  return bs;
}

std::int64_t out_extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil,
                        std::int64_t pb, std::int64_t pe, bool ceil_mode) {
  const std::int64_t eff = (k - 1) * dil + 1;
  const std::int64_t span = in + pb + pe - eff;
  std::int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // A window may not start in the right padding only (ceil mode).
  if (ceil_mode && (out - 1) * stride >= in + pb) --out;
  return out;
}

void normalize_window(Node& node, const Shape& x, const Shape& kernel) {
  if (x.size() != 4)
    bad(node, fmt::format("only 2-D inputs (NCHW) are supported, got {}", format_shape(x)));
  const auto strides = node.ints_attr("strides", {1, 1});
  const auto dil = node.ints_attr("dilations", {1, 1});
  auto pads = node.ints_attr("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4 || kernel.size() != 2)
    bad(node, "strides, dilations, kernel_shape and pads must describe 2 spatial axes");
  // Bounded so that the output extents below neither divide by zero nor overflow.
  constexpr std::int64_t kMaxWindow = 1 << 20;
  for (int a = 0; a < 2; ++a) {
    if (strides[a] < 1 || strides[a] > kMaxWindow || dil[a] < 1 || dil[a] > kMaxWindow)
      bad(node, fmt::format("strides {} and dilations {} must be from 1 to {}",
                            format_shape(strides), format_shape(dil), kMaxWindow));
    if (kernel[a] < 1 || kernel[a] > kMaxWindow)
      bad(node,
          fmt::format("kernel_shape {} must be from 1 to {}", format_shape(kernel), kMaxWindow));
  }
  for (const auto p : pads)
    if (p < 0 || p > kMaxWindow)
      bad(node, fmt::format("pads {} must be from 0 to {}", format_shape(pads), kMaxWindow));
  const std::string auto_pad = node.string_attr("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (int a = 0; a < 2; ++a) {
      const std::int64_t in = x[2 + a];
      const std::int64_t out = (in + strides[a] - 1) / strides[a];
      const std::int64_t total =
          std::max<std::int64_t>(0, (out - 1) * strides[a] + (kernel[a] - 1) * dil[a] + 1 - in);
      const std::int64_t small = total / 2;
      pads[a] = auto_pad == "SAME_UPPER" ? small : total - small;
      pads[a + 2] = total - pads[a];
    }
  } else if (auto_pad == "VALID") {
    pads = {0, 0, 0, 0};
  } else if (auto_pad != "NOTSET") {
    bad(node, "unknown auto_pad '" + auto_pad + "'");
  }
  node.attrs.erase("auto_pad");
  node.attrs["strides"] = ints_attribute(strides);
  node.attrs["dilations"] = ints_attribute(dil);
  node.attrs["pads"] = ints_attribute(pads);
  node.attrs["kernel_shape"] = ints_attribute(kernel);
}

Attribute ints_attribute(std::vector<std::int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::ints;
  a.ints = std::move(v);
  return a;
}

Attribute float_attribute(float v) {
  Attribute a;
  a.kind = Attribute::Kind::f;
  a.f = v;
  return a;
}

Attribute int_attribute(std::int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::i;
  a.i = v;
  return a;
}

const Tensor& need_constant(const Node& node, const std::vector<const Tensor*>& c, std::size_t k,
                            const char* what) {
  if (k >= c.size() || c[k] == nullptr)
    bad(node,
        fmt::format("input {} ({}) must be a constant: kdflow runs at a fixed shape", k, what));
  return *c[k];
}

bool has_input(const Node& node, std::size_t k) {
  return k < node.inputs.size() && !node.inputs[k].empty();
}

std::vector<InferredOutput> same_shape(Node&, const InferArgs& a) {
  return {{a.in[0], a.types[0]}};
}

} // namespace kdflow::teacher
