// Matrix products (Gemm, MatMul): oneDNN's inner product where B is a constant (the weights,
// reordered once; alpha, beta and transB folded into them), its matmul where B is computed.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

std::vector<InferredOutput> infer_gemm(Node& node, const InferArgs& a) {
  const auto& in = a.in;
  const bool ta = node.int_attr("transA", 0) != 0, tb = node.int_attr("transB", 0) != 0;
  if (in[0].size() != 2 || in[1].size() != 2) bad(node, "A and B must be matrices");
  const std::int64_t m = ta ? in[0][1] : in[0][0], k = ta ? in[0][0] : in[0][1];
  const std::int64_t kb = tb ? in[1][1] : in[1][0], n = tb ? in[1][0] : in[1][1];
  if (k != kb)
    bad(node,
        fmt::format("A {} and B {} do not multiply", format_shape(in[0]), format_shape(in[1])));
  if (has_input(node, 2)) (void)broadcast(node, in[2], {m, n});
  node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 1));
  node.attrs["beta"] = float_attribute(node.float_attr("beta", 1));
  node.attrs["transA"] = int_attribute(ta);
  node.attrs["transB"] = int_attribute(tb);
  return {{{m, n}, ElemType::f32}};
}

std::vector<InferredOutput> infer_matmul(Node& node, const InferArgs& args) {
  const Shape &a = args.in[0], &b = args.in[1];
  if (a.size() < 2 || b.size() < 2) bad(node, "1-D MatMul operands are not supported");
  if (a.back() != b[b.size() - 2])
    bad(node, fmt::format("{} and {} do not multiply", format_shape(a), format_shape(b)));
  Shape batch = broadcast(node, Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  batch.push_back(a[a.size() - 2]);
  batch.push_back(b.back());
  return {{batch, ElemType::f32}};
}

// Both ops: batched (MatMul) products, with Gemm's transposes, alpha and beta * C. MatMul has none
// of Gemm's attributes nor C (the ONNX checker refuses them): their defaults make it a MatMul.
std::vector<Tensor> evaluate_product(const Node& node, const std::vector<const Tensor*>& x,
                                     const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const Tensor& a = *x[0];
  const Tensor& b = *x[1];
  const bool ta = node.int_attr("transA", 0), tb = node.int_attr("transB", 0);
  const float alpha = node.float_attr("alpha", 1), beta = node.float_attr("beta", 1);
  const std::int64_t m = os[os.size() - 2], n = os.back();
  const std::int64_t k = ta ? a.shape[a.shape.size() - 2] : a.shape.back();
  const Shape batch(os.begin(), os.end() - 2);
  const Shape abatch(a.shape.begin(), a.shape.end() - 2),
      bbatch(b.shape.begin(), b.shape.end() - 2);
  const Shape sa = broadcast_strides(abatch, batch), sb = broadcast_strides(bbatch, batch);
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  Shape cstr;
  if (x.size() > 2 && x[2]) cstr = broadcast_strides(x[2]->shape, {m, n});
  std::int64_t bi = 0;
  for_each_index(batch, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
    std::int64_t oa = 0, ob = 0;
    for (std::size_t dd = 0; dd < idx.size(); ++dd) {
      oa += idx[dd] * sa[dd];
      ob += idx[dd] * sb[dd];
    }
    oa *= m * k;
    ob *= k * n;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t q = 0; q < k; ++q) {
          const double av = a.f[static_cast<std::size_t>(oa + (ta ? q * m + i : i * k + q))];
          const double bv = b.f[static_cast<std::size_t>(ob + (tb ? j * k + q : q * n + j))];
          acc += av * bv;
        }
        double v = alpha * acc;
        if (!cstr.empty()) v += beta * x[2]->f[static_cast<std::size_t>(i * cstr[0] + j * cstr[1])];
        r[static_cast<std::size_t>(bi * m * n + i * n + j)] = static_cast<float>(v);
      }
    ++bi;
  });
  return {Tensor::floats(os, std::move(r))};
}

