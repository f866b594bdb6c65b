// Pooling (MaxPool, AveragePool, GlobalAveragePool: oneDNN's pooling) and the reductions (oneDNN's
// reduction, or its pooling over a 4-D tensor's map), with the reference loops they are checked
// against.
#include "bf16.hpp"
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <string>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

// --- windows -------------------------------------------------------------------------------------

struct Pooling {
  bool max;    // MaxPool; else an average
  bool global; // the window is the whole map
};
constexpr Pooling kMaxPool{true, false}, kAveragePool{false, false},
    kGlobalAveragePool{false, true};

template <const Pooling& P>
std::vector<InferredOutput> infer_pool(Node& node, const InferArgs& a) {
  const auto kernel = node.ints_attr("kernel_shape");
  if (kernel.size() != 2) bad(node, "kernel_shape must have 2 entries");
  if (!P.max && node.has("dilations") &&
      node.ints_attr("dilations") != std::vector<std::int64_t>{1, 1})
    bad(node, "dilated AveragePool is not supported");
  if (node.has("storage_order") && node.int_attr("storage_order", 0) != 0)
    bad(node, "storage_order = 1 is not supported");
  normalize_window(node, a.in[0], kernel);
  const bool ceil_mode = node.int_attr("ceil_mode", 0) != 0;
  node.attrs["ceil_mode"] = int_attribute(ceil_mode);
  node.attrs["count_include_pad"] = int_attribute(node.int_attr("count_include_pad", 0));
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  const Shape& x = a.in[0];
  Shape out = {x[0], x[1], out_extent(x[2], kernel[0], s[0], d[0], p[0], p[2], ceil_mode),
               out_extent(x[3], kernel[1], s[1], d[1], p[1], p[3], ceil_mode)};
  if (out[2] <= 0 || out[3] <= 0) bad(node, "output would be empty");
  if (node.outputs.size() > 1) bad(node, "the Indices output of MaxPool is not supported");
  return {{out, ElemType::f32}};
}

std::vector<InferredOutput> infer_global_pool(Node& node, const InferArgs& a) {
  if (a.in[0].size() != 4) bad(node, "only NCHW inputs are supported");
  return {{{a.in[0][0], a.in[0][1], 1, 1}, ElemType::f32}};
}

struct Window {
  Shape kernel, strides, dilations, pads;
};
template <const Pooling& P>
Window window_of(const Node& node, const Shape& xs) {
  if (P.global) return {{xs[2], xs[3]}, {1, 1}, {1, 1}, {0, 0, 0, 0}};
  return {node.ints_attr("kernel_shape"), node.ints_attr("strides"),
          node.ints_attr("dilations", {1, 1}), node.ints_attr("pads")};
}

template <const Pooling& P>
std::vector<Tensor> evaluate_pool(const Node& node, const std::vector<const Tensor*>& x,
                                  const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const Shape& xs = x[0]->shape;
  const auto [k, s, d, p] = window_of<P>(node, xs);
  const bool include_pad = node.int_attr("count_include_pad", 0) != 0;
  const bool is_max = P.max;
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  for (std::int64_t nc = 0; nc < xs[0] * xs[1]; ++nc)
    for (std::int64_t oy = 0; oy < os[2]; ++oy)
      for (std::int64_t ox = 0; ox < os[3]; ++ox) {
        const std::int64_t y0 = oy * s[0] - p[0], x0 = ox * s[1] - p[1];
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0;
        std::int64_t count = 0;
        for (std::int64_t ky = 0; ky < k[0]; ++ky)
          for (std::int64_t kx = 0; kx < k[1]; ++kx) {
            const std::int64_t iy = y0 + ky * d[0], ix = x0 + kx * d[1];
            if (iy < 0 || iy >= xs[2] || ix < 0 || ix >= xs[3]) continue;
            const double v = x[0]->f[static_cast<std::size_t>((nc * xs[2] + iy) * xs[3] + ix)];
            acc = is_max ? std::max(acc, v) : acc + v;
            ++count;
          }
        if (!is_max) {
          if (include_pad) { // the window clipped to the padded input (ONNX Runtime, PyTorch)
            const std::int64_t ye = std::min(y0 + k[0], xs[2] + p[2]),
                               xe = std::min(x0 + k[1], xs[3] + p[3]);
            count = (ye - y0) * (xe - x0);
          }
          acc /= static_cast<double>(std::max<std::int64_t>(count, 1));
        }
        r[static_cast<std::size_t>((nc * os[2] + oy) * os[3] + ox)] = static_cast<float>(acc);
      }
  return {Tensor::floats(os, std::move(r))};
}

