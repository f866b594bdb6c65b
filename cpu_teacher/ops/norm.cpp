// LayerNormalization (opset 17; the exporters' decomposed form is fused into it by the passes):
// oneDNN's layer normalization over the trailing axes from `axis` on, seen as one axis; and
// InstanceNormalization and GroupNormalization through the same primitive (below).
#include "bf16.hpp"
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"
#include "simd.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

namespace kdflow::teacher {
namespace {

// Rows before `axis`, and the length of one normalized row.
std::pair<std::int64_t, std::int64_t> rows_and_length(const Shape& xs, std::int64_t axis) {
  const auto split = xs.begin() + axis;
  return {numel(Shape(xs.begin(), split)), numel(Shape(split, xs.end()))};
}

// The reference normalization of one row: out[k] = affine(k, (x[k] - mean) / sqrt(var + eps)),
// statistics in double.
template <typename Affine>
void normalize_row(const float* row, std::int64_t len, double eps, float* out, Affine&& affine) {
  double mean = 0, var = 0;
  for (std::int64_t k = 0; k < len; ++k) mean += row[k];
  mean /= static_cast<double>(len);
  for (std::int64_t k = 0; k < len; ++k) var += (row[k] - mean) * (row[k] - mean);
  var /= static_cast<double>(len);
  const double inv = 1.0 / std::sqrt(var + eps);
  for (std::int64_t k = 0; k < len; ++k)
    out[k] = static_cast<float>(affine(k, (row[k] - mean) * inv));
}

// Scale and bias must be constants that broadcast to the normalized shape (the lowering and the
// reference expand them to one value per position of the row with expand_to_row).
std::vector<InferredOutput> infer_layer_norm(Node& node, const InferArgs& a) {
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  const std::int64_t axis = norm_axis(node, node.int_attr("axis", -1), rank);
  node.attrs["axis"] = int_attribute(axis);
  node.attrs["epsilon"] = float_attribute(node.float_attr("epsilon", 1e-5f));
  const Shape normalized(a.in[0].begin() + axis, a.in[0].end());
  for (std::size_t k = 1; k < 3 && k < node.inputs.size(); ++k) {
    if (!has_input(node, k)) continue;
    (void)need_constant(node, a.constants, k, k == 1 ? "Scale" : "B");
    if (broadcast(node, a.in[k], normalized) != normalized)
      bad(node,
          fmt::format("{} of shape {} does not broadcast to the normalized shape {}",
                      k == 1 ? "Scale" : "B", format_shape(a.in[k]), format_shape(normalized)));
  }
  return {{a.in[0], ElemType::f32}};
}

// A constant broadcast to one normalized row; `fallback` where the input is omitted.
std::vector<float> expand_to_row(const Tensor* t, const Shape& normalized, float fallback) {
  std::vector<float> row(static_cast<std::size_t>(numel(normalized)), fallback);
  if (t == nullptr) return row;
  const Shape st = broadcast_strides(t->shape, normalized);
  for_each_index(normalized, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t src = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) src += idx[d] * st[d];
    row[static_cast<std::size_t>(k)] = static_cast<float>(t->at(src));
  });
  return row;
}

