// 2-D convolution (oneDNN's direct convolution in one of two layouts, or one inner product: the
// kernel unrolled over a tiny map, or pointwise on channels-last tensors; the tuner picks) and
// BatchNormalization, which the passes fold into the convolution before it or turn into a
// depthwise one: the engine never runs it on its own.
#include "common.hpp"
#include "im2col.hpp"
#include "lowering.hpp"
#include "op_table.hpp"
#include "winograd.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

// --- Conv ----------------------------------------------------------------------------------------

std::vector<InferredOutput> infer_conv(Node& node, const InferArgs& a) {
  const Shape& x = a.in[0];
  const Shape& w = a.in[1];
  if (w.size() != 4) bad(node, "only 2-D convolutions are supported");
  normalize_window(node, x, {w[2], w[3]});
  const std::int64_t group = node.int_attr("group", 1);
  if (group < 1 || x[1] != w[1] * group || w[0] % group != 0)
    bad(node, fmt::format("input {} and weights {} do not match group {}", format_shape(x),
                          format_shape(w), group));
  if (has_input(node, 2) && numel(a.in[2]) != w[0])
    bad(node, "bias size differs from output channels");
  node.attrs["group"] = int_attribute(group);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  Shape out = {x[0], w[0], out_extent(x[2], w[2], s[0], d[0], p[0], p[2], false),
               out_extent(x[3], w[3], s[1], d[1], p[1], p[3], false)};
  if (out[2] <= 0 || out[3] <= 0) bad(node, "output would be empty");
  return {{out, ElemType::f32}};
}

std::vector<Tensor> evaluate_conv(const Node& node, const std::vector<const Tensor*>& x,
                                  const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const Shape& xs = x[0]->shape;
  const Shape& ws = x[1]->shape;
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  const std::int64_t g = node.int_attr("group", 1);
  const std::int64_t icg = ws[1], ocg = ws[0] / g;
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  for (std::int64_t n = 0; n < os[0]; ++n)
    for (std::int64_t oc = 0; oc < os[1]; ++oc) {
      const std::int64_t grp = oc / ocg;
      const float bias = x.size() > 2 && x[2] ? x[2]->f[static_cast<std::size_t>(oc)] : 0.f;
      for (std::int64_t oy = 0; oy < os[2]; ++oy)
        for (std::int64_t ox = 0; ox < os[3]; ++ox) {
          double acc = bias;
          for (std::int64_t ic = 0; ic < icg; ++ic)
            for (std::int64_t ky = 0; ky < ws[2]; ++ky) {
              const std::int64_t iy = oy * s[0] - p[0] + ky * d[0];
              if (iy < 0 || iy >= xs[2]) continue;
              for (std::int64_t kx = 0; kx < ws[3]; ++kx) {
                const std::int64_t ix = ox * s[1] - p[1] + kx * d[1];
                if (ix < 0 || ix >= xs[3]) continue;
                acc +=
                    double(x[0]->f[static_cast<std::size_t>(
                        ((n * xs[1] + grp * icg + ic) * xs[2] + iy) * xs[3] + ix)]) *
                    x[1]->f[static_cast<std::size_t>(((oc * icg + ic) * ws[2] + ky) * ws[3] + kx)];
              }
            }
          r[static_cast<std::size_t>(((n * os[1] + oc) * os[2] + oy) * os[3] + ox)] =
              static_cast<float>(acc);
        }
    }
  return {Tensor::floats(os, std::move(r))};
}

// Input positions an output position of one axis reads (valid taps), summed over the outputs.
std::int64_t axis_pairs(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                        std::int64_t dilation, std::int64_t pad_begin) {
  std::int64_t pairs = 0;
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t k = 0; k < kernel; ++k) {
      const std::int64_t i = o * stride - pad_begin + k * dilation;
      pairs += i >= 0 && i < in;
    }
  return pairs;
}

// How much more work a convolution does unrolled into one matrix product (see unrolled) than its
// valid taps, or nullopt where it cannot be unrolled: grouped, or a matrix over 64 MiB.
std::optional<double> unroll_overhead(const Graph& g, const Node& node) {
  if (node.int_attr("group", 1) != 1 || !g.is_constant(node.inputs[1])) return std::nullopt;
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const Shape& ws = g.shape(node.inputs[1]);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  const std::int64_t dense = os[2] * xs[2] * os[3] * xs[3];
  const std::int64_t valid = axis_pairs(xs[2], os[2], ws[2], s[0], d[0], p[0]) *
                             axis_pairs(xs[3], os[3], ws[3], s[1], d[1], p[1]);
  const std::int64_t rows = os[1] * os[2] * os[3], cols = xs[1] * xs[2] * xs[3];
  if (valid == 0 || rows * cols > (std::int64_t{16} << 20)) return std::nullopt;
  return static_cast<double>(dense) / static_cast<double>(valid);
}