template <const Pooling& P>
void lower_pool(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const auto [k, s, d, pads] = window_of<P>(node, xs);
  memory::dims pr(2);
  bool overhang = false;
  for (int a = 0; a < 2; ++a) {
    const std::int64_t eff = (k[a] - 1) * d[a] + 1;
    pr[a] = std::max<std::int64_t>(pads[a + 2], (os[2 + a] - 1) * s[a] + eff - xs[2 + a] - pads[a]);
    overhang = overhang || pr[a] > pads[a + 2];
  }
  dnnl::algorithm alg = dnnl::algorithm::pooling_max;
  if (!P.max) {
    const bool include = node.int_attr("count_include_pad", 0) != 0;
    if (include && overhang)
      plan.fail(node, "count_include_pad with ceil_mode windows past the padding is not supported");
    alg = include ? dnnl::algorithm::pooling_avg_include_padding
                  : dnnl::algorithm::pooling_avg_exclude_padding;
  }
  const memory::desc src_md = plan.at(node.inputs[0]).md;
  const memory::desc dst_any(dims_of(os), src_md.get_data_type(), memory::format_tag::any);
  // (Plain dims, not the structured bindings: a lambda may not capture those before C++20's
  // clang 16.)
  const memory::dims strides = {s[0], s[1]}, kernel = {k[0], k[1]}, dilation = {d[0] - 1, d[1] - 1},
                     pl = {pads[0], pads[1]};
  const auto make = [&](const memory::desc& from) {
    return dnnl::pooling_forward::primitive_desc(plan.eng(), dnnl::prop_kind::forward_inference,
                                                 alg, from, dst_any, strides, kernel, dilation, pl,
                                                 pr, Lowering::plain_attr());
  };
  // oneDNN's pooling kernels for plain NCHW input are its simple loop or reference one (an
  // AlexNet's first pool after its im2col convolution, which writes NCHW: 63.3 ms of a 357 ms
  // batch at 224 on AVX2, batch 64, 2 threads). Where the input lies so and oneDNN has a jit kernel
  // for channels-last input, "channels_last" (the input copied channels-last, then that kernel)
  // is offered first and "input_layout" (the pool where the input lies) after it; elsewhere the
  // pool runs where its input lies.
  auto pd = make(src_md);
  const auto slow = [](const char* impl) {
    const std::string_view name(impl);
    return name.starts_with("simple") || name.starts_with("ref");
  };
  if (slow(pd.impl_info_str()) && xs.size() == 4) {
    try {
      auto cl = make(memory::desc(dims_of(xs), src_md.get_data_type(), memory::format_tag::acdb));
      if (!slow(cl.impl_info_str()) &&
          plan.choose(node, {"channels_last", "input_layout"}) == "channels_last")
        pd = std::move(cl);
    } catch (const dnnl::error&) {
    }
  }
  const ArgRef src = plan.get(node.inputs[0], pd.src_desc());
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  plan.add_primitive(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                     node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// --- ReduceMean, ReduceL2, ReduceSum, ReduceMax -------------------------------------------------

// What distinguishes the reductions: oneDNN's algorithm (and its p for the L2 norm), the opset
// from which the axes are an input, and the accumulation (the reference's and the rows kernel's).
struct ReduceKind {
  dnnl::algorithm algorithm;
  float p;
  std::int64_t axes_input_since;
  enum class Accumulate { sum, sum_of_squares, max } accumulate;
  double (*finish)(double acc, double n);
  bool poolable; // over a 4-D map: also oneDNN's average pooling
};

// The accumulation's start and step, in the accumulator's type (double for the reference, float
// lanes in the rows kernel): spelled out, so that the rows kernel's inner loop inlines it.
template <const ReduceKind& R, typename T>
constexpr T accumulate_init() {
  return R.accumulate == ReduceKind::Accumulate::max ? -std::numeric_limits<T>::infinity() : T(0);
}
template <const ReduceKind& R, typename T>
constexpr T accumulate(T acc, T x) {
  if constexpr (R.accumulate == ReduceKind::Accumulate::sum_of_squares)
    return acc + x * x;
  else if constexpr (R.accumulate == ReduceKind::Accumulate::max)
    return std::max(acc, x);
  else
    return acc + x;
}

constexpr ReduceKind kReduceMean{
    dnnl::algorithm::reduction_mean,          0.f, 18, ReduceKind::Accumulate::sum,
    [](double a, double n) { return a / n; }, true};
constexpr ReduceKind kReduceL2{
    dnnl::algorithm::reduction_norm_lp_sum,        2.f,  18, ReduceKind::Accumulate::sum_of_squares,
    [](double a, double) { return std::sqrt(a); }, false};
constexpr ReduceKind kReduceSum{
    dnnl::algorithm::reduction_sum,     0.f,  13, ReduceKind::Accumulate::sum,
    [](double a, double) { return a; }, false};
constexpr ReduceKind kReduceMax{
    dnnl::algorithm::reduction_max,     0.f,  18, ReduceKind::Accumulate::max,
    [](double a, double) { return a; }, false};

// The axes are an attribute before the op's axes_input_since and a constant input from it; both
// become sorted, non-negative `axes` (all axes when none are given, none under
// noop_with_empty_axes), and keepdims is written out.
template <const ReduceKind& R>
std::vector<InferredOutput> infer_reduce(Node& node, const InferArgs& a) {
  std::vector<std::int64_t> axes;
  if (a.opset >= R.axes_input_since && has_input(node, 1))
    axes = need_constant(node, a.constants, 1, "axes").as_ints();
  else
    axes = node.ints_attr("axes");
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  if (axes.empty() && node.int_attr("noop_with_empty_axes", 0) == 0) {
    axes.resize(static_cast<std::size_t>(rank));
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto& x : axes) x = norm_axis(node, x, rank);
  std::sort(axes.begin(), axes.end());
  const bool keep = node.int_attr("keepdims", 1) != 0;
  node.attrs["axes"] = ints_attribute(axes);
  node.attrs["keepdims"] = int_attribute(keep);
  Shape out;
  for (std::int64_t d = 0; d < rank; ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced)
      out.push_back(a.in[0][static_cast<std::size_t>(d)]);
    else if (keep)
      out.push_back(1);
  }
  return {{out, ElemType::f32}};
}

// The input's shape with the reduced axes kept as 1.
Shape kept_shape(const Node& node, const Shape& xs) {
  Shape kept = xs;
  for (const auto a : node.ints_attr("axes")) kept[static_cast<std::size_t>(a)] = 1;
  return kept;
}

template <const ReduceKind& R>
std::vector<Tensor> evaluate_reduce(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const Shape kept = kept_shape(node, xs);
  std::vector<double> acc(static_cast<std::size_t>(numel(kept)), accumulate_init<R, double>());
  const Shape ks = strides_of(kept);
  for_each_index(xs, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t o = 0;
    for (std::size_t dd = 0; dd < idx.size(); ++dd) o += (kept[dd] == 1 ? 0 : idx[dd]) * ks[dd];
    acc[static_cast<std::size_t>(o)] = accumulate<R, double>(acc[static_cast<std::size_t>(o)],
                                                             x[0]->f[static_cast<std::size_t>(k)]);
  });
  const double n = static_cast<double>(numel(xs)) / static_cast<double>(numel(kept));
  std::vector<float> r(acc.size());
  for (std::size_t k = 0; k < r.size(); ++k) r[k] = static_cast<float>(R.finish(acc[k], n));
  return {Tensor::floats(outs[0].shape, std::move(r))};
}