std::vector<Tensor> evaluate_layer_norm(const Node& node, const std::vector<const Tensor*>& x,
                                        const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const std::int64_t axis = node.int_attr("axis", -1);
  const Shape normalized(xs.begin() + axis, xs.end());
  const auto [rows, len] = rows_and_length(xs, axis);
  const std::vector<float> scale = expand_to_row(x.size() > 1 ? x[1] : nullptr, normalized, 1.f);
  const std::vector<float> bias = expand_to_row(x.size() > 2 ? x[2] : nullptr, normalized, 0.f);
  const double eps = node.float_attr("epsilon", 1e-5f);
  std::vector<float> r(x[0]->f.size());
  for (std::int64_t i = 0; i < rows; ++i)
    normalize_row(
        x[0]->f.data() + i * len, len, eps, r.data() + i * len, [&](std::int64_t k, double v) {
          return v * scale[static_cast<std::size_t>(k)] + bias[static_cast<std::size_t>(k)];
        });
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

void lower_layer_norm(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const std::int64_t axis = node.int_attr("axis", -1);
  const Shape normalized(xs.begin() + axis, xs.end());
  const auto [rows, len] = rows_and_length(xs, axis);
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  ArgRef src = plan.get_plain(node.inputs[0], type);
  src.md = plain({rows, len}, type);
  const auto constant = [&](std::size_t k) {
    return has_input(node, k) ? &g.constants.at(node.inputs[k]) : nullptr;
  };
  const memory::desc row_md({len}, dt::f32, memory::format_tag::a);
  const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  // Under int8, where every reader is a quantized product (a transformer's QKV or MLP linear, a
  // ConvNeXt's first linear), the normalization writes their u8/s8 input itself, at their scale,
  // so no quantizing reorder sits between them; f32 where oneDNN has no such kernel here.
  std::optional<Lowering::Quant> q_out = plan.stored_quant(node.outputs[0]);
  // (The quantized destination's md made here: a lambda may not name a structured binding under
  // clang 14, which the fuzz build uses.)
  const memory::desc q_md = q_out ? plain({rows, len}, q_out->type) : memory::desc();
  const auto primitive_desc = [&](const std::optional<Lowering::Quant>& q) {
    dnnl::primitive_attr attr = Lowering::plain_attr();
    if (q) attr.set_scales_mask(DNNL_ARG_DST, 0);
    return dnnl::layer_normalization_forward::primitive_desc(
        plan.eng(), dnnl::prop_kind::forward_inference, src.md, q ? q_md : src.md,
        node.float_attr("epsilon", 1e-5f), flags, attr);
  };
  dnnl::layer_normalization_forward::primitive_desc pd;
  try {
    pd = primitive_desc(q_out);
  } catch (const dnnl::error&) {
    if (!q_out) throw;
    q_out.reset();
    pd = primitive_desc(q_out);
  }
  const ArgRef scale = plan.weight(expand_to_row(constant(1), normalized, 1.f), row_md, row_md);
  const ArgRef shift = plan.weight(expand_to_row(constant(2), normalized, 0.f), row_md, row_md);
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {
      {DNNL_ARG_SRC, src}, {DNNL_ARG_SCALE, scale}, {DNNL_ARG_SHIFT, shift}, {DNNL_ARG_DST, dst}};
  if (q_out) args.emplace_back(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, plan.scales({q_out->scale}));
  plan.add_primitive(dnnl::layer_normalization_forward(pd), std::move(args), node.describe(),
                     pd.scratchpad_desc());
  plan.set(node.outputs[0],
           ArgRef{dst.kind, dst.index, dst.offset, plain(xs, q_out ? q_out->type : type)});
}

// --- InstanceNormalization, GroupNormalization
// ----------------------------------------------------- Statistics per sample over each group of
// channels and all positions (InstanceNormalization: a group per channel, as the legacy exporter
// writes GroupNorm over a reshape), then a per-channel scale and bias. oneDNN 3.2 has no group
// normalization: its layer normalization over the rows [N * groups, channels / groups * positions],
// then one binary primitive, the scale times the row-normalized value with the bias added as its
// post-op (left out where they are 1 and 0).

std::int64_t groups_of(const Node& node, std::int64_t channels) {
  return node.op == "InstanceNormalization" ? channels : node.int_attr("num_groups", 0);
}

std::vector<InferredOutput> infer_group_norm(Node& node, const InferArgs& a) {
  const Shape& xs = a.in[0];
  if (xs.size() < 3)
    bad(node, fmt::format("input {} has no channel and position axes", format_shape(xs)));
  const std::int64_t c = xs[1];
  if (node.op == "GroupNormalization") {
    if (!node.has("num_groups")) bad(node, "num_groups is missing");
    const std::int64_t g = node.int_attr("num_groups", 0);
    if (g < 1 || c % g != 0)
      bad(node, fmt::format("{} channels do not split into {} groups", c, g));
  }
  const std::int64_t groups = groups_of(node, c);
  for (std::size_t k = 1; k < 3; ++k) {
    const Tensor& t = need_constant(node, a.constants, k, k == 1 ? "scale" : "bias");
    if (t.size() != c)
      bad(node,
          fmt::format("{} has {} values for {} channels{}", k == 1 ? "scale" : "bias", t.size(), c,
                      t.size() == groups ? " (one per group: GroupNormalization before "
                                           "opset 21, deprecated; export at opset 21 or later)"
                                         : ""));
  }
  node.attrs["epsilon"] = float_attribute(node.float_attr("epsilon", 1e-5f));
  return {{xs, ElemType::f32}};
}

// Scale or bias, one per channel.
std::vector<float> per_channel(const Tensor& t) {
  std::vector<float> r(static_cast<std::size_t>(t.size()));
  for (std::int64_t ch = 0; ch < t.size(); ++ch)
    r[static_cast<std::size_t>(ch)] = static_cast<float>(t.at(ch));
  return r;
}

std::vector<Tensor> evaluate_group_norm(const Node& node, const std::vector<const Tensor*>& x,
                                        const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const std::int64_t n = xs[0], c = xs[1], groups = groups_of(node, c);
  const std::int64_t len = c / groups * numel(Shape(xs.begin() + 2, xs.end()));
  const std::int64_t positions = len * groups / c;
  const std::vector<float> scale = per_channel(*x[1]), bias = per_channel(*x[2]);
  const double eps = node.float_attr("epsilon", 1e-5f);
  std::vector<float> r(x[0]->f.size());
  for (std::int64_t row = 0; row < n * groups; ++row)
    normalize_row(
        x[0]->f.data() + row * len, len, eps, r.data() + row * len, [&](std::int64_t k, double v) {
          const auto ch = static_cast<std::size_t>((row % groups) * (c / groups) + k / positions);
          return v * scale[ch] + bias[ch];
        });
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

// The rows way: oneDNN's layer normalization over plain rows (a copy where the input lies
// otherwise), then the per-channel scale and bias as one binary.
void rows_group_norm(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const std::int64_t n = xs[0], c = xs[1], groups = groups_of(node, c);
  const std::int64_t positions = numel(Shape(xs.begin() + 2, xs.end()));
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  ArgRef src = plan.get_plain(node.inputs[0], type);
  src.md = plain({n * groups, c / groups * positions}, type);
  const auto pd = dnnl::layer_normalization_forward::primitive_desc(
      plan.eng(), dnnl::prop_kind::forward_inference, src.md, src.md,
      node.float_attr("epsilon", 1e-5f), dnnl::normalization_flags::none, Lowering::plain_attr());
  const ArgRef normalized = plan.new_buffer(src.md);
  plan.add_primitive(dnnl::layer_normalization_forward(pd),
                     {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, normalized}}, node.describe(),
                     pd.scratchpad_desc());
  const std::vector<float> scale = per_channel(g.constants.at(node.inputs[1]));
  const std::vector<float> bias = per_channel(g.constants.at(node.inputs[2]));
  const bool identity = std::all_of(scale.begin(), scale.end(), [](float v) { return v == 1; }) &&
                        std::all_of(bias.begin(), bias.end(), [](float v) { return v == 0; });
  if (identity) {
    plan.set(node.outputs[0],
             ArgRef{normalized.kind, normalized.index, normalized.offset, plain(xs, type)});
    return;
  }
  plan.set(node.outputs[0], per_channel_affine(plan, normalized, xs, scale, bias, node.describe()));
}

// --- The channels-last way: kdflow's kernel over [N, H, W, C] ------------------------------------

struct ChannelsLastNorm {
  std::int64_t positions = 0, channels = 0, groups = 0;
  double eps = 1e-5;
  bool relu = false;
  std::vector<float> scale, bias; // per channel
};

// Each channel's sum of x (squared == false) or of (x - centre[channel])^2 over one sample's
// positions: float runs of 64 positions, each added into `sum` in double. Inlined into each ISA's
// copy of normalize_sample, the inner loops running along the channels as they lie. T: the
// element type, f32 or bf16 (each element widened to f32 as it is read).
template <class T>
[[gnu::always_inline]] inline void channel_sums(const T* x, std::int64_t positions, std::int64_t c,
                                                const float* centre, bool squared, float* part,
                                                double* sum) {
  constexpr std::int64_t kRun = 64;
  std::fill(sum, sum + c, 0.0);
  for (std::int64_t p0 = 0; p0 < positions; p0 += kRun) {
    std::fill(part, part + c, 0.f);
    const std::int64_t p1 = std::min(positions, p0 + kRun);
    for (std::int64_t p = p0; p < p1; ++p) {
      const T* row = x + p * c;
      if (squared)
        for (std::int64_t ch = 0; ch < c; ++ch) {
          const float d = to_float(row[ch]) - centre[ch];
          part[ch] += d * d;
        }
      else
        for (std::int64_t ch = 0; ch < c; ++ch) part[ch] += to_float(row[ch]);
    }
    for (std::int64_t ch = 0; ch < c; ++ch) sum[ch] += part[ch];
  }
}

// The mean of each group's channel sums over its channels and positions, written to each of its
// channels.
inline void group_means(const double* sum, std::int64_t c, std::int64_t groups,
                        std::int64_t positions, float* per_channel) {
  const std::int64_t per_group = c / groups;
  const double count = static_cast<double>(per_group * positions);
  for (std::int64_t gr = 0; gr < groups; ++gr) {
    double total = 0;
    for (std::int64_t ch = gr * per_group; ch < (gr + 1) * per_group; ++ch) total += sum[ch];
    std::fill(per_channel + gr * per_group, per_channel + (gr + 1) * per_group,
              static_cast<float>(total / count));
  }
}

// One sample's [positions, channels]: each group's mean, then its variance as the mean squared
// deviation from that mean (statistics in double over float runs), then y = x * a + b per channel
// (a = scale / sqrt(var + eps), b = bias - mean * a), and max(y, 0) where a Relu was taken in,
// computed in f32 and written in T (rounded once to bf16 in bf16, as PyTorch's bf16 group_norm
// computes in f32 and rounds its result).
template <class T>
[[gnu::always_inline]] inline void normalize_sample(const ChannelsLastNorm& k, const T* x, T* y,
                                                    float* part, double* sum, float* a, float* b) {
  const std::int64_t c = k.channels;
  channel_sums(x, k.positions, c, nullptr, false, part, sum);
  group_means(sum, c, k.groups, k.positions, b); // b: each channel's group mean, for now
  channel_sums(x, k.positions, c, b, true, part, sum);
  group_means(sum, c, k.groups, k.positions, a); // a: the group's variance, for now
  for (std::int64_t ch = 0; ch < c; ++ch) {
    const double scale =
        k.scale[static_cast<std::size_t>(ch)] / std::sqrt(static_cast<double>(a[ch]) + k.eps);
    a[ch] = static_cast<float>(scale);
    b[ch] = static_cast<float>(k.bias[static_cast<std::size_t>(ch)] - b[ch] * scale);
  }
  for (std::int64_t p = 0; p < k.positions; ++p) {
    const T* row = x + p * c;
    T* out = y + p * c;
    if (k.relu)
      for (std::int64_t ch = 0; ch < c; ++ch)
        put(out[ch], std::max(to_float(row[ch]) * a[ch] + b[ch], 0.f));
    else
      for (std::int64_t ch = 0; ch < c; ++ch) put(out[ch], to_float(row[ch]) * a[ch] + b[ch]);
  }
}

template <class T>
using SampleFn = void (*)(const ChannelsLastNorm&, const T*, T*, float*, double*, float*, float*);
template <class T>
void sample_baseline(const ChannelsLastNorm& k, const T* x, T* y, float* part, double* sum,
                     float* a, float* b) {
  normalize_sample(k, x, y, part, sum, a, b);
}
#ifdef KD_TARGET_X86
template <class T>
KD_TARGET_AVX512 void sample_avx512(const ChannelsLastNorm& k, const T* x, T* y, float* part,
                                    double* sum, float* a, float* b) {
  normalize_sample(k, x, y, part, sum, a, b);
}
template <class T>
KD_TARGET_AVX2 void sample_avx2(const ChannelsLastNorm& k, const T* x, T* y, float* part,
                                double* sum, float* a, float* b) {
  normalize_sample(k, x, y, part, sum, a, b);
}
#endif

template <class T>
SampleFn<T> sample_for(VectorIsa isa) {
#ifdef KD_TARGET_X86
  if (isa == VectorIsa::avx512) return sample_avx512<T>;
  if (isa == VectorIsa::avx2) return sample_avx2<T>;
#endif
  (void)isa;
  return sample_baseline<T>;
}

// The Relu that alone reads `node`'s output, where the channels-last kernel can take it in.
const Node* relu_after(const Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const std::string& out = node.outputs[0];
  if (g.is_output(out) || plan.is_feature(out)) return nullptr;
  const auto readers = g.consumers(out);
  if (readers.size() != 1) return nullptr;
  const Node& r = g.nodes[readers[0]];
  return r.op == "Relu" && r.inputs[0] == out && r.post_ops.empty() ? &r : nullptr;
}

// The element type the channels-last kernel would read and write `node`'s values in: a 4-D input
// that lies f32 or bf16 and an output written in the same type (in a bf16 plan, bf16 where the
// convolution before wrote bf16, f32 where the value is kept wide; int8 plans keep f32 here);
// nullopt where it is not offered.
std::optional<dt> channels_last_norm_type(const Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const dt type = plan.view_at(node.inputs[0]).md.get_data_type();
  if (g.shape(node.inputs[0]).size() != 4 || (type != dt::f32 && type != dt::bf16) ||
      plan.type_of(node.outputs[0]) != type || (plan.act() != dt::f32 && plan.act() != dt::bf16))
    return std::nullopt;
  return type;
}

template <class T>
void channels_last_group_norm(Lowering& plan, const Node& node, dt type) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  auto k = std::make_shared<ChannelsLastNorm>();
  k->positions = xs[2] * xs[3];
  k->channels = xs[1];
  k->groups = groups_of(node, xs[1]);
  k->eps = node.float_attr("epsilon", 1e-5f);
  k->scale = per_channel(g.constants.at(node.inputs[1]));
  k->bias = per_channel(g.constants.at(node.inputs[2]));
  const Node* relu = relu_after(plan, node);
  k->relu = relu != nullptr;
  const memory::desc md(dims_of(xs), type, memory::format_tag::acdb);
  const ArgRef x = plan.get(node.inputs[0], md);
  const ArgRef y = plan.new_buffer(md);
  const VectorIsa isa = vector_isa();
  const SampleFn<T> run = sample_for<T>(isa);
  const std::int64_t samples = xs[0], sample = k->positions * k->channels;
  // Each sample's statistics in a region of a plan buffer (nothing allocated per batch): its
  // channel sums in double, then the float runs, scales and shifts; 6 floats a channel, so that
  // every region starts 8-byte aligned.
  const std::int64_t region = 6 * k->channels;
  const ArgRef scratch = plan.new_buffer(plain({samples * region}, dt::f32));
  plan.add_kernel(
      [k, run, samples, sample, region](std::byte* const* p) {
        const auto* in = reinterpret_cast<const T*>(p[0]);
        auto* out = reinterpret_cast<T*>(p[1]);
        auto* stats = reinterpret_cast<float*>(p[2]);
        const std::int64_t c = k->channels;
        oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, samples, 1),
                                  [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
                                    for (std::int64_t s = r.begin(); s != r.end(); ++s) {
                                      float* at = stats + s * region;
                                      run(*k, in + s * sample, out + s * sample, at + 2 * c,
                                          reinterpret_cast<double*>(at), at + 3 * c, at + 4 * c);
                                    }
                                  });
      },
      {x, y, scratch},
      fmt::format("{}{} (channels-last, {}{})", node.describe(),
                  relu ? " + " + relu->describe() : std::string(), isa_name(isa),
                  type == dt::bf16 ? ", bf16" : ""));
  if (relu != nullptr) {
    plan.set(relu->outputs[0], y);
    plan.skip(relu->name);
  } else {
    plan.set(node.outputs[0], y);
  }
}