// The convolution on a tiny map as one matrix product: the kernel unrolled over the map's
// positions (OC*OH*OW x C*IH*IW, channels fastest, so that channels-last tensors are its rows as
// they lie in memory), and the bias repeated per position.
std::pair<std::vector<float>, std::vector<float>> unrolled(const Graph& g, const Node& node) {
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const Tensor& w = g.constants.at(node.inputs[1]);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             pads = node.ints_attr("pads");
  const std::int64_t oc_n = os[1], c_n = xs[1];
  const std::int64_t rows = oc_n * os[2] * os[3], cols = c_n * xs[2] * xs[3];
  std::vector<float> m(static_cast<std::size_t>(rows * cols), 0.f);
  for (std::int64_t oh = 0; oh < os[2]; ++oh)
    for (std::int64_t ow = 0; ow < os[3]; ++ow)
      for (std::int64_t kh = 0; kh < w.shape[2]; ++kh)
        for (std::int64_t kw = 0; kw < w.shape[3]; ++kw) {
          const std::int64_t ih = oh * s[0] - pads[0] + kh * d[0];
          const std::int64_t iw = ow * s[1] - pads[1] + kw * d[1];
          if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
          for (std::int64_t oc = 0; oc < oc_n; ++oc) {
            const std::int64_t row = (oh * os[3] + ow) * oc_n + oc;
            for (std::int64_t c = 0; c < c_n; ++c)
              m[static_cast<std::size_t>(row * cols + (ih * xs[3] + iw) * c_n + c)] +=
                  w.f[static_cast<std::size_t>(((oc * c_n + c) * w.shape[2] + kh) * w.shape[3] +
                                               kw)];
          }
        }
  std::vector<float> bias;
  if (node.inputs.size() > 2 && !node.inputs[2].empty()) {
    const auto& b = g.constants.at(node.inputs[2]).f;
    bias.resize(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r)
      bias[static_cast<std::size_t>(r)] = b[static_cast<std::size_t>(r % oc_n)];
  }
  return {std::move(m), std::move(bias)};
}

// A pointwise convolution (1x1, stride 1, no padding, one group) reading a channels-last tensor
// that its residual operand, if any, shares: with channels-last input and output every pixel of
// the batch is a row of one matrix product.
bool pointwise_on_channels_last(const Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  if (node.int_attr("group", 1) != 1) return false;
  const Shape& ws = g.shape(node.inputs[1]);
  if (ws.size() != 4 || ws[2] != 1 || ws[3] != 1) return false;
  for (const auto v : node.ints_attr("strides"))
    if (v != 1) return false;
  for (const auto v : node.ints_attr("pads"))
    if (v != 0) return false;
  const auto last = [&](const std::string& value) {
    const memory::desc& md = plan.view_at(value).md;
    return md ==
           memory::desc(dims_of(g.shape(value)), md.get_data_type(), memory::format_tag::acdb);
  };
  const PostOp* sum = Lowering::sum_post(node);
  return last(node.inputs[0]) && (!sum || last(sum->sum_input));
}

// The sum post-op's scale and type: a residual summand written quantized (the convolution then
// writes quantized too, into the summand's buffer: Lowering::quantized_output) is read at its own
// scale, in its own type (s8 under a u8 output: a shortcut without a Relu summed before one).
struct Summand {
  float scale = 1.f;
  dt type = dt::undef;
};
Summand summand_quant(const Lowering& plan, const Node& node,
                      const std::optional<Lowering::Quant>& q_out) {
  const PostOp* sum = Lowering::sum_post(node);
  if (sum == nullptr || !q_out) return {};
  const auto stored = plan.stored_quant(sum->sum_input);
  if (!stored || memory::data_type_size(stored->type) != memory::data_type_size(q_out->type))
    throw std::logic_error("teacher plan: a quantized residual sum into an f32 summand");
  return {stored->scale, stored->type};
}

// The summand's buffer as the convolution writes it: the same layout in the output's type (of
// the same size).
memory::desc retyped(const memory::desc& md, dt type) {
  if (md.get_data_type() == type) return md;
  using tag = memory::format_tag;
  for (const tag t : {tag::acdb, tag::abcd, tag::aBcd16b, tag::aBcd8b, tag::aBcd4b})
    if (md == memory::desc(md.get_dims(), md.get_data_type(), t)) return {md.get_dims(), type, t};
  if (md == memory::desc(md.get_dims(), md.get_data_type(), md.get_strides()))
    return {md.get_dims(), type, md.get_strides()};
  throw std::logic_error("teacher plan: a quantized residual summand in a layout not retyped");
}

