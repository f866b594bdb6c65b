// Softmax (oneDNN's accurate softmax). Before opset 13 it normalizes over all axes from `axis` on
// (the input coerced to 2-D); since, over `axis` alone.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <cmath>
#include <limits>

namespace kdflow::teacher {
namespace {

std::vector<InferredOutput> infer_softmax(Node& node, const InferArgs& a) {
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  const std::int64_t axis = norm_axis(node, node.int_attr("axis", a.opset < 13 ? 1 : -1), rank);
  node.attrs["axis"] = int_attribute(axis);
  node.attrs["coerce_2d"] = int_attribute(a.opset < 13 ? 1 : 0);
  return {{a.in[0], ElemType::f32}};
}

std::vector<Tensor> evaluate_softmax(const Node& node, const std::vector<const Tensor*>& x,
                                     const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const auto axis = static_cast<std::size_t>(node.int_attr("axis", 1));
  const bool coerce = node.int_attr("coerce_2d", 0) != 0;
  std::int64_t outer = 1, len = 1, inner = 1;
  for (std::size_t dd = 0; dd < xs.size(); ++dd) {
    if (dd < axis)
      outer *= xs[dd];
    else if (dd == axis || coerce)
      len *= xs[dd];
    else
      inner *= xs[dd];
  }
  std::vector<float> r(x[0]->f.size());
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::int64_t in = 0; in < inner; ++in) {
      const auto at = [&](std::int64_t q) {
        return static_cast<std::size_t>((o * len + q) * inner + in);
      };
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (std::int64_t q = 0; q < len; ++q) mx = std::max<double>(mx, x[0]->f[at(q)]);
      for (std::int64_t q = 0; q < len; ++q) sum += std::exp(x[0]->f[at(q)] - mx);
      for (std::int64_t q = 0; q < len; ++q)
        r[at(q)] = static_cast<float>(std::exp(x[0]->f[at(q)] - mx) / sum);
    }
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

void lower_softmax(Lowering& plan, const Node& node) {
  const Shape& xs = plan.graph().shape(node.inputs[0]);
  auto axis = static_cast<int>(node.int_attr("axis", 1));
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  ArgRef src = plan.get_plain(node.inputs[0], type);
  if (node.int_attr("coerce_2d", 0) && static_cast<std::size_t>(axis) + 1 < xs.size()) {
    std::int64_t outer = 1, inner = 1;
    for (std::size_t d = 0; d < xs.size(); ++d)
      (d < static_cast<std::size_t>(axis) ? outer : inner) *= xs[d];
    src.md = plain({outer, inner}, type);
    axis = 1;
  }
  const auto pd = dnnl::softmax_forward::primitive_desc(
      plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::softmax_accurate, src.md,
      src.md, axis, Lowering::plain_attr());
  const ArgRef dst = plan.new_buffer(src.md);
  plan.add_primitive(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                     node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], ArgRef{dst.kind, dst.index, dst.offset, plain(xs, type)});
}

constexpr OpDef kOps[] = {
    {.name = "Softmax",
     .float_inputs = 1,
     .infer = infer_softmax,
     .evaluate = evaluate_softmax,
     .lower = lower_softmax},
};

} // namespace

std::span<const OpDef> softmax_ops() { return kOps; }

} // namespace kdflow::teacher