// One row's accumulation: blocks of 256 values in eight float32 lanes (kept in vector registers,
// 32 values a lane), each block's lanes folded into a double, as the reference accumulates in
// double (a lane's float32 sum of 32 values stays within a few 1e-7 of the exact one).
template <const ReduceKind& R, typename T>
double reduce_row(const T* row, std::int64_t len) {
  constexpr int kLanes = 8;
  constexpr std::int64_t kBlock = 256;
  double acc = accumulate_init<R, double>();
  for (std::int64_t i = 0; i < len;) {
    const std::int64_t end = std::min(len, i + kBlock);
    float lane[kLanes];
    std::fill(lane, lane + kLanes, accumulate_init<R, float>());
    for (; i + kLanes <= end; i += kLanes)
      for (int j = 0; j < kLanes; ++j)
        lane[j] = accumulate<R, float>(lane[j], to_float(row[i + j]));
    for (; i < end; ++i) lane[0] = accumulate<R, float>(lane[0], to_float(row[i]));
    // Lanes merge by the same step but for the squares: a partial sum of squares adds as is.
    for (const float v : lane)
      acc = R.accumulate == ReduceKind::Accumulate::max ? std::max(acc, static_cast<double>(v))
                                                        : acc + v;
  }
  return acc;
}

// One [len, inner] slab reduced over its rows into `inner` outputs: columns in chunks of 256,
// each chunk's rows added in float32 in blocks of 32 (along the columns as they lie, so the loop
// vectorizes), each block folded into a double per column, as reduce_row does along a row.
template <const ReduceKind& R, typename T>
void reduce_columns(const T* x, std::int64_t len, std::int64_t inner, T* y) {
  constexpr std::int64_t kChunk = 256, kBlock = 32;
  float part[kChunk];
  double acc[kChunk];
  for (std::int64_t c0 = 0; c0 < inner; c0 += kChunk) {
    const std::int64_t width = std::min(kChunk, inner - c0);
    std::fill(acc, acc + width, accumulate_init<R, double>());
    for (std::int64_t r0 = 0; r0 < len; r0 += kBlock) {
      std::fill(part, part + width, accumulate_init<R, float>());
      for (std::int64_t r = r0; r < std::min(len, r0 + kBlock); ++r) {
        const T* row = x + r * inner + c0;
        for (std::int64_t j = 0; j < width; ++j)
          part[j] = accumulate<R, float>(part[j], to_float(row[j]));
      }
      for (std::int64_t j = 0; j < width; ++j)
        acc[j] = R.accumulate == ReduceKind::Accumulate::max
                     ? std::max(acc[j], static_cast<double>(part[j]))
                     : acc[j] + part[j];
    }
    for (std::int64_t j = 0; j < width; ++j)
      put(y[c0 + j], static_cast<float>(R.finish(acc[j], static_cast<double>(len))));
  }
}