// A convolution run as one inner product over channels-last views of its input and output:
// unrolled (each sample's whole map is one row, the weights OC*OH*OW x C*IH*IW) or pointwise
// (each pixel is a row, the weights OC x C). oneDNN's convolutions block their rows within one
// image's map, so on small maps (2x2: four rows; 1x1: one) their kernels starve, where the inner
// product blocks all rows of the batch at once.
// The inner product such a convolution runs (its rows, types and post-ops), and its shapes.
struct MatrixConv {
  std::int64_t rows, in_cols, out_cols;
  std::optional<Lowering::Quant> q, q_out;
  dt src_type, out;
  Summand summand;
  memory::desc src_row, dst_row, bias_md;
  dnnl::inner_product_forward::primitive_desc pd;
};
MatrixConv matrix_conv_pd(Lowering& plan, const Node& node, bool unroll) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
  const std::int64_t rows = unroll ? xs[0] : xs[0] * xs[2] * xs[3];
  const std::int64_t in_cols = unroll ? xs[1] * xs[2] * xs[3] : xs[1];
  const std::int64_t out_cols = unroll ? os[1] * os[2] * os[3] : os[1];
  const auto q = plan.quant_input(node);
  const auto q_out = plan.quantized_output(node);
  const dt out = q_out ? q_out->type : plan.type_of(node.outputs[0]);
  const dt src_type = q ? q->type : act;
  const memory::desc src_row({rows, in_cols}, src_type, memory::format_tag::ab);
  const memory::desc dst_row({rows, out_cols}, out, memory::format_tag::ab);
  const memory::desc any_w({out_cols, in_cols}, q ? dt::s8 : act, memory::format_tag::any);
  const memory::desc bias_md({out_cols}, dt::f32, memory::format_tag::a);
  const Summand summand = summand_quant(plan, node, q_out);
  auto attr = plan.attr_with(node, 1.f, summand.scale, summand.type);
  Lowering::set_quant_masks(attr, q, q_out, 1);
  auto pd =
      has_bias ? dnnl::inner_product_forward::primitive_desc(plan.eng(),
                                                             dnnl::prop_kind::forward_inference,
                                                             src_row, any_w, bias_md, dst_row, attr)
               : dnnl::inner_product_forward::primitive_desc(
                     plan.eng(), dnnl::prop_kind::forward_inference, src_row, any_w, dst_row, attr);
  return {rows, in_cols, out_cols, q,       q_out,   src_type,
          out,  summand, src_row,  dst_row, bias_md, std::move(pd)};
}

// Whether oneDNN would run the convolution as that inner product only through its reference
// kernel (an int8 one summing a residual of another type into it, on AVX2: thousands of times
// slower than a convolution's kernel), where the way is not offered.
bool matrix_conv_is_reference(Lowering& plan, const Node& node, bool unroll) {
  return is_impl(matrix_conv_pd(plan, node, unroll).pd.impl_info_str(), "ref");
}

