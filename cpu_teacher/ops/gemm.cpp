// Matrix products (Gemm, MatMul, Einsum): oneDNN's inner product where B is a constant (the
// weights, reordered once; alpha, beta and transB folded into them), its matmul where B is
// computed.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <tuple>

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

// MatMul with a computed B (or A of rank above 2): oneDNN's matmul, broadcast by rank. Its computed
// operands are read in place where they lie strided (attention's Q, K and V, views of one
// projection's output, K transposed): the "strided" way, offered where oneDNN takes those strides
// with a kernel of its own; else, and in the "plain" way, each is copied out plain first.
void matmul(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const Shape& os = g.shape(node.outputs[0]);
  const auto padded = [&](Shape s) {
    while (s.size() < os.size()) s.insert(s.begin(), 1);
    return s;
  };
  const Shape as = padded(g.shape(node.inputs[0])), bs = padded(g.shape(node.inputs[1]));
  const memory::desc dst_md = plain(os, plan.type_of(node.outputs[0]));
  // Where a Transpose alone reads the product (attention's heads put back beside each other
  // before the output projection), the product is written in the layout that Transpose's output
  // lies plain in: the Transpose is then its buffer, and no reorder copies it (lower_transpose).
  // Only where oneDNN runs that layout with the same kernel as the plain one (below).
  const std::optional<memory::desc> transposed_md = [&]() -> std::optional<memory::desc> {
    const std::string& out = node.outputs[0];
    const std::vector<std::size_t> readers = g.consumers(out);
    if (g.is_output(out) || plan.is_feature(out) || readers.size() != 1) return std::nullopt;
    const Node& reader = g.nodes[readers[0]];
    if (reader.op != "Transpose" || reader.inputs[0] != out || !reader.post_ops.empty())
      return std::nullopt;
    const std::vector<std::int64_t> perm = reader.ints_attr("perm");
    if (perm.size() != os.size()) return std::nullopt;
    // The Transpose's output plain, its axes put back in the product's order (the inverse of
    // lower_transpose's check).
    Shape seen(os.size());
    for (std::size_t k = 0; k < perm.size(); ++k) seen[k] = os[static_cast<std::size_t>(perm[k])];
    const memory::desc md = plain(seen, dst_md.get_data_type())
                                .permute_axes(std::vector<int>(perm.begin(), perm.end()));
    if (md == dst_md) return std::nullopt;
    return md;
  }();
  // alpha (a scale fused by the passes): a scale of the weights, which oneDNN's gemm-based
  // matmul passes to the gemm as its alpha at no cost; where the implementation takes no scales,
  // the first post-op (an extra pass over the output), the node's own after it.
  const float alpha = node.float_attr("alpha", 1);
  struct Made {
    dnnl::matmul::primitive_desc pd;
    bool scaled;
  };
  const auto make_into = [&](const memory::desc& a_md, const memory::desc& b_md,
                             const memory::desc& d_md) {
    if (alpha != 1) {
      dnnl::primitive_attr attr = plan.attr_with(node);
      attr.set_scales_mask(DNNL_ARG_WEIGHTS, 0);
      try {
        return Made{dnnl::matmul::primitive_desc(plan.eng(), a_md, b_md, d_md, attr), true};
      } catch (const dnnl::error&) {
      }
    }
    return Made{
        dnnl::matmul::primitive_desc(plan.eng(), a_md, b_md, d_md, plan.attr_with(node, alpha)),
        false};
  };
  // Into the transposed layout where oneDNN takes it with the plain layout's kernel.
  const auto make = [&](const memory::desc& a_md, const memory::desc& b_md) {
    Made made = make_into(a_md, b_md, dst_md);
    if (transposed_md) try {
        Made t = make_into(a_md, b_md, *transposed_md);
        if (t.pd.impl_info_str() == made.pd.impl_info_str() && t.scaled == made.scaled) return t;
      } catch (const dnnl::error&) {
      }
    return made;
  };
  // A computed operand read in place, its rank padded by axes of one element; nullopt where it
  // is a buffer lying plain already (nothing to save) or does not lie strided in act(). (A view
  // whose fine axes nest into the plain layout is read in place too: get_plain copies it.)
  const auto in_place = [&](const std::string& v, const Shape& shape) -> std::optional<ArgRef> {
    if (g.is_constant(v)) return std::nullopt;
    std::optional<ArgRef> r = plan.strided(v);
    if (!r || r->md.get_data_type() != act || (!plan.is_view(v) && r->md == plain(g.shape(v), act)))
      return std::nullopt;
    memory::dims strides = r->md.get_strides();
    while (strides.size() < shape.size()) strides.insert(strides.begin(), 1);
    r->md = memory::desc(memory::dims(shape.begin(), shape.end()), act, strides);
    return r;
  };
  const std::optional<ArgRef> sa = in_place(node.inputs[0], as), sb = in_place(node.inputs[1], bs);
  std::optional<Made> strided;
  if (sa || sb) {
    try {
      strided = make(sa ? sa->md : plain(as, act), sb ? sb->md : plain(bs, act));
      if (is_impl(strided->pd.impl_info_str(), "ref")) strided.reset();
    } catch (const dnnl::error&) {
    }
  }
  const bool read_in_place = strided && plan.choose(node, {"strided", "plain"}) == "strided";
  const auto operand = [&](const std::string& v, const Shape& shape,
                           const std::optional<ArgRef>& seen) {
    if (read_in_place && seen) return *seen;
    if (g.is_constant(v)) return plan.constant(v, shape, plain(shape, act));
    const ArgRef r = plan.get_plain(v, act);
    return ArgRef{r.kind, r.index, r.offset, plain(shape, act)};
  };
  const ArgRef a = operand(node.inputs[0], as, sa), b = operand(node.inputs[1], bs, sb);
  const Made made = read_in_place ? *strided : make(a.md, b.md);
  const ArgRef dst = plan.new_buffer(made.pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, dst}};
  if (made.scaled) {
    const memory::desc one({1}, dt::f32, memory::format_tag::a);
    args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, plan.weight({alpha}, one, one));
  }
  const dnnl::matmul::primitive_desc& pd = made.pd;
  plan.add_primitive(dnnl::matmul(pd), std::move(args), node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// The implementation of an inner product worth timing beside the one oneDNN lists first for
// `pd` (whose handle it moves on: pass one of its own): the next that is neither oneDNN's
// reference nor a kernel for another ISA than the first's (its GEMM one, oneDNN's own sgemm at the
// CPU's widest ISA, is kept); "" where there is none. Neither is faster on every shape (on AVX2,
// oneDNN's brgemm kernel and its sgemm trade places with the rows, depth and width), so the tuner
// times both.
std::string second_inner_product_impl(dnnl::inner_product_forward::primitive_desc pd) {
  // The ISA is the name's last field but for the GEMM ones ("brgemm:avx2", "x64:gemm:jit").
  const auto isa_of = [](const std::string& impl) { return impl.substr(impl.rfind(':') + 1); };
  const std::string first = pd.impl_info_str();
  if (is_impl(first, "ref")) return {};
  while (pd.next_impl()) {
    const std::string next = pd.impl_info_str();
    if (next == first || is_impl(next, "ref")) continue;
    if (is_impl(next, "gemm:") || isa_of(next) == isa_of(first)) return next;
  }
  return {};
}

// A constant B: the weights of an inner product (B^T, scaled by alpha), beta * C its bias (Gemm's
// attributes and C at their defaults for MatMul, as in evaluate_product). Two ways where oneDNN
// has a second implementation worth timing: "inner_product", the one it lists first, and
// "inner_product_alternative", that second one (second_inner_product_impl); never the untuned
// plan's way, for the tuner to time.
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
  // int8 (not for the head: quantizable leaves graph outputs alone): weights s8 per output row.
  const auto q = plan.quant_input(node);
  const memory::desc any_src(dims_of(src_shape), q ? q->type : type, memory::format_tag::any);
  const memory::desc any_w(wdims, q ? dt::s8 : type, memory::format_tag::any);
  const auto q_out = plan.quantized_output(node);
  const memory::desc any_dst({os[0], n},
                             q_out                          ? q_out->type
                             : g.is_output(node.outputs[0]) ? dt::f32
                                                            : plan.type_of(node.outputs[0]),
                             memory::format_tag::any);
  auto attr = plan.attr_with(node);
  Lowering::set_quant_masks(attr, q, q_out, 1);
  const auto make_pd = [&] {
    return bias
               ? dnnl::inner_product_forward::primitive_desc(plan.eng(),
                                                             dnnl::prop_kind::forward_inference,
                                                             any_src, any_w, bias_md, any_dst, attr)
               : dnnl::inner_product_forward::primitive_desc(
                     plan.eng(), dnnl::prop_kind::forward_inference, any_src, any_w, any_dst, attr);
  };
  auto pd = make_pd();
  // Two ways where oneDNN has a second implementation worth timing (not for a quantized product:
  // its int8 kernel stays the one oneDNN lists first; in an int8 plan the f32 head may take either,
  // and load_int8's check runs the plan as tuned).
  const std::string second = q || q_out ? std::string() : second_inner_product_impl(make_pd());
  if (!second.empty() && plan.choose(node, {"inner_product", "inner_product_alternative"}) ==
                             "inner_product_alternative")
    walk_to_impl(plan, node, pd, second);
  // The weights quantized for the kernel oneDNN picked, their pairs of inputs known only where the
  // source has two axes (a flattened 4-D one is summed in the order of its layout).
  std::vector<float> w_scales;
  if (q)
    std::tie(w, w_scales) =
        plan.quantize_weights(w, n,
                              src_shape.size() == 2 ? inner_product_weight_quant(pd.impl_info_str())
                                                    : WeightQuant{int8_weight_levels()});
  const ArgRef src =
      q ? plan.get_quantized(src_value, pd.src_desc(), *q) : plan.get(src_value, pd.src_desc());
  const ArgRef wref = plan.weight(std::move(w), w_user, pd.weights_desc());
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wref}, {DNNL_ARG_DST, dst}};
  if (bias) args.emplace_back(DNNL_ARG_BIAS, plan.weight(std::move(*bias), bias_md, bias_md));
  plan.add_quant_scales(args, q, std::move(w_scales), q_out);
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