// The reduction over consecutive axes of a plain [outer, len, inner] tensor as kdflow's kernel,
// in T (f32, or bf16 in a bf16 plan, accumulated in f32 and double as above and rounded once):
// each outer index's slab in turn, rows (inner == 1) by reduce_row, columns by reduce_columns.
template <const ReduceKind& R, typename T>
void add_reduce_kernel(Lowering& plan, const Node& node, const ArgRef& src, const ArgRef& dst,
                       std::int64_t outer, std::int64_t len, std::int64_t inner) {
  plan.add_kernel(
      [outer, len, inner](std::byte* const* p) {
        const auto* x = reinterpret_cast<const T*>(p[0]);
        auto* y = reinterpret_cast<T*>(p[1]);
        if (inner == 1) {
          oneapi::tbb::parallel_for(
              oneapi::tbb::blocked_range<std::int64_t>(0, outer),
              [&](const oneapi::tbb::blocked_range<std::int64_t>& range) {
                for (std::int64_t r = range.begin(); r != range.end(); ++r)
                  put(y[r], static_cast<float>(R.finish(reduce_row<R>(x + r * len, len),
                                                        static_cast<double>(len))));
              });
          return;
        }
        oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, outer),
                                  [&](const oneapi::tbb::blocked_range<std::int64_t>& range) {
                                    for (std::int64_t o = range.begin(); o != range.end(); ++o)
                                      reduce_columns<R>(x + o * len * inner, len, inner,
                                                        y + o * inner);
                                  });
      },
      {src, dst}, node.describe());
}