// Two ways: "channels_last" (kdflow's kernel over a 4-D f32 or bf16 input as convolutions leave
// it, channels-last in and out, a Relu that alone reads it taken in; first where the input lies
// so) and "rows" (oneDNN's layer normalization over plain rows, then the scale and bias).
void lower_group_norm(Lowering& plan, const Node& node) {
  std::vector<std::string> ways = {"rows"};
  const auto type = channels_last_norm_type(plan, node);
  if (type) {
    const Shape& xs = plan.graph().shape(node.inputs[0]);
    const bool lies_so = plan.view_at(node.inputs[0]).md ==
                         memory::desc(dims_of(xs), *type, memory::format_tag::acdb);
    ways.insert(lies_so ? ways.begin() : ways.end(), "channels_last");
  }
  if (plan.choose(node, std::move(ways)) != "channels_last") return rows_group_norm(plan, node);
  if (*type == dt::bf16) return channels_last_group_norm<Bf16>(plan, node, *type);
  channels_last_group_norm<float>(plan, node, *type);
}

constexpr OpDef kOps[] = {
    {.name = "LayerNormalization",
     .min_inputs = 2,
     .float_inputs = 3,
     .infer = infer_layer_norm,
     .evaluate = evaluate_layer_norm,
     .lower = lower_layer_norm,
     .training_outputs = true},
    {.name = "InstanceNormalization",
     .min_inputs = 3,
     .float_inputs = 3,
     .infer = infer_group_norm,
     .evaluate = evaluate_group_norm,
     .lower = lower_group_norm},
    {.name = "GroupNormalization",
     .min_inputs = 3,
     .float_inputs = 3,
     .infer = infer_group_norm,
     .evaluate = evaluate_group_norm,
     .lower = lower_group_norm},
};

} // namespace