// --- Einsum --------------------------------------------------------------------------------------
// The contractions attention blocks write (MaxViT's "bghnc,bghmc->bghnm"): one or two operands,
// each label either shared by both operands and the output (a batch axis), by both operands only
// (summed over), or by one operand and the output. Lowered to oneDNN's batched matmul over the
// operands seen as [batch, rows, inner] and [batch, inner, cols]: read through strides where the
// labels' order allows it, else reordered once per batch into that order.

// One label per axis of each operand and of the output, ellipses expanded (into digits, which
// ONNX's letters never are); written by the shape rule as "ab,bc->ac" in `kdflow_labels`.
struct EinsumLabels {
  std::vector<std::string> in;
  std::string out;
};

EinsumLabels parse_einsum(const Node& node, const std::vector<Shape>& shapes) {
  std::string eq;
  for (const char c : node.string_attr("equation", ""))
    if (c != ' ') eq += c;
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms(1);
  for (const char c : lhs) {
    if (c == ',')
      terms.emplace_back();
    else
      terms.back() += c;
  }
  if (terms.size() != shapes.size())
    bad(node, fmt::format("equation '{}' names {} operands, the node has {}", eq, terms.size(),
                          shapes.size()));
  if (shapes.size() > 2) bad(node, "more than two operands are not supported");
  const auto letters = [&](const std::string& t) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 3, "...") == 0) {
        i += 2;
        continue;
      }
      if (!std::isalpha(static_cast<unsigned char>(t[i])))
        bad(node, fmt::format("equation '{}': '{}' is not a label", eq, t[i]));
      ++n;
    }
    return n;
  };
  std::size_t ellipsis = 0; // the widest ellipsis
  for (std::size_t k = 0; k < terms.size(); ++k)
    if (terms[k].find("...") != std::string::npos) {
      const std::size_t n = letters(terms[k]);
      if (shapes[k].size() < n)
        bad(node, fmt::format("equation '{}' does not fit the operands", eq));
      ellipsis = std::max(ellipsis, shapes[k].size() - n);
    }
  if (ellipsis > 10) bad(node, "an ellipsis over more than 10 axes is not supported");
  const auto expand = [&](const std::string& t, std::size_t width) {
    std::string r;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t.compare(i, 3, "...") == 0) {
        for (std::size_t j = ellipsis - width; j < ellipsis; ++j) r += static_cast<char>('0' + j);
        i += 2;
      } else {
        r += t[i];
      }
    }
    return r;
  };
  EinsumLabels r;
  for (std::size_t k = 0; k < terms.size(); ++k) {
    const std::size_t n = letters(terms[k]);
    const bool has = terms[k].find("...") != std::string::npos;
    r.in.push_back(expand(terms[k], has ? shapes[k].size() - n : 0));
    if (r.in.back().size() != shapes[k].size())
      bad(node, fmt::format("equation '{}': operand {} has {} axes, not {}", eq, k,
                            shapes[k].size(), r.in.back().size()));
    for (std::size_t i = 0; i < r.in.back().size(); ++i)
      if (r.in.back().find(r.in.back()[i], i + 1) != std::string::npos)
        bad(node, fmt::format("equation '{}': a label repeated in one operand (a diagonal) is "
                              "not supported",
                              eq));
  }
  if (arrow != std::string::npos) {
    const std::string rhs = eq.substr(arrow + 2);
    (void)letters(rhs);
    r.out = expand(rhs, ellipsis);
  } else { // implicit: the ellipsis, then the labels used once, in alphabetical order
    r.out = expand(ellipsis > 0 ? "..." : "", ellipsis);
    std::string once;
    for (const std::string& t : r.in)
      for (const char c : t)
        if (!std::isdigit(static_cast<unsigned char>(c)) &&
            std::count(r.in[0].begin(), r.in[0].end(), c) +
                    (r.in.size() > 1 ? std::count(r.in[1].begin(), r.in[1].end(), c) : 0) ==
                1)
          once += c;
    std::sort(once.begin(), once.end());
    r.out += once;
  }
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (r.out.find(r.out[i], i + 1) != std::string::npos)
      bad(node, fmt::format("equation '{}': output label '{}' repeated", eq, r.out[i]));
    if (std::none_of(r.in.begin(), r.in.end(),
                     [&](const std::string& t) { return t.find(r.out[i]) != std::string::npos; }))
      bad(node, fmt::format("equation '{}': output label '{}' is in no operand", eq, r.out[i]));
  }
  for (std::size_t k = 0; k < r.in.size(); ++k)
    for (const char c : r.in[k]) {
      const bool other = r.in.size() > 1 && r.in[1 - k].find(c) != std::string::npos;
      if (!other && r.out.find(c) == std::string::npos)
        bad(node, fmt::format("equation '{}': summing label '{}' of one operand only is not "
                              "supported",
                              eq, c));
    }
  return r;
}