// ReduceMean's result as its output: the reduced tensor keeps the reduced axes as extent 1; with
// keepdims = 0 the output is the same bytes seen without them, which needs them in plain order.
void set_reduced(Lowering& plan, const Node& node, const ArgRef& reduced, const Shape& kept) {
  const Graph& g = plan.graph();
  const Shape& os = g.shape(node.outputs[0]);
  if (os == kept) return plan.set(node.outputs[0], reduced);
  const dt type = reduced.md.get_data_type();
  ArgRef flat = reduced;
  if (reduced.md != plain(kept, type)) {
    flat = plan.new_buffer(plain(kept, type));
    plan.add_reorder(reduced, flat, node.outputs[0]);
  }
  flat.md = plain(os, type);
  plan.set(node.outputs[0], flat);
}

// A reduction runs as oneDNN's reduction, or, for a mean over the two spatial axes of a 4-D tensor
// (a global average pool: squeeze-and-excitation blocks, heads), as its average pooling; each
// reads the input in the layout it has where oneDNN has a kernel for that (the tuner picks
// between them).
template <const ReduceKind& R>
void lower_reduce(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const dt act = plan.type_of(node.outputs[0]); // the input's type: bf16, or f32 where it is wide
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape kept = kept_shape(node, xs);
  if (kept == xs) { // every reduced axis has extent 1: a view
    const ArgRef src = plan.get_plain(node.inputs[0], act);
    plan.set(node.outputs[0],
             ArgRef{src.kind, src.index, src.offset, plain(g.shape(node.outputs[0]), act)});
    return;
  }
  const memory::desc src_md = plan.at(node.inputs[0]).md;
  const memory::desc dst_any(dims_of(kept), act, memory::format_tag::any);
  // Pooling is offered only where oneDNN builds it: in the input's own layout, else a plain one
  // (oneDNN 3.2 has no bf16 average pooling for some layouts on AVX-512 cores without AMX).
  std::optional<dnnl::pooling_forward::primitive_desc> pool;
  if (R.poolable && xs.size() == 4 && kept == Shape{xs[0], xs[1], 1, 1}) {
    for (const memory::desc& from : {src_md, plain(xs, act)}) {
      try {
        pool.emplace(plan.eng(), dnnl::prop_kind::forward_inference,
                     dnnl::algorithm::pooling_avg_exclude_padding, from, dst_any,
                     memory::dims{1, 1}, memory::dims{xs[2], xs[3]}, memory::dims{0, 0},
                     memory::dims{0, 0}, memory::dims{0, 0}, Lowering::plain_attr());
        break;
      } catch (const dnnl::error&) {
      }
    }
  }
  std::vector<std::string> ways;
  if (pool) ways.emplace_back("pooling");
  ways.emplace_back("reduction");
  if (plan.choose(node, std::move(ways)) == "pooling") {
    const auto& pd = *pool;
    const ArgRef src = plan.get(node.inputs[0], pd.src_desc());
    const ArgRef dst = plan.new_buffer(pd.dst_desc());
    plan.add_primitive(dnnl::pooling_forward(pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                       node.describe(), pd.scratchpad_desc());
    return set_reduced(plan, node, dst, kept);
  }
  // The input's own layout where oneDNN reduces it; plain where it does not.
  std::optional<dnnl::reduction::primitive_desc> pd;
  try {
    pd.emplace(plan.eng(), R.algorithm, src_md, dst_any, R.p, 0.f, Lowering::plain_attr());
  } catch (const dnnl::error&) {
    pd.emplace(plan.eng(), R.algorithm, plain(xs, act), plain(kept, act), R.p, 0.f,
               Lowering::plain_attr());
  }
  // Over consecutive axes (a norm or mean per row: Swin V2's cosine attention; a mean over the
  // middle axis: a classifier's pooling over the tokens of [N, T, D]) where oneDNN has only its
  // reference implementation: kdflow's kernel over the plain tensor as [outer, len, inner].
  const auto axes = node.ints_attr("axes");
  bool consecutive = !axes.empty();
  for (std::size_t k = 1; k < axes.size(); ++k)
    consecutive = consecutive && axes[k] == axes[0] + static_cast<std::int64_t>(k);
  if (consecutive && std::string(pd->impl_info_str()).rfind("ref", 0) == 0) {
    const auto first = static_cast<std::size_t>(axes.front());
    const auto last = static_cast<std::size_t>(axes.back()) + 1;
    const std::int64_t outer = numel(Shape(xs.begin(), xs.begin() + first));
    const std::int64_t len = numel(Shape(xs.begin() + first, xs.begin() + last));
    const std::int64_t inner = numel(Shape(xs.begin() + last, xs.end()));
    const dt type = act == dt::bf16 ? dt::bf16 : dt::f32;
    const ArgRef src = plan.get_plain(node.inputs[0], type);
    const ArgRef dst = plan.new_buffer(plain(kept, type));
    if (type == dt::bf16)
      add_reduce_kernel<R, Bf16>(plan, node, src, dst, outer, len, inner);
    else
      add_reduce_kernel<R, float>(plan, node, src, dst, outer, len, inner);
    return set_reduced(plan, node, dst, kept);
  }
  const ArgRef src = plan.get(node.inputs[0], pd->src_desc());
  const ArgRef dst = plan.new_buffer(pd->dst_desc());
  plan.add_primitive(dnnl::reduction(*pd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}},
                     node.describe(), pd->scratchpad_desc());
  set_reduced(plan, node, dst, kept);
}