std::span<const OpDef> norm_ops() { return kOps; }

ArgRef per_channel_affine(Lowering& plan, ArgRef x, const Shape& xs, std::vector<float> scale,
                          std::vector<float> shift, const std::string& label) {
  const dt type = x.md.get_data_type();
  const std::int64_t n = xs[0], c = xs[1], positions = numel(xs) / (xs[0] * xs[1]);
  // [N, C] where there are no positions: [1, C, 1] against [N, C, 1] gave wrong products for all
  // channels but the first here (oneDNN 3.2, AVX2; the batchnorm_rank2_after_gemm fixture).
  const memory::desc x3 = positions > 1 ? plain({n, c, positions}, type) : plain({n, c}, type);
  const memory::desc per_c = positions > 1 ? plain({1, c, 1}, dt::f32) : plain({1, c}, dt::f32);
  dnnl::post_ops po;
  po.append_binary(dnnl::algorithm::binary_add, per_c);
  dnnl::primitive_attr attr = Lowering::plain_attr();
  attr.set_post_ops(po);
  const auto pd =
      dnnl::binary::primitive_desc(plan.eng(), dnnl::algorithm::binary_mul, x3, per_c, x3, attr);
  x.md = x3;
  const ArgRef dst = plan.new_buffer(x3);
  plan.add_primitive(dnnl::binary(pd),
                     {{DNNL_ARG_SRC_0, x},
                      {DNNL_ARG_SRC_1, plan.weight(std::move(scale), per_c, per_c)},
                      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                       plan.weight(std::move(shift), per_c, per_c)},
                      {DNNL_ARG_DST, dst}},
                     label, pd.scratchpad_desc());
  return ArgRef{dst.kind, dst.index, dst.offset, plain(xs, type)};
}

} // namespace kdflow::teacher