void matrix_conv(Lowering& plan, const Node& node, bool unroll) {
  const Graph& g = plan.graph();
  plan.set_kind(unroll ? "Conv (unrolled)" : "Conv (pointwise)");
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
  std::vector<float> w_data, bias_data;
  if (unroll) {
    std::tie(w_data, bias_data) = unrolled(g, node);
  } else {
    w_data = g.constants.at(node.inputs[1]).f;
    if (has_bias) bias_data = g.constants.at(node.inputs[2]).f;
  }
  const auto [rows, in_cols, out_cols, q, q_out, src_type, out, summand, src_row, dst_row, bias_md,
              pd] = matrix_conv_pd(plan, node, unroll);
  const PostOp* sum = Lowering::sum_post(node);
  std::vector<float> w_scales;
  if (q)
    std::tie(w_data, w_scales) =
        plan.quantize_weights(w_data, out_cols, inner_product_weight_quant(pd.impl_info_str()));
  const auto tag = memory::format_tag::acdb;
  const memory::desc src_map(dims_of(xs), src_type, tag), dst_map(dims_of(os), out, tag);
  const memory::desc w_user({out_cols, in_cols}, dt::f32, memory::format_tag::oi);
  ArgRef src =
      q ? plan.get_quantized(node.inputs[0], src_map, *q) : plan.get(node.inputs[0], src_map);
  src.md = src_row;
  // With a residual sum it accumulates into the other operand (channels-last, dead after it; a
  // quantized one read in its own type).
  if (sum) plan.before_overwrite(sum->sum_input);
  const memory::desc summand_map =
      sum && q_out ? memory::desc(dims_of(os), summand.type, tag) : dst_map;
  ArgRef dst = sum ? plan.get(sum->sum_input, summand_map) : plan.new_buffer(dst_map);
  dst.md = dst_map;
  ArgRef dst_view = dst;
  dst_view.md = dst_row;
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, src},
      {DNNL_ARG_WEIGHTS, plan.weight(std::move(w_data), w_user, pd.weights_desc())},
      {DNNL_ARG_DST, dst_view}};
  if (has_bias)
    args.emplace_back(DNNL_ARG_BIAS, plan.weight(std::move(bias_data), bias_md, bias_md));
  plan.add_quant_scales(args, q, std::move(w_scales), q_out);
  plan.add_primitive(dnnl::inner_product_forward(pd), std::move(args), node.describe(),
                     pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// Whether oneDNN's implementation `impl` of convolution `node` (weights of shape `ws`) gives
// results that change run after run. oneDNN's int8 1x1 kernel for AVX2 (jit_uni_int8_1x1, also
// its AVX-VNNI form) runs a strided convolution over a copy of its input at unit stride that each
// thread makes for itself (its "rtus" driver), and with more than one thread it read stale copies:
// on a Zen 3 at 2 threads, oneDNN 3.2 alone (a scratch program of oneDNN calls, not committed)
// gave other results on 13-59 of 59
// reruns for 5 of 36 shapes (batch 8-64, 24-208 input channels, stride 2, 4-14 pixels), exact on
// every first run and at one thread; a RegNet fixture's int8 logits moved by up to 0.03 between
// runs. oneDNN's next kernel, jit_uni_int8, gave the exact result on every run of those shapes
// (3-10% slower on ResNet-50's strided 1x1 shapes; tests/teacher: TeacherReruns).
bool gives_changing_results(const std::string& impl, const Node& node, const Shape& ws) {
  const auto s = node.ints_attr("strides");
  const bool strided = std::any_of(s.begin(), s.end(), [](std::int64_t v) { return v > 1; });
  return strided && ws[2] == 1 && ws[3] == 1 && is_impl(impl, "jit_uni_int8_1x1");
}

// Moves `pd` past implementations that give changing results (gives_changing_results).
void past_changing_impls(dnnl::convolution_forward::primitive_desc& pd, const Node& node,
                         const Shape& ws) {
  while (gives_changing_results(pd.impl_info_str(), node, ws) && pd.next_impl()) {
  }
}

// oneDNN's direct convolution writing channels-last (acdb) or the layout it prefers, through the
// implementation oneDNN lists first (but for one that gives changing results) or, where `impl`
// names another, through that one.
void direct_conv(Lowering& plan, const Node& node, bool channels_last,
                 const std::string& impl = {}) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& ws = g.shape(node.inputs[1]);
  const Shape& os = g.shape(node.outputs[0]);
  const std::int64_t group = node.int_attr("group", 1);
  if (group > 1)
    plan.set_kind(group == xs[1] && ws[0] == group ? "Conv (depthwise)" : "Conv (grouped)");
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             pads = node.ints_attr("pads");
  const memory::dims strides = {s[0], s[1]}, dil = {d[0] - 1, d[1] - 1};
  const memory::dims pl = {pads[0], pads[1]}, pr = {pads[2], pads[3]};
  memory::dims wdims =
      group == 1 ? dims_of(ws) : memory::dims{group, ws[0] / group, ws[1], ws[2], ws[3]};
  const memory::desc w_user(wdims, dt::f32,
                            group == 1 ? memory::format_tag::oihw : memory::format_tag::goihw);
  const auto q = plan.quant_input(node);
  std::vector<float> w_data = g.constants.at(node.inputs[1]).f, w_scales;
  const memory::desc any_src(dims_of(xs), q ? q->type : act, memory::format_tag::any);
  const memory::desc any_w(wdims, q ? dt::s8 : act, memory::format_tag::any);
  const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
  const memory::desc bias_md({ws[0]}, dt::f32, memory::format_tag::a);
  const PostOp* sum = Lowering::sum_post(node);
  const auto q_out = plan.quantized_output(node);
  const Summand summand = summand_quant(plan, node, q_out);
  auto attr = plan.attr_with(node, 1.f, summand.scale, summand.type);
  Lowering::set_quant_masks(attr, q, q_out, group == 1 ? 1 : 3); // per output channel
  // With a residual sum the conv writes over the other operand's buffer, in its layout (and, where
  // quantized, in the output's type).
  if (sum) plan.before_overwrite(sum->sum_input);
  const memory::desc dst_md =
      sum ? (q_out ? retyped(plan.at(sum->sum_input).md, q_out->type) : plan.at(sum->sum_input).md)
          : memory::desc(dims_of(os), q_out ? q_out->type : plan.type_of(node.outputs[0]),
                         channels_last ? memory::format_tag::acdb : memory::format_tag::any);
  auto pd =
      has_bias
          ? dnnl::convolution_forward::primitive_desc(
                plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                any_src, any_w, bias_md, dst_md, strides, dil, pl, pr, attr)
          : dnnl::convolution_forward::primitive_desc(
                plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                any_src, any_w, dst_md, strides, dil, pl, pr, attr);
  walk_to_impl(plan, node, pd, impl);
  if (impl.empty()) past_changing_impls(pd, node, ws);
  if (q) {
    const bool depthwise = group > 1 && group == xs[1] && ws[0] == group;
    std::tie(w_data, w_scales) = plan.quantize_weights(
        w_data, ws[0],
        conv_weight_quant(pd.impl_info_str(), q->type, depthwise, static_cast<int>(ws[2] * ws[3])));
  }
  const ArgRef src = q ? plan.get_quantized(node.inputs[0], pd.src_desc(), *q)
                       : plan.get(node.inputs[0], pd.src_desc());
  const ArgRef w = plan.weight(std::move(w_data), w_user, pd.weights_desc());
  ArgRef dst = sum ? plan.at(sum->sum_input) : plan.new_buffer(pd.dst_desc());
  dst.md = pd.dst_desc();
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, dst}};
  if (has_bias)
    args.emplace_back(DNNL_ARG_BIAS,
                      plan.weight(g.constants.at(node.inputs[2]).f, bias_md, bias_md));
  plan.add_quant_scales(args, q, std::move(w_scales), q_out);
  plan.add_primitive(dnnl::convolution_forward(pd), std::move(args), node.describe(),
                     pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// The implementations oneDNN offers for the direct convolution writing channels-last, in its
// order of preference: the first is a reference or an im2col GEMM one where this CPU has no fast
// channels-last kernel for it; the second, where it is neither, is another kernel for the same
// ISA worth timing
// (on a Zen 4, oneDNN lists its brdgmm depthwise kernel before its jit one: per node, the first
// took 0.64-2.50x the second's time in bench/results/teacher_vs_ort_zen4_224_ways_4f21c54.json).
std::vector<std::string> channels_last_impls(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& ws = g.shape(node.inputs[1]);
  const std::int64_t group = node.int_attr("group", 1);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             pads = node.ints_attr("pads");
  const memory::dims wdims =
      group == 1 ? dims_of(ws) : memory::dims{group, ws[0] / group, ws[1], ws[2], ws[3]};
  const auto q = plan.quant_input(node);
  auto attr = plan.attr_with(node);
  const auto q_out = plan.quantized_output(node);
  Lowering::set_quant_masks(attr, q, q_out, group == 1 ? 1 : 3);
  const memory::desc src(dims_of(xs), q ? q->type : plan.act(), memory::format_tag::any);
  const memory::desc w(wdims, q ? dt::s8 : plan.act(), memory::format_tag::any);
  const memory::desc dst(dims_of(g.shape(node.outputs[0])),
                         q_out ? q_out->type : plan.type_of(node.outputs[0]),
                         memory::format_tag::acdb);
  const memory::dims st = {s[0], s[1]}, dil = {d[0] - 1, d[1] - 1}, pl = {pads[0], pads[1]},
                     pr = {pads[2], pads[3]};
  // With the bias where the convolution has one, as direct_conv asks: the same list.
  auto pd =
      node.inputs.size() > 2 && !node.inputs[2].empty()
          ? dnnl::convolution_forward::primitive_desc(
                plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                src, w, memory::desc({ws[0]}, dt::f32, memory::format_tag::a), dst, st, dil, pl, pr,
                attr)
          : dnnl::convolution_forward::primitive_desc(
                plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                src, w, dst, st, dil, pl, pr, attr);
  past_changing_impls(pd, node, ws);
  std::vector<std::string> impls = {pd.impl_info_str()};
  if (is_impl(impls[0], "ref") || is_impl(impls[0], "gemm:")) return impls;
  // Only a kernel for the same ISA as the first (the name's last field): oneDNN also lists its
  // kernels for lower ISAs, and an int8 one without VNNI (avx512_core beside avx512_core_vnni)
  // sums u8 x s8 pairs in 16 bits, which saturate: a DenseNet fixture's int8 error went 0.01 ->
  // 0.11 with it.
  const auto isa_of = [](const std::string& impl) { return impl.substr(impl.rfind(':') + 1); };
  while (impls.size() < 2 && pd.next_impl()) {
    const std::string next = pd.impl_info_str();
    if (!is_impl(next, "ref") && !is_impl(next, "gemm:") && next != impls[0] &&
        isa_of(next) == isa_of(impls[0]) && !gives_changing_results(next, node, ws))
      impls.push_back(next);
  }
  return impls;
}

// --- pointwise -> depthwise, one primitive -------------------------------------------------------

// The depthwise convolution that alone reads pointwise convolution `pw`'s output, where oneDNN's
// depthwise post-op could run the two as one primitive (the expansion and depthwise pair of
// MobileNet and EfficientNet blocks), so that the expanded tensor is never written out: `pw` 1x1,
// stride 1, no padding, no groups, no residual sum, its output read by nothing else (no graph
// output, no feature) and written in act(); the other a 3x3 convolution over each of those
// channels, stride 1 or 2, padding 1, no dilation, no residual sum; neither quantized (int8 and
// its calibration, which reads every product's input, keep them apart). nullptr otherwise.
const Node* depthwise_after(Lowering& plan, const Node& pw) {
  const Graph& g = plan.graph();
  const std::string& mid = pw.outputs[0];
  const Shape& ws = g.shape(pw.inputs[1]);
  using Ints = std::vector<std::int64_t>;
  if (ws[2] != 1 || ws[3] != 1 || pw.int_attr("group", 1) != 1 ||
      Lowering::sum_post(pw) != nullptr || pw.ints_attr("strides") != Ints{1, 1} ||
      pw.ints_attr("pads") != Ints{0, 0, 0, 0} || g.is_output(mid) || plan.is_feature(mid) ||
      plan.observing() || plan.type_of(mid) != plan.act() || plan.quant_input(pw))
    return nullptr;
  const auto readers = g.consumers(mid);
  if (readers.size() != 1) return nullptr;
  const Node& dw = g.nodes[readers[0]];
  const bool constant_bias =
      dw.inputs.size() < 3 || dw.inputs[2].empty() || g.is_constant(dw.inputs[2]);
  if (dw.op != "Conv" || dw.inputs[0] != mid || !g.is_constant(dw.inputs[1]) || !constant_bias ||
      Lowering::sum_post(dw) != nullptr || plan.quant_input(dw))
    return nullptr;
  const auto s = dw.ints_attr("strides");
  if (dw.int_attr("group", 1) != ws[0] || g.shape(dw.inputs[1]) != Shape{ws[0], 1, 3, 3} ||
      s.size() != 2 || s[0] != s[1] || (s[0] != 1 && s[0] != 2) ||
      dw.ints_attr("pads") != Ints{1, 1, 1, 1} || dw.ints_attr("dilations") != Ints{1, 1})
    return nullptr;
  return &dw;
}

// The one primitive for `pw` and `dw` (depthwise_after), channels-last in and out as the plan's
// neighbouring convolutions prefer (and faster so than blocked), where this oneDNN has a kernel
// of its own for it: not where it would run its reference composition of the two (the same two
// kernels in turn), nor where it cannot build it at all.
std::optional<dnnl::convolution_forward::primitive_desc>
fused_depthwise_pd(Lowering& plan, const Node& pw, const Node& dw) {
  const Graph& g = plan.graph();
  const dt act = plan.act();
  const Shape& ws = g.shape(pw.inputs[1]);
  const auto stride = static_cast<int>(dw.ints_attr("strides")[0]);
  try {
    const auto pd = dnnl::convolution_forward::primitive_desc(
        plan.eng(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(dims_of(g.shape(pw.inputs[0])), act, memory::format_tag::acdb),
        memory::desc(dims_of(ws), act, memory::format_tag::any),
        memory::desc({ws[0]}, dt::f32, memory::format_tag::a),
        memory::desc(dims_of(g.shape(pw.outputs[0])), act, memory::format_tag::acdb), {1, 1},
        {0, 0}, {0, 0}, {0, 0},
        plan.attr_with_depthwise(pw, dw, act, plan.type_of(dw.outputs[0]), stride));
    if (is_impl(pd.impl_info_str(), "ref") ||
        pd.dst_desc().get_dims() != dims_of(g.shape(dw.outputs[0])))
      return std::nullopt;
    return pd;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// `pw` and `dw` as that one primitive: it writes dw's output, and dw is not lowered on its own.
void fused_depthwise_conv(Lowering& plan, const Node& pw, const Node& dw,
                          const dnnl::convolution_forward::primitive_desc& pd) {
  const Graph& g = plan.graph();
  plan.set_kind("Conv (pointwise+dw)");
  const Shape& ws = g.shape(pw.inputs[1]);
  const std::int64_t c = ws[0];
  const auto bias_of = [&](const Node& n) {
    return n.inputs.size() > 2 && !n.inputs[2].empty()
               ? g.constants.at(n.inputs[2]).f
               : std::vector<float>(static_cast<std::size_t>(c), 0.f);
  };
  const memory::desc bias_md({c}, dt::f32, memory::format_tag::a);
  constexpr int kDw = DNNL_ARG_ATTR_POST_OP_DW;
  const auto dw_md = [&](int arg) { return pd.query_md(dnnl::query::exec_arg_md, kDw | arg); };
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, plan.get(pw.inputs[0], pd.src_desc())},
      {DNNL_ARG_WEIGHTS, plan.weight(g.constants.at(pw.inputs[1]).f,
                                     memory::desc(dims_of(ws), dt::f32, memory::format_tag::oihw),
                                     pd.weights_desc())},
      {DNNL_ARG_BIAS, plan.weight(bias_of(pw), bias_md, bias_md)},
      {DNNL_ARG_DST, dst},
      {kDw | DNNL_ARG_WEIGHTS,
       plan.weight(g.constants.at(dw.inputs[1]).f,
                   memory::desc({c, 1, 1, 3, 3}, dt::f32, memory::format_tag::goihw),
                   dw_md(DNNL_ARG_WEIGHTS))},
      {kDw | DNNL_ARG_BIAS, plan.weight(bias_of(dw), bias_md, dw_md(DNNL_ARG_BIAS))}};
  plan.add_primitive(dnnl::convolution_forward(pd), std::move(args),
                     pw.describe() + " + " + dw.describe(), pd.scratchpad_desc());
  plan.set(dw.outputs[0], dst);
  plan.skip(dw.name);
}

// A convolution's ways to run, in the order the untuned plan prefers them:
//  - "pointwise_depthwise": a pointwise convolution and the depthwise one that alone reads it, as
//    one oneDNN primitive (fused_depthwise_pd), first where offered (mobilenet_v2 at 224, batch
//    64, 2 threads on a Zen 4: 211.5 -> 251.9 images/s, bench/results/teacher_vs_ort_zen4_pw_dw_*);
//  - "unrolled": one inner product over the unrolled kernel, first where it does at most 25% more
//    multiply-adds than the valid taps (3x3 with padding 1 on 2x2 maps, a kernel as large as the
//    map), offered up to 2x;
//  - "inner_product": pointwise on channels-last input, each pixel of the batch a row;
//  - "channels_last": the direct convolution writing channels-last, so that neighbouring
//    convolutions do not pick different layouts with reorders between them (and pointwise ones
//    can run as inner products); first unless oneDNN has only a GEMM kernel for it, not offered
//    where it has only a reference one;
//  - "library": the direct convolution in the layout oneDNN prefers;
//  - "channels_last_alternative": the direct convolution writing channels-last through the next
//    implementation oneDNN offers for it for the first one's ISA (channels_last_impls), where that
//    is neither its reference nor its GEMM one; never the untuned plan's way;
//  - "winograd_4x4", "winograd_2x2": F(m x m, r x r) (winograd.cpp), for 3x3 and 5x5
//    convolutions of stride 1 in fp32, F(2x2, 3x3) in bf16 too; never the untuned plan's way, for
//    the tuner to time;
//  - "im2col": each output pixel's receptive field unrolled into a row and the layer one matmul
//    (im2col.cpp), for convolutions over fewer than 16 input channels (an image network's stem);
//    never the untuned plan's way, for the tuner to time.
// (Plain NCHW in and out, where oneDNN runs im2col + its GEMM, was tried as a fifth way: on AVX2
// it took 1.4-1.9x the channels-last time on every 3x3 convolution of a ResNet-50 at 224 and was
// never chosen, so it is not offered.)
// With a residual sum the direct convolution writes in the sum operand's layout: one way.
void lower_conv(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  if (!g.is_constant(node.inputs[1])) plan.fail(node, "weights must be constant");
  std::vector<std::string> first, later, impls;
  const Node* dw = depthwise_after(plan, node);
  const auto fused = dw != nullptr ? fused_depthwise_pd(plan, node, *dw) : std::nullopt;
  if (fused) first.emplace_back("pointwise_depthwise");
  if (const auto overhead = unroll_overhead(g, node);
      overhead && *overhead <= 2.0 && !matrix_conv_is_reference(plan, node, true))
    (*overhead <= 1.25 ? first : later).emplace_back("unrolled");
  if (pointwise_on_channels_last(plan, node) && !matrix_conv_is_reference(plan, node, false))
    first.emplace_back("inner_product");
  if (Lowering::sum_post(node) != nullptr) {
    first.emplace_back("direct");
  } else {
    impls = channels_last_impls(plan, node);
    if (is_impl(impls[0], "ref")) {
      first.emplace_back("library");
    } else {
      const bool gemm = is_impl(impls[0], "gemm:");
      first.emplace_back(gemm ? "library" : "channels_last");
      later.emplace_back(gemm ? "channels_last" : "library");
      if (impls.size() > 1) later.emplace_back("channels_last_alternative");
    }
  }
  for (auto& w : winograd_ways(plan, node)) later.push_back(std::move(w));
  for (auto& w : im2col_ways(plan, node)) later.push_back(std::move(w));
  first.insert(first.end(), later.begin(), later.end());
  const std::string way = plan.choose(node, std::move(first));
  if (way == "pointwise_depthwise") return fused_depthwise_conv(plan, node, *dw, *fused);
  if (way == "winograd_4x4" || way == "winograd_2x2")
    return winograd_conv(plan, node, way == "winograd_4x4" ? 4 : 2);
  if (way == "im2col") return im2col_conv(plan, node);
  if (way == "unrolled" || way == "inner_product")
    return matrix_conv(plan, node, way == "unrolled");
  if (way == "channels_last_alternative") return direct_conv(plan, node, true, impls.at(1));
  direct_conv(plan, node, way == "channels_last");
}

PostOps conv_post_ops(const Graph&, const Node&) { return PostOps::eltwise_and_sum; }

} // namespace

bool is_impl(const std::string& impl, std::string_view kind) {
  const std::string_view name = std::string_view(impl).substr(impl.starts_with("x64:") ? 4 : 0);
  return name.starts_with(kind);
}

std::pair<std::vector<float>, std::vector<float>>
quantize_rows(const std::vector<float>& w, std::int64_t rows, const WeightQuant& wq) {
  const std::size_t n = static_cast<std::size_t>(rows);
  const std::size_t cols = n == 0 ? 0 : w.size() / n;
  const std::size_t taps = static_cast<std::size_t>(std::max(wq.pair_taps, 1));
  const std::size_t channels = cols / taps;
  const float levels = static_cast<float>(wq.levels);
  std::vector<float> q(w.size()), scale(n, 1.f);
  for (std::size_t r = 0; r < n; ++r) {
    const float* row = w.data() + r * cols;
    // The bound on each weight, and on each pair of one sign that the kernel may sum in 16 bits
    // (neighbouring channels at one tap: whichever of the two neighbours a channel is paired
    // with, as a block of the reduction may start at an odd channel): at most `levels` before
    // rounding, so at most levels + 1 after it (each of the two rounds by at most half a step).
    float top = 0.f;
    for (std::size_t c = 0; c < cols; ++c) top = std::max(top, std::fabs(row[c]));
    if (wq.pair_taps > 0)
      for (std::size_t ch = 0; ch + 1 < channels; ++ch)
        for (std::size_t t = 0; t < taps; ++t) {
          const float a = row[ch * taps + t], b = row[(ch + 1) * taps + t];
          if ((a > 0.f && b > 0.f) || (a < 0.f && b < 0.f))
            top = std::max(top, std::fabs(a) + std::fabs(b));
        }
    if (top > 0.f) scale[r] = top / levels;
    for (std::size_t c = 0; c < cols; ++c) {
      float v = std::clamp(std::nearbyint(row[c] / scale[r]), -levels, levels);
      q[r * cols + c] = wq.doubled ? 2.f * v : v;
    }
    if (wq.doubled) scale[r] *= 0.5f;
  }
  return {std::move(q), std::move(scale)};
}

std::pair<std::vector<float>, std::vector<float>>
Lowering::quantize_weights(const std::vector<float>& w, std::int64_t rows, WeightQuant wq) {
  weight_quant_ = wq;
  return quantize_rows(w, rows, wq);
}

WeightQuant conv_weight_quant(const std::string& impl, dnnl::memory::data_type src, bool depthwise,
                              int taps) {
  if (has_native_int8() || is_impl(impl, "ref")) return {127};
  // oneDNN running the convolution as an inner product: no halving, its reduction in the order of
  // the source's layout.
  if (is_impl(impl, "ip:")) return {int8_weight_levels()};
  const bool halved = src == dt::s8;
  if (depthwise && (is_impl(impl, "jit_uni_int8") || is_impl(impl, "jit_int8")))
    return {127, halved};
  if (!depthwise && is_impl(impl, "jit_uni_int8")) return {127, halved, taps};
  return {int8_weight_levels(), halved};
}

WeightQuant inner_product_weight_quant(const std::string& impl) {
  if (has_native_int8() || is_impl(impl, "ref")) return {127};
  // Below AVX-512 (where an s8 source is shifted to u8 by copying it, simple_gemm_s8s8s32): the
  // kernel whose pairs the int8_paired tests saw.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  if ((isa & avx512) != avx512 &&
      (is_impl(impl, "gemm_s8u8s32:jit") || is_impl(impl, "gemm_s8s8s32:jit")))
    return {127, false, 1};
  return {int8_weight_levels()};
}