constexpr OpDef kOps[] = {
    {.name = "MaxPool",
     .float_inputs = 1,
     .infer = infer_pool<kMaxPool>,
     .evaluate = evaluate_pool<kMaxPool>,
     .lower = lower_pool<kMaxPool>},
    {.name = "AveragePool",
     .float_inputs = 1,
     .infer = infer_pool<kAveragePool>,
     .evaluate = evaluate_pool<kAveragePool>,
     .lower = lower_pool<kAveragePool>},
    {.name = "GlobalAveragePool",
     .float_inputs = 1,
     .infer = infer_global_pool,
     .evaluate = evaluate_pool<kGlobalAveragePool>,
     .lower = lower_pool<kGlobalAveragePool>},
    {.name = "ReduceMean",
     .float_inputs = 1,
     .infer = infer_reduce<kReduceMean>,
     .evaluate = evaluate_reduce<kReduceMean>,
     .lower = lower_reduce<kReduceMean>},
    {.name = "ReduceL2",
     .float_inputs = 1,
     .infer = infer_reduce<kReduceL2>,
     .evaluate = evaluate_reduce<kReduceL2>,
     .lower = lower_reduce<kReduceL2>},
    {.name = "ReduceSum",
     .float_inputs = 1,
     .infer = infer_reduce<kReduceSum>,
     .evaluate = evaluate_reduce<kReduceSum>,
     .lower = lower_reduce<kReduceSum>},
    {.name = "ReduceMax",
     .float_inputs = 1,
     .infer = infer_reduce<kReduceMax>,
     .evaluate = evaluate_reduce<kReduceMax>,
     .lower = lower_reduce<kReduceMax>},
};

} // namespace

std::span<const OpDef> pool_ops() { return kOps; }

} // namespace kdflow::teacher