// MatMul with a computed B (or A of rank above 2): oneDNN's matmul on plain operands, broadcast by
// rank.
void matmul(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const Shape& os = g.shape(node.outputs[0]);
  const auto padded = [&](Shape s) {
    while (s.size() < os.size()) s.insert(s.begin(), 1);
    return s;
  };
  const Shape as = padded(g.shape(node.inputs[0])), bs = padded(g.shape(node.inputs[1]));
  const memory::desc a_md = plain(as, act), b_md = plain(bs, act), dst_md = plain(os, act);
  // alpha (a scale fused by the passes): a scale of the weights, which oneDNN's gemm-based
  // matmul passes to the gemm as its alpha at no cost; where the implementation takes no scales,
  // the first post-op (an extra pass over the output), the node's own after it.
  const float alpha = node.float_attr("alpha", 1);
  dnnl::primitive_attr attr = plan.attr_with(node);
  if (alpha != 1) attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
  bool scaled = alpha != 1;
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(plan.eng(), a_md, b_md, dst_md, attr);
  } catch (const dnnl::error&) {
    if (!scaled) throw;
    scaled = false;
    pd = dnnl::matmul::primitive_desc(plan.eng(), a_md, b_md, dst_md, plan.attr_with(node, alpha));
  }
  const auto operand = [&](const std::string& v, const memory::desc& md, const Shape& shape) {
    if (g.is_constant(v)) return plan.constant(v, shape, md);
    const ArgRef r = plan.get_plain(v, act);
    return ArgRef{r.kind, r.index, r.offset, md};
  };
  const ArgRef a = operand(node.inputs[0], a_md, as), b = operand(node.inputs[1], b_md, bs);
  const ArgRef dst = plan.new_buffer(dst_md);
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, dst}};
  if (scaled) {
    const memory::desc one({1}, dt::f32, memory::format_tag::a);
    args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, plan.weight({alpha}, one, one));
  }
  plan.add_primitive(dnnl::matmul(pd), std::move(args), node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// A constant B: the weights of an inner product (B^T, scaled by alpha), beta * C its bias (Gemm's
// attributes and C at their defaults for MatMul, as in evaluate_product).
void inner_product(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  if (node.int_attr("transA", 0))
    plan.fail(node, "transA = 1 on a computed input is not supported");
  const Shape& as = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const Tensor& b = g.constants.at(node.inputs[1]);
  if (as.size() != 2) return matmul(plan, node);
  const std::int64_t k = as[1], n = os[1];
  const bool tb = node.int_attr("transB", 0);
  const float alpha = node.float_attr("alpha", 1), beta = node.float_attr("beta", 1);
  std::vector<float> w(static_cast<std::size_t>(n * k)); // [n, k] = B^T unless transB
  for (std::int64_t o = 0; o < n; ++o)
    for (std::int64_t q = 0; q < k; ++q)
      w[static_cast<std::size_t>(o * k + q)] =
          alpha * b.f[static_cast<std::size_t>(tb ? o * k + q : q * n + o)];
  // Fed by a Flatten of a 4-D tensor: read that tensor in whatever layout it has.
  std::string src_value = node.inputs[0];
  Shape src_shape = as;
  if (const std::string* flat = plan.flat_source(node)) {
    src_value = *flat;
    src_shape = g.shape(src_value);
  }
  memory::dims wdims = src_shape.size() == 4
                           ? memory::dims{n, src_shape[1], src_shape[2], src_shape[3]}
                           : memory::dims{n, k};
  const memory::desc w_user(
      wdims, dt::f32, src_shape.size() == 4 ? memory::format_tag::oihw : memory::format_tag::oi);
  std::optional<std::vector<float>> bias;
  if (has_input(node, 2)) {
    if (!g.is_constant(node.inputs[2])) plan.fail(node, "C must be constant");
    const Tensor& c = g.constants.at(node.inputs[2]);
    if (c.size() != n && c.size() != 1)
      plan.fail(node, fmt::format("C of shape {} is not a per-output bias", format_shape(c.shape)));
    bias = std::vector<float>(static_cast<std::size_t>(n));
    for (std::int64_t o = 0; o < n; ++o)
      (*bias)[static_cast<std::size_t>(o)] = beta * static_cast<float>(c.at(c.size() == 1 ? 0 : o));
  }
  const memory::desc bias_md({n}, dt::f32, memory::format_tag::a);
  // The classifier head that writes the logits runs in fp32 even under bf16: it is a tiny share
  // of the work and keeps the logits' rounding to the rest of the network.
  const dt type = g.is_output(node.outputs[0]) ? dt::f32 : plan.act();
  const memory::desc any_src(dims_of(src_shape), type, memory::format_tag::any);
  const memory::desc any_w(wdims, type, memory::format_tag::any);
  const memory::desc any_dst({os[0], n}, type, memory::format_tag::any);
  const auto attr = plan.attr_with(node);
  const auto pd =
      bias ? dnnl::inner_product_forward::primitive_desc(plan.eng(),
                                                         dnnl::prop_kind::forward_inference,
                                                         any_src, any_w, bias_md, any_dst, attr)
           : dnnl::inner_product_forward::primitive_desc(
                 plan.eng(), dnnl::prop_kind::forward_inference, any_src, any_w, any_dst, attr);
  const ArgRef src = plan.get(src_value, pd.src_desc());
  const ArgRef wref = plan.weight(std::move(w), w_user, pd.weights_desc());
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wref}, {DNNL_ARG_DST, dst}};
  if (bias) args.emplace_back(DNNL_ARG_BIAS, plan.weight(std::move(*bias), bias_md, bias_md));
  plan.add_primitive(dnnl::inner_product_forward(pd), std::move(args), node.describe(),
                     pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

void lower_gemm(Lowering& plan, const Node& node) {
  if (!plan.graph().is_constant(node.inputs[1]))
    plan.fail(node, "Gemm with a computed B is not supported");
  inner_product(plan, node);
}

void lower_matmul(Lowering& plan, const Node& node) {
  if (plan.graph().is_constant(node.inputs[1])) return inner_product(plan, node);
  matmul(plan, node);
}

// The activation after a product joins it (oneDNN's inner product or matmul post-op).
PostOps product_post_ops(const Graph&, const Node&) { return PostOps::eltwise; }

double product_flops(const Graph& g, const Node& node) {
  const Shape& out = g.shape(node.outputs[0]);
  const Shape& a = g.shape(node.inputs[0]);
  const std::int64_t k = node.int_attr("transA", 0) ? a[0] : a.back();
  return 2.0 * static_cast<double>(numel(out)) * static_cast<double>(k) /
         static_cast<double>(g.batch);
}

constexpr OpDef kOps[] = {
    {.name = "Gemm",
     .min_inputs = 2,
     .infer = infer_gemm,
     .evaluate = evaluate_product,
     .lower = lower_gemm,
     .post_ops = product_post_ops,
     .flops_per_sample = product_flops},
    {.name = "MatMul",
     .min_inputs = 2,
     .infer = infer_matmul,
     .evaluate = evaluate_product,
     .lower = lower_matmul,
     .post_ops = product_post_ops,
     .flops_per_sample = product_flops},
};

} // namespace

std::span<const OpDef> gemm_ops() { return kOps; }

} // namespace kdflow::teacher