EinsumLabels stored_labels(const Node& node) {
  const std::string s = node.string_attr("kdflow_labels", "");
  EinsumLabels r;
  const auto arrow = s.find("->");
  const std::string lhs = s.substr(0, arrow);
  r.in.emplace_back();
  for (const char c : lhs) {
    if (c == ',')
      r.in.emplace_back();
    else
      r.in.back() += c;
  }
  r.out = s.substr(arrow + 2);
  return r;
}

// Each label's extent.
std::map<char, std::int64_t> label_sizes(const Node& node, const EinsumLabels& l,
                                         const std::vector<Shape>& shapes) {
  std::map<char, std::int64_t> size;
  for (std::size_t k = 0; k < l.in.size(); ++k)
    for (std::size_t i = 0; i < l.in[k].size(); ++i) {
      const auto [it, fresh] = size.emplace(l.in[k][i], shapes[k][i]);
      if (!fresh && it->second != shapes[k][i])
        bad(node, fmt::format("label '{}' is {} in one operand and {} in another (broadcasting "
                              "is not supported)",
                              l.in[k][i], it->second, shapes[k][i]));
    }
  return size;
}

std::vector<InferredOutput> infer_einsum(Node& node, const InferArgs& a) {
  const EinsumLabels l = parse_einsum(node, a.in);
  const auto size = label_sizes(node, l, a.in);
  Shape out;
  for (const char c : l.out) out.push_back(size.at(c));
  std::string stored = l.in[0];
  if (l.in.size() > 1) stored += "," + l.in[1];
  node.attrs["kdflow_labels"].kind = Attribute::Kind::s;
  node.attrs["kdflow_labels"].s = stored + "->" + l.out;
  return {{out, ElemType::f32}};
}