namespace {

// The multiply-adds of taps that read the input, not padding: the work done, whichever way the
// convolution runs (an unrolled one multiplies zeros too, and is not credited for them).
double conv_flops(const Graph& g, const Node& node) {
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& out = g.shape(node.outputs[0]);
  const Shape& w = g.shape(node.inputs[1]);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  const std::int64_t taps = axis_pairs(xs[2], out[2], w[2], s[0], d[0], p[0]) *
                            axis_pairs(xs[3], out[3], w[3], s[1], d[1], p[1]);
  return 2.0 * static_cast<double>(out[1]) * static_cast<double>(w[1]) * static_cast<double>(taps);
}

// --- BatchNormalization --------------------------------------------------------------------------

std::vector<InferredOutput> infer_batchnorm(Node& node, const InferArgs& a) {
  // Scale, bias, mean and variance hold one value per channel (axis 1).
  if (a.in[0].size() < 2) bad(node, "X needs a channel axis");
  const char* names[] = {"scale", "B", "mean", "var"};
  for (std::size_t k = 1; k <= 4; ++k)
    if (a.in[k] != Shape{a.in[0][1]})
      bad(node, fmt::format("{} has shape {}, X has {} channels", names[k - 1],
                            format_shape(a.in[k]), a.in[0][1]));
  node.attrs["epsilon"] = float_attribute(node.float_attr("epsilon", 1e-5f));
  return {{a.in[0], ElemType::f32}};
}

std::vector<Tensor> evaluate_batchnorm(const Node& node, const std::vector<const Tensor*>& x,
                                       const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const float eps = node.float_attr("epsilon", 1e-5f);
  const std::int64_t spatial = numel(xs) / (xs[0] * xs[1]);
  std::vector<float> r(x[0]->f.size());
  for (std::int64_t n = 0; n < xs[0]; ++n)
    for (std::int64_t ch = 0; ch < xs[1]; ++ch) {
      const auto c = static_cast<std::size_t>(ch);
      const float scale = x[1]->f[c] / std::sqrt(x[4]->f[c] + eps);
      const float shift = x[2]->f[c] - x[3]->f[c] * scale;
      for (std::int64_t k = 0; k < spatial; ++k) {
        const auto at = static_cast<std::size_t>((n * xs[1] + ch) * spatial + k);
        r[at] = x[0]->f[at] * scale + shift;
      }
    }
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

// The passes (fold_batchnorm) fold every BatchNormalization with constant parameters into the
// convolution before it, or make a lone one on NCHW input a depthwise 1x1 convolution. What
// reaches the engine with constant parameters is a lone one over another rank (BatchNorm1d after
// a linear layer, LeViT's): x * a + b per channel, one oneDNN binary with the shift as its
// post-op. Computed parameters are refused.
void lower_batchnorm(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  for (std::size_t k = 1; k < 5; ++k)
    if (!g.is_constant(node.inputs[k]))
      plan.fail(node, "BatchNormalization with non-constant parameters is not supported");
  const Shape& xs = g.shape(node.inputs[0]);
  const auto f = [&](std::size_t k) { return g.constants.at(node.inputs[k]); };
  const Tensor scale = f(1), shift = f(2), mean = f(3), var = f(4);
  const float eps = node.float_attr("epsilon", 1e-5f);
  const std::int64_t c = xs[1];
  std::vector<float> a(static_cast<std::size_t>(c)), b(static_cast<std::size_t>(c));
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const auto i = static_cast<std::size_t>(ch);
    a[i] = static_cast<float>(scale.at(ch) / std::sqrt(var.at(ch) + eps));
    b[i] = static_cast<float>(shift.at(ch) - mean.at(ch) * a[i]);
  }
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  plan.set(node.outputs[0], per_channel_affine(plan, plan.get_plain(node.inputs[0], type), xs,
                                               std::move(a), std::move(b), node.describe()));
}

constexpr OpDef kOps[] = {
    {.name = "Conv",
     .min_inputs = 2,
     .float_inputs = 3,
     .infer = infer_conv,
     .evaluate = evaluate_conv,
     .lower = lower_conv,
     .post_ops = conv_post_ops,
     .flops_per_sample = conv_flops},
    {.name = "BatchNormalization",
     .min_inputs = 5,
     .float_inputs = 5,
     .infer = infer_batchnorm,
     .evaluate = evaluate_batchnorm,
     .lower = lower_batchnorm,
     .training_outputs = true},
};

} // namespace

std::span<const OpDef> conv_ops() { return kOps; }

} // namespace kdflow::teacher