// Strides of `labels`' axes (a plain tensor) by label.
std::map<char, std::int64_t> label_strides(const std::string& labels, const Shape& shape) {
  const Shape st = strides_of(shape);
  std::map<char, std::int64_t> r;
  for (std::size_t i = 0; i < labels.size(); ++i) r[labels[i]] = st[i];
  return r;
}

std::vector<Tensor> evaluate_einsum(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const EinsumLabels l = stored_labels(node);
  std::vector<Shape> shapes;
  for (const Tensor* t : x) shapes.push_back(t->shape);
  const auto size = label_sizes(node, l, shapes);
  std::string all = l.out; // output labels, then the summed ones
  for (const std::string& t : l.in)
    for (const char c : t)
      if (all.find(c) == std::string::npos) all += c;
  Shape extent;
  for (const char c : all) extent.push_back(size.at(c));
  std::vector<std::map<char, std::int64_t>> st;
  for (std::size_t k = 0; k < x.size(); ++k) st.push_back(label_strides(l.in[k], shapes[k]));
  const std::int64_t summed =
      numel(Shape(extent.begin() + static_cast<std::ptrdiff_t>(l.out.size()), extent.end()));
  std::vector<double> acc(static_cast<std::size_t>(numel(outs[0].shape)), 0.0);
  for_each_index(extent, [&](std::int64_t flat, const std::vector<std::int64_t>& idx) {
    double v = 1;
    for (std::size_t k = 0; k < x.size(); ++k) {
      std::int64_t off = 0;
      for (std::size_t i = 0; i < all.size(); ++i)
        if (const auto it = st[k].find(all[i]); it != st[k].end()) off += idx[i] * it->second;
      v *= x[k]->f[static_cast<std::size_t>(off)];
    }
    acc[static_cast<std::size_t>(flat / summed)] += v;
  });
  return {Tensor::floats(outs[0].shape, std::vector<float>(acc.begin(), acc.end()))};
}

// `value` (labels `have`, plain) seen with its axes in the order `want`: each run of labels in
// `groups` merged into one axis when its strides allow, else nullopt.
std::optional<memory::desc> grouped_view(const memory::desc& plain_md, const std::string& have,
                                         const std::vector<std::string>& groups,
                                         const std::map<char, std::int64_t>& size) {
  const memory::dims pst = plain_md.get_strides();
  memory::dims dims, strides;
  for (const std::string& grp : groups) {
    std::int64_t n = 1, stride = 1;
    for (std::size_t i = grp.size(); i-- > 0;) {
      const std::int64_t s = pst[have.find(grp[i])];
      if (i + 1 < grp.size() && s != stride * n) return std::nullopt;
      if (i + 1 == grp.size()) stride = s;
      n *= size.at(grp[i]);
    }
    dims.push_back(n);
    strides.push_back(stride);
  }
  return memory::desc(dims, plain_md.get_data_type(), strides);
}

void lower_einsum(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const EinsumLabels l = stored_labels(node);
  std::vector<Shape> shapes;
  for (const std::string& v : node.inputs) shapes.push_back(g.shape(v));
  const auto size = label_sizes(node, l, shapes);
  const auto operand = [&](std::size_t k) {
    const std::string& v = node.inputs[k];
    return g.is_constant(v) ? plan.constant(v, shapes[k], plain(shapes[k], act))
                            : plan.get_plain(v, act);
  };
  // `have` (a plain tensor in `src`) written in the order of `want`'s labels, a new buffer.
  const auto permuted = [&](const ArgRef& src, const std::string& have, const std::string& want) {
    std::vector<int> perm(have.size());
    Shape shape;
    for (std::size_t i = 0; i < have.size(); ++i) perm[i] = static_cast<int>(want.find(have[i]));
    for (const char c : want) shape.push_back(size.at(c));
    const ArgRef dst = plan.new_buffer(plain(shape, act));
    plan.add_reorder(ArgRef{src.kind, src.index, src.offset, src.md.permute_axes(perm)}, dst,
                     node.describe());
    return dst;
  };
  const Shape& os = g.shape(node.outputs[0]);
  if (l.in.size() == 1) { // a permutation
    plan.set(node.outputs[0], permuted(operand(0), l.in[0], l.out));
    return;
  }
  std::string batch, rows, cols, inner;
  for (const char c : l.out) {
    const bool in_a = l.in[0].find(c) != std::string::npos;
    const bool in_b = l.in[1].find(c) != std::string::npos;
    (in_a && in_b ? batch : in_a ? rows : cols) += c;
  }
  for (const char c : l.in[0])
    if (l.out.find(c) == std::string::npos) inner += c;
  const auto extent = [&](const std::string& labels) {
    std::int64_t n = 1;
    for (const char c : labels) n *= size.at(c);
    return n;
  };
  const memory::desc a3 = plain({extent(batch), extent(rows), extent(inner)}, act);
  const memory::desc b3 = plain({extent(batch), extent(inner), extent(cols)}, act);
  const memory::desc d3 = plain({extent(batch), extent(rows), extent(cols)}, act);
  ArgRef a = operand(0), b = operand(1);
  const auto va = grouped_view(a.md, l.in[0], {batch, rows, inner}, size);
  const auto vb = grouped_view(b.md, l.in[1], {batch, inner, cols}, size);
  dnnl::matmul::primitive_desc pd;
  bool strided = va && vb;
  if (strided) {
    try {
      pd = dnnl::matmul::primitive_desc(plan.eng(), *va, *vb, d3, Lowering::plain_attr());
      a.md = *va;
      b.md = *vb;
    } catch (const dnnl::error&) {
      strided = false;
    }
  }
  if (!strided) {
    a = permuted(a, l.in[0], batch + rows + inner);
    b = permuted(b, l.in[1], batch + inner + cols);
    a.md = a3;
    b.md = b3;
    pd = dnnl::matmul::primitive_desc(plan.eng(), a3, b3, d3, Lowering::plain_attr());
  }
  const std::string product = batch + rows + cols;
  Shape ps;
  for (const char c : product) ps.push_back(size.at(c));
  ArgRef dst = plan.new_buffer(plain(ps, act));
  plan.add_primitive(dnnl::matmul(pd),
                     {{DNNL_ARG_SRC, a},
                      {DNNL_ARG_WEIGHTS, b},
                      {DNNL_ARG_DST, ArgRef{dst.kind, dst.index, dst.offset, d3}}},
                     node.describe(), pd.scratchpad_desc());
  if (product != l.out) dst = permuted(dst, product, l.out);
  dst.md = plain(os, act);
  plan.set(node.outputs[0], dst);
}

double einsum_flops(const Graph& g, const Node& node) {
  const EinsumLabels l = stored_labels(node);
  std::vector<Shape> shapes;
  for (const std::string& v : node.inputs) shapes.push_back(g.shape(v));
  double n = 2;
  for (const auto& [label, extent] : label_sizes(node, l, shapes)) n *= static_cast<double>(extent);
  return n / static_cast<double>(g.batch);
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
     .float_inputs = 3,
     .infer = infer_gemm,
     .evaluate = evaluate_product,
     .lower = lower_gemm,
     .post_ops = product_post_ops,
     .flops_per_sample = product_flops},
    {.name = "Einsum",
     .float_inputs = 2,
     .infer = infer_einsum,
     .evaluate = evaluate_einsum,
     .lower = lower_einsum,
     .flops_per_sample = einsum_flops},
    {.name = "MatMul",
     .min_inputs = 2,
     .float_inputs = 2,
     .infer = infer_matmul,
     .evaluate = evaluate_product,
     .lower = lower_matmul,
     .post_ops = product_post_ops,
     .flops_per_sample = product_flops},
};

} // namespace

std::span<const OpDef> gemm_ops() { return kOps; }

} // namespace kdflow::teacher
