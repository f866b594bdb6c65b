// Ops that move data without arithmetic: views (Flatten, Reshape, Squeeze, Unsqueeze, Identity,
// Dropout: the same bytes with another shape), Transpose, Concat, Split, Slice and Pad. Reorders
// and views where oneDNN can; a constant Pad as a reorder into the padded buffer and a fill of its
// border; reference loops for negative Slice steps and the other Pads.
#include "bf16.hpp"
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"
#include "simd.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

namespace kdflow::teacher {
namespace {

// --- views ---------------------------------------------------------------------------------------

std::vector<InferredOutput> infer_flatten(Node& node, const InferArgs& args) {
  const Shape& x = args.in[0];
  const auto rank = static_cast<std::int64_t>(x.size());
  const std::int64_t axis =
      node.int_attr("axis", 1) < 0 ? node.int_attr("axis", 1) + rank : node.int_attr("axis", 1);
  if (axis < 0 || axis > rank) bad(node, "axis out of range");
  node.attrs["axis"] = int_attribute(axis);
  std::int64_t a = 1, b = 1;
  for (std::int64_t d = 0; d < rank; ++d) (d < axis ? a : b) *= x[static_cast<std::size_t>(d)];
  return {{{a, b}, args.types[0]}};
}

std::vector<InferredOutput> infer_reshape(Node& node, const InferArgs& a) {
  const Shape& x = a.in[0];
  const auto spec = need_constant(node, a.constants, 1, "shape").as_ints();
  const bool allowzero = node.int_attr("allowzero", 0) != 0;
  Shape out(spec.size());
  std::int64_t known = 1;
  int infer_at = -1;
  for (std::size_t k = 0; k < spec.size(); ++k) {
    if (spec[k] == -1) {
      if (infer_at >= 0) bad(node, "more than one -1 in the target shape");
      infer_at = static_cast<int>(k);
      continue;
    }
    if (spec[k] < -1) bad(node, fmt::format("target dimension {} is negative", spec[k]));
    out[k] = spec[k] == 0 && !allowzero ? (k < x.size() ? x[k] : 0) : spec[k];
    if (__builtin_mul_overflow(known, out[k], &known))
      bad(node, "the target shape has more elements than can be addressed");
  }
  if (infer_at >= 0) out[static_cast<std::size_t>(infer_at)] = known == 0 ? 0 : numel(x) / known;
  if (numel(out) != numel(x))
    bad(node, fmt::format("cannot reshape {} into {}", format_shape(x), format_shape(out)));
  return {{out, a.types[0]}};
}

// The axes are an attribute before opset 13 and a constant input since.
std::vector<std::int64_t> squeeze_axes(const Node& node, const InferArgs& a) {
  if (a.opset >= 13 && has_input(node, 1))
    return need_constant(node, a.constants, 1, "axes").as_ints();
  return node.ints_attr("axes");
}

std::vector<InferredOutput> infer_unsqueeze(Node& node, const InferArgs& a) {
  auto axes = squeeze_axes(node, a);
  const auto rank = static_cast<std::int64_t>(a.in[0].size() + axes.size());
  for (auto& x : axes) x = norm_axis(node, x, rank);
  Shape out;
  std::size_t next = 0;
  for (std::int64_t d = 0; d < rank; ++d)
    out.push_back(std::find(axes.begin(), axes.end(), d) != axes.end() ? 1 : a.in[0][next++]);
  return {{out, a.types[0]}};
}

std::vector<InferredOutput> infer_squeeze(Node& node, const InferArgs& a) {
  auto axes = squeeze_axes(node, a);
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  for (auto& x : axes) x = norm_axis(node, x, rank);
  Shape out;
  for (std::int64_t d = 0; d < rank; ++d) {
    const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
    const std::int64_t dim = a.in[0][static_cast<std::size_t>(d)];
    if (listed && dim != 1) bad(node, fmt::format("cannot squeeze axis {} of size {}", d, dim));
    if (!(listed || (axes.empty() && dim == 1))) out.push_back(dim);
  }
  return {{out, a.types[0]}};
}

std::vector<Tensor> evaluate_view(const Node&, const std::vector<const Tensor*>& x,
                                  const std::vector<InferredOutput>& outs) {
  Tensor r = *x[0];
  r.shape = outs[0].shape;
  return {r};
}

// The input's bytes, plain (reordered once if a primitive left them blocked), seen with the
// output's shape; a view of them, or of bytes in another plain strided layout (channels-last),
// stays one (Lowering::view_reshaped).
void lower_view(Lowering& plan, const Node& node) {
  const std::string& in = node.inputs[0];
  const memory::desc& md = plan.view_at(in).md;
  if ((plan.is_view(in) || md != plain(plan.graph().shape(in), md.get_data_type())) &&
      plan.view_reshaped(node))
    return;
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  const ArgRef src = plan.get_plain(node.inputs[0], type);
  plan.set(node.outputs[0], ArgRef{src.kind, src.index, src.offset,
                                   plain(plan.graph().shape(node.outputs[0]), type)});
}

// --- Transpose -----------------------------------------------------------------------------------

std::vector<InferredOutput> infer_transpose(Node& node, const InferArgs& a) {
  const auto rank = a.in[0].size();
  auto perm = node.ints_attr("perm");
  if (perm.empty())
    for (std::size_t k = 0; k < rank; ++k) perm.push_back(static_cast<std::int64_t>(rank - 1 - k));
  if (perm.size() != rank) bad(node, "perm has the wrong length");
  std::vector<bool> seen(rank, false);
  for (const auto p : perm) {
    if (p < 0 || p >= static_cast<std::int64_t>(rank) || seen[static_cast<std::size_t>(p)])
      bad(node,
          fmt::format("perm {} is not a permutation of the {} axes", format_shape(perm), rank));
    seen[static_cast<std::size_t>(p)] = true;
  }
  node.attrs["perm"] = ints_attribute(perm);
  Shape out(rank);
  for (std::size_t k = 0; k < rank; ++k) out[k] = a.in[0][static_cast<std::size_t>(perm[k])];
  return {{out, a.types[0]}};
}

std::vector<Tensor> evaluate_transpose(const Node& node, const std::vector<const Tensor*>& x,
                                       const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const auto perm = node.ints_attr("perm");
  const Shape st = strides_of(x[0]->shape);
  Tensor r = *x[0];
  r.shape = os;
  for_each_index(os, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t src = 0;
    for (std::size_t dd = 0; dd < idx.size(); ++dd)
      src += idx[dd] * st[static_cast<std::size_t>(perm[dd])];
    if (r.type == ElemType::f32)
      r.f[static_cast<std::size_t>(k)] = x[0]->f[static_cast<std::size_t>(src)];
    else
      r.i[static_cast<std::size_t>(k)] = x[0]->i[static_cast<std::size_t>(src)];
  });
  return {r};
}

// The input as it lies (whatever layout its producer wrote), seen with permuted axes: where that
// is the output's plain layout already (a channels-last NCHW value transposed to NHWC; a MatMul's
// output, which matmul() writes so where this Transpose alone reads it) the output is the input's
// buffer, no copy, provided nothing else reads the input (so nothing can write
// the shared buffer in place under another reader); where the input is plain or a view, a view
// of it (Lowering::view_permuted: its reader reorders once, into the layout it wants); elsewhere
// one reorder into a plain output, straight from the input's layout (no plain copy of the input
// first).
void lower_transpose(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const std::string& in = node.inputs[0];
  const auto perm = node.ints_attr("perm");
  std::vector<int> inverse(perm.size());
  for (std::size_t k = 0; k < perm.size(); ++k)
    inverse[static_cast<std::size_t>(perm[k])] = static_cast<int>(k);
  if (!plan.is_view(in)) {
    const ArgRef cur = plan.at(in);
    const memory::desc out = plain(g.shape(node.outputs[0]), cur.md.get_data_type());
    if (cur.md.permute_axes(inverse) == out && cur.kind == ArgRef::Kind::buffer &&
        !g.is_output(in) && g.consumers(in).size() == 1)
      return plan.set(node.outputs[0], ArgRef{cur.kind, cur.index, cur.offset, out});
  }
  if (plan.view_permuted(node, perm)) return;
  const ArgRef src = plan.at(in); // a view's axes may not be the value's: copied out first
  const ArgRef dst = plan.new_buffer(plain(g.shape(node.outputs[0]), src.md.get_data_type()));
  plan.add_reorder(ArgRef{src.kind, src.index, src.offset, src.md.permute_axes(inverse)}, dst,
                   node.describe());
  plan.set(node.outputs[0], dst);
}

// --- Concat --------------------------------------------------------------------------------------

std::vector<InferredOutput> infer_concat(Node& node, const InferArgs& a) {
  const auto& in = a.in;
  const auto rank = static_cast<std::int64_t>(in[0].size());
  const std::int64_t axis = norm_axis(node, node.int_attr("axis", 0), rank);
  node.attrs["axis"] = int_attribute(axis);
  Shape out = in[0];
  for (std::size_t k = 1; k < in.size(); ++k) {
    if (in[k].size() != in[0].size()) bad(node, "inputs differ in rank");
    for (std::int64_t d = 0; d < rank; ++d)
      if (d != axis && in[k][static_cast<std::size_t>(d)] != in[0][static_cast<std::size_t>(d)])
        bad(node, "inputs differ outside the concatenation axis");
    out[static_cast<std::size_t>(axis)] += in[k][static_cast<std::size_t>(axis)];
  }
  return {{out, a.types[0]}};
}

std::vector<Tensor> evaluate_concat(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const auto axis = static_cast<std::size_t>(node.int_attr("axis", 0));
  const std::int64_t outer =
      numel(Shape(os.begin(), os.begin() + static_cast<std::ptrdiff_t>(axis)));
  Tensor r;
  r.type = x[0]->type;
  r.shape = os;
  for (std::int64_t o = 0; o < outer; ++o)
    for (const Tensor* t : x) {
      const std::int64_t chunk =
          numel(Shape(t->shape.begin() + static_cast<std::ptrdiff_t>(axis), t->shape.end()));
      if (r.type == ElemType::f32) {
        if (t->type != ElemType::f32) bad(node, "inputs differ in type");
        r.f.insert(r.f.end(), t->f.begin() + o * chunk, t->f.begin() + (o + 1) * chunk);
      } else {
        for (std::int64_t q = 0; q < chunk; ++q) r.i.push_back(t->int_at(o * chunk + q));
      }
    }
  return {r};
}

// `md`'s order of axes (a plain strided layout: channels-last, say) for a dense tensor of
// `shape`, or nullopt (a blocked layout, another rank).
std::optional<memory::desc> dense_in_order_of(const memory::desc& md, const Shape& shape, dt type) {
  if (md.get_format_kind() != memory::format_kind::blocked || md.get_inner_nblks() != 0 ||
      static_cast<std::size_t>(md.get_ndims()) != shape.size())
    return std::nullopt;
  const memory::dims st = md.get_strides();
  std::vector<std::size_t> order(shape.size()); // outermost first
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return st[a] > st[b]; });
  memory::dims strides(shape.size());
  std::int64_t stride = 1;
  for (std::size_t k = order.size(); k-- > 0;) {
    strides[order[k]] = stride;
    stride *= shape[order[k]];
  }
  return memory::desc(dims_of(shape), type, strides);
}

// --- Concat with the per-channel affine of its reader ----------------------------------------

// A Concat over the channels of 4-D values read alone by a per-channel scale and shift (a
// BatchNormalization the passes made a depthwise 1x1 convolution: DenseNet's norm before each
// layer's convolution), with a Relu or nothing fused after it: that convolution, else nullptr.
// Its inputs, the concatenation and the convolution's output all in one type, f32 or (in bf16
// plans, where convolutions write bf16) bf16. Not in int8 plans or their calibration (the
// convolution is a product they quantize).
const Node* affine_after_concat(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const std::string& out = node.outputs[0];
  const Shape& os = g.shape(out);
  const dt type = plan.type_of(out);
  if (os.size() != 4 || node.int_attr("axis", 0) != 1 ||
      (plan.act() != dt::f32 && plan.act() != dt::bf16) || (type != dt::f32 && type != dt::bf16) ||
      g.is_output(out) || plan.is_feature(out) || plan.observing())
    return nullptr;
  for (const auto& in : node.inputs)
    if (g.is_constant(in) || plan.view_at(in).md.get_data_type() != type) return nullptr;
  const auto readers = g.consumers(out);
  if (readers.size() != 1) return nullptr;
  const Node& conv = g.nodes[readers[0]];
  using Ints = std::vector<std::int64_t>;
  const bool constant_bias =
      conv.inputs.size() < 3 || conv.inputs[2].empty() || g.is_constant(conv.inputs[2]);
  if (conv.op != "Conv" || conv.inputs[0] != out || !g.is_constant(conv.inputs[1]) ||
      !constant_bias || conv.int_attr("group", 1) != os[1] ||
      g.shape(conv.inputs[1]) != Shape{os[1], 1, 1, 1} || conv.ints_attr("strides") != Ints{1, 1} ||
      conv.ints_attr("pads") != Ints{0, 0, 0, 0} || conv.ints_attr("dilations") != Ints{1, 1} ||
      plan.quant_input(conv) || plan.type_of(conv.outputs[0]) != type)
    return nullptr;
  if (conv.post_ops.size() > 1 ||
      (conv.post_ops.size() == 1 &&
       (conv.post_ops[0].kind != PostOp::Kind::eltwise || conv.post_ops[0].op != "Relu")))
    return nullptr;
  return &conv;
}

struct ConcatAffine {
  std::vector<std::int64_t> channels; // each input's
  std::int64_t total = 0, pixels = 0;
  bool relu = false;
  std::vector<float> scale, shift; // per output channel
};

// Pixels [first, last) of the output: each input's channels of a pixel scaled, shifted (and
// clamped at 0) into their place in the output's row, as they lie (channels-last). T: the element
// type of the inputs and the output, f32 or bf16 (computed in f32, rounded once to bf16, as
// PyTorch's bf16 batch norm computes in f32 with its f32 parameters).
template <class T>
[[gnu::always_inline]] inline void concat_affine_rows(const ConcatAffine& k, std::byte* const* in,
                                                      T* out, std::int64_t first,
                                                      std::int64_t last) {
  for (std::int64_t px = first; px < last; ++px) {
    T* row = out + px * k.total;
    const float* a = k.scale.data();
    const float* b = k.shift.data();
    for (std::size_t i = 0; i < k.channels.size(); ++i) {
      const std::int64_t c = k.channels[i];
      const T* src = reinterpret_cast<const T*>(in[i]) + px * c;
      std::int64_t ch = 0;
      for (; ch + simd16::kLanes <= c; ch += simd16::kLanes) {
        simd16::Vec x, scale, shift;
        simd16::load(x, src + ch);
        simd16::load(scale, a + ch);
        simd16::load(shift, b + ch);
        x = x * scale + shift;
        if (k.relu) x = x < 0 ? simd16::Vec{} : x; // as std::max(x, 0.f): a NaN stays
        simd16::store(row + ch, x);
      }
      for (; ch < c; ++ch) {
        const float y = to_float(src[ch]) * a[ch] + b[ch];
        put(row[ch], k.relu ? std::max(y, 0.f) : y);
      }
      row += c;
      a += c;
      b += c;
    }
  }
}

template <class T>
using ConcatAffineFn = void (*)(const ConcatAffine&, std::byte* const*, T*, std::int64_t,
                                std::int64_t);
template <class T>
void concat_affine_baseline(const ConcatAffine& k, std::byte* const* in, T* out, std::int64_t first,
                            std::int64_t last) {
  concat_affine_rows(k, in, out, first, last);
}
#ifdef KD_TARGET_X86
template <class T>
KD_TARGET_AVX512 void concat_affine_avx512(const ConcatAffine& k, std::byte* const* in, T* out,
                                           std::int64_t first, std::int64_t last) {
  concat_affine_rows(k, in, out, first, last);
}
template <class T>
KD_TARGET_AVX2 void concat_affine_avx2(const ConcatAffine& k, std::byte* const* in, T* out,
                                       std::int64_t first, std::int64_t last) {
  concat_affine_rows(k, in, out, first, last);
}
#endif

template <class T>
ConcatAffineFn<T> concat_affine_for(VectorIsa isa) {
#ifdef KD_TARGET_X86
  if (isa == VectorIsa::avx512) return concat_affine_avx512<T>;
  if (isa == VectorIsa::avx2) return concat_affine_avx2<T>;
#endif
  (void)isa;
  return concat_affine_baseline<T>;
}

// The Concat and its reader `conv` (affine_after_concat) as one kdflow kernel: each input read
// channels-last (as convolutions and pooling leave them; copied so where one lies otherwise), the
// concatenation never written, the reader's output written channels-last; T as `type`.
template <class T>
void concat_affine(Lowering& plan, const Node& node, const Node& conv, dt type) {
  const Graph& g = plan.graph();
  const Shape& os = g.shape(node.outputs[0]);
  auto k = std::make_shared<ConcatAffine>();
  k->total = os[1];
  k->pixels = os[0] * os[2] * os[3];
  k->relu = !conv.post_ops.empty();
  k->scale = g.constants.at(conv.inputs[1]).f;
  k->shift = conv.inputs.size() > 2 && !conv.inputs[2].empty()
                 ? g.constants.at(conv.inputs[2]).f
                 : std::vector<float>(static_cast<std::size_t>(os[1]), 0.f);
  std::vector<ArgRef> operands;
  for (const auto& in : node.inputs) {
    const Shape& is = g.shape(in);
    k->channels.push_back(is[1]);
    operands.push_back(plan.get(in, memory::desc(dims_of(is), type, memory::format_tag::acdb)));
  }
  const ArgRef dst = plan.new_buffer(memory::desc(dims_of(os), type, memory::format_tag::acdb));
  operands.push_back(dst);
  const VectorIsa isa = vector_isa();
  const ConcatAffineFn<T> run = concat_affine_for<T>(isa);
  const std::size_t inputs = node.inputs.size();
  plan.set_kind("Concat (+ affine)");
  plan.add_kernel(
      [k, run, inputs](std::byte* const* p) { // the inputs' pointers, then the output's
        auto* out = reinterpret_cast<T*>(p[inputs]);
        oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, k->pixels, 256),
                                  [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
                                    run(*k, p, out, r.begin(), r.end());
                                  });
      },
      std::move(operands),
      fmt::format("{} + {} (channels-last, {}{})", node.describe(), conv.describe(), isa_name(isa),
                  type == dt::bf16 ? ", bf16" : ""));
  plan.set(conv.outputs[0], dst);
  plan.skip(conv.name);
}

// The plain strided layout a Concat's computed inputs share, where every one that is not a view
// lies densely in one axis order (channels-last after convolutions, say): that order over
// `shape`; nullopt where they lie in different orders or in a blocked layout, or where every
// input is a view or a constant.
std::optional<memory::desc> shared_layout(Lowering& plan, const Node& node, const Shape& shape,
                                          dt type) {
  const Graph& g = plan.graph();
  std::optional<memory::desc> shared;
  for (const auto& in : node.inputs) {
    if (g.is_constant(in) || plan.is_view(in)) continue;
    const memory::desc& md = plan.view_at(in).md;
    const auto order = dense_in_order_of(md, g.shape(in), type);
    if (!order || md != *order || (shared && *dense_in_order_of(*shared, g.shape(in), type) != md))
      return std::nullopt;
    if (!shared) shared = md;
  }
  if (!shared) return std::nullopt;
  return dense_in_order_of(*shared, shape, type);
}

// The layout the "slices" way writes a Concat in, where it is offered: some input is a view (a
// transpose's, a split's, a shuffle's), every input is computed (no constant) and of the
// concatenation's type; the layout the other inputs share, or plain where every input is a view.
std::optional<memory::desc> slices_layout(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const std::string& out = node.outputs[0];
  const dt type = plan.type_of(out);
  bool view = false, dense = false;
  for (const auto& in : node.inputs) {
    if (g.is_constant(in) || plan.view_at(in).md.get_data_type() != type) return std::nullopt;
    (plan.is_view(in) ? view : dense) = true;
  }
  if (!view) return std::nullopt;
  if (!dense) return plain(g.shape(out), type);
  return shared_layout(plan, node, g.shape(out), type);
}

// The Concat as one reorder per input straight into its slice of the concatenation (a window of
// the output's buffer, in `layout`): a view is read through its strides, so its bytes are copied
// once where the "concat" way copies them out into a buffer of their own and oneDNN's concat
// copies them again.
void slice_concat(Lowering& plan, const Node& node, const memory::desc& layout) {
  const Graph& g = plan.graph();
  const dt type = plan.type_of(node.outputs[0]);
  const auto axis = static_cast<std::size_t>(node.int_attr("axis", 0));
  const ArgRef dst = plan.new_buffer(layout);
  const memory::dims strides = layout.get_strides();
  std::int64_t along = 0;
  for (const auto& in : node.inputs) {
    const Shape& is = g.shape(in);
    if (numel(is) > 0) {
      ArgRef slice = dst;
      slice.offset +=
          static_cast<std::size_t>(along * strides[axis]) * memory::data_type_size(type);
      slice.md = memory::desc(dims_of(is), type, strides);
      plan.reorder_into(in, slice);
    }
    along += is[axis];
  }
  plan.set(node.outputs[0], dst);
}

void copy_concat(Lowering& plan, const Node& node);

// Ways: where a per-channel affine alone reads the concatenation (affine_after_concat),
// "concat_affine" (first: the concatenation is never written, the affine's own pass gone) and
// "concat" (oneDNN's concat, then the reader as a depthwise convolution); where an input is a view
// (slices_layout), "slices" (first: each input copied once, into its slice) and "concat" (each view
// copied out, then oneDNN's concat); elsewhere "concat" alone.
void lower_concat(Lowering& plan, const Node& node) {
  if (const Node* conv = affine_after_concat(plan, node); conv != nullptr) {
    if (plan.choose(node, {"concat_affine", "concat"}) != "concat_affine")
      return copy_concat(plan, node);
    const dt type = plan.type_of(node.outputs[0]);
    if (type == dt::bf16) return concat_affine<Bf16>(plan, node, *conv, type);
    return concat_affine<float>(plan, node, *conv, type);
  }
  if (const auto layout = slices_layout(plan, node);
      layout && plan.choose(node, {"slices", "concat"}) == "slices")
    return slice_concat(plan, node, *layout);
  copy_concat(plan, node);
}

void copy_concat(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  std::vector<memory::desc> mds;
  std::vector<ArgRef> srcs;
  // One element type for all (the output's: f32 where a parameter or an f32 input promotes, as
  // in PyTorch's cat): the odd ones converted.
  const dt type = plan.type_of(node.outputs[0]);
  // Views are copied out straight into the layout the other inputs share, where that is a plain
  // strided one of this type (oneDNN's concat copies rows where all lie alike; mixed layouts
  // take its reference loop).
  const std::optional<memory::desc> shared =
      shared_layout(plan, node, g.shape(node.inputs[0]), type);
  for (const auto& in : node.inputs) {
    const auto want = shared ? dense_in_order_of(*shared, g.shape(in), type) : std::nullopt;
    if (g.is_constant(in))
      srcs.push_back(plan.constant(in, g.shape(in), want.value_or(plain(g.shape(in), type))));
    else
      srcs.push_back(want && plan.is_view(in) ? plan.get(in, *want) : plan.at(in));
    if (srcs.back().md.get_data_type() != type) srcs.back() = plan.get_plain(in, type);
    mds.push_back(srcs.back().md);
  }
  const auto pd = dnnl::concat::primitive_desc(
      plan.eng(), static_cast<int>(node.int_attr("axis", 0)), mds, Lowering::plain_attr());
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  std::vector<std::pair<int, ArgRef>> args = {{DNNL_ARG_DST, dst}};
  for (std::size_t k = 0; k < srcs.size(); ++k)
    args.emplace_back(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k), srcs[k]);
  plan.add_primitive(dnnl::concat(pd), std::move(args), node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// --- Split and Slice: strided windows of the input -----------------------------------------------

std::vector<InferredOutput> infer_split(Node& node, const InferArgs& a) {
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  const std::int64_t axis = norm_axis(node, node.int_attr("axis", 0), rank);
  const std::int64_t total = a.in[0][static_cast<std::size_t>(axis)];
  std::vector<std::int64_t> split;
  if (a.opset >= 13 && has_input(node, 1))
    split = need_constant(node, a.constants, 1, "split").as_ints();
  else
    split = node.ints_attr("split");
  const auto n = static_cast<std::int64_t>(node.outputs.size());
  if (split.empty()) {
    const std::int64_t each = (total + n - 1) / n;
    for (std::int64_t k = 0; k < n; ++k) split.push_back(std::min(each, total - k * each));
  }
  if (static_cast<std::int64_t>(split.size()) != n ||
      std::accumulate(split.begin(), split.end(), std::int64_t{0}) != total)
    bad(node, "split sizes do not add up to the axis");
  node.attrs["axis"] = int_attribute(axis);
  node.attrs["split"] = ints_attribute(split);
  std::vector<InferredOutput> out;
  for (const auto s : split) {
    Shape o = a.in[0];
    o[static_cast<std::size_t>(axis)] = s;
    out.push_back({o, a.types[0]});
  }
  return out;
}

// Starts, ends, axes and steps are attributes before opset 10 and constant inputs since; they
// become a start and a step per axis (starts_full, steps_full), clamped as ONNX says.
std::vector<InferredOutput> infer_slice(Node& node, const InferArgs& a) {
  std::vector<std::int64_t> starts, ends, axes, steps;
  if (a.opset < 10) {
    starts = node.ints_attr("starts");
    ends = node.ints_attr("ends");
    axes = node.ints_attr("axes");
  } else {
    starts = need_constant(node, a.constants, 1, "starts").as_ints();
    ends = need_constant(node, a.constants, 2, "ends").as_ints();
    if (has_input(node, 3)) axes = need_constant(node, a.constants, 3, "axes").as_ints();
    if (has_input(node, 4)) steps = need_constant(node, a.constants, 4, "steps").as_ints();
  }
  const auto rank = static_cast<std::int64_t>(a.in[0].size());
  if (axes.empty())
    for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    bad(node, "starts, ends, axes and steps differ in length");
  std::vector<std::int64_t> full_start(static_cast<std::size_t>(rank), 0),
      full_step(static_cast<std::size_t>(rank), 1);
  Shape out = a.in[0];
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const auto ax = static_cast<std::size_t>(norm_axis(node, axes[k], rank));
    const std::int64_t dim = a.in[0][ax];
    const std::int64_t step = steps[k];
    if (step == 0) bad(node, "a step is 0");
    auto clampi = [&](std::int64_t v, std::int64_t lo, std::int64_t hi) {
      return std::min(std::max(v, lo), hi);
    };
    std::int64_t s = starts[k] < 0 ? starts[k] + dim : starts[k];
    std::int64_t e = ends[k] < 0 ? ends[k] + dim : ends[k];
    if (step > 0) {
      s = clampi(s, 0, dim);
      e = clampi(e, 0, dim);
      out[ax] = std::max<std::int64_t>(0, (e - s + step - 1) / step);
    } else {
      s = clampi(s, 0, dim - 1);
      e = clampi(e, -1, dim - 1);
      out[ax] = std::max<std::int64_t>(0, (s - e + (-step) - 1) / (-step));
    }
    full_start[ax] = s;
    full_step[ax] = step;
  }
  node.attrs["starts_full"] = ints_attribute(full_start);
  node.attrs["steps_full"] = ints_attribute(full_step);
  return {{out, a.types[0]}};
}

// Output `out` of a Split or Slice as a start and a step per axis of the input.
struct Window {
  std::vector<std::int64_t> start, step;
};
using WindowFn = Window (*)(const Node& node, std::size_t rank, std::size_t out,
                            std::int64_t& offset);

Window slice_window(const Node& node, std::size_t, std::size_t, std::int64_t&) {
  return {node.ints_attr("starts_full"), node.ints_attr("steps_full")};
}

// Split's windows follow each other along its axis: `offset` is where output `out` starts.
Window split_window(const Node& node, std::size_t rank, std::size_t out, std::int64_t& offset) {
  Window w{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 1)};
  w.start[static_cast<std::size_t>(node.int_attr("axis", 0))] = offset;
  offset += node.ints_attr("split")[out];
  return w;
}

// dst[idx] = src[start + idx * step] on row-major float buffers.
void strided_copy(const float* src, const Shape& ss, float* dst, const Shape& ds,
                  const std::vector<std::int64_t>& starts, const std::vector<std::int64_t>& steps) {
  const Shape st = strides_of(ss);
  for_each_index(ds, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += (starts[d] + idx[d] * steps[d]) * st[d];
    dst[k] = src[off];
  });
}

template <WindowFn window_of>
std::vector<Tensor> evaluate_window(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  std::vector<Tensor> result;
  const Shape& xs = x[0]->shape;
  const Shape st = strides_of(xs);
  std::int64_t offset = 0;
  for (std::size_t out = 0; out < outs.size(); ++out) {
    const Window w = window_of(node, xs.size(), out, offset);
    Tensor r;
    r.type = x[0]->type;
    r.shape = outs[out].shape;
    for_each_index(r.shape, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
      std::int64_t src = 0;
      for (std::size_t dd = 0; dd < idx.size(); ++dd)
        src += (w.start[dd] + idx[dd] * w.step[dd]) * st[dd];
      if (r.type == ElemType::f32)
        r.f.push_back(x[0]->f[static_cast<std::size_t>(src)]);
      else
        r.i.push_back(x[0]->i[static_cast<std::size_t>(src)]);
    });
    result.push_back(std::move(r));
  }
  return result;
}

// Each output is a view of the input (Lowering::view_window: its reader copies it out, once,
// into the layout it wants) or else one reorder from a strided view of the input; negative steps
// and overlapping strides (which a memory descriptor cannot express) run as a plain kernel.
template <WindowFn window_of>
void lower_window(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape in_strides = strides_of(xs);
  std::int64_t split_offset = 0;
  for (std::size_t out = 0; out < node.outputs.size(); ++out) {
    const Window w = window_of(node, xs.size(), out, split_offset);
    const auto& [start, step] = w;
    const Shape& os = g.shape(node.outputs[out]);
    const bool negative = std::any_of(step.begin(), step.end(), [](auto v) { return v < 0; });
    if (!negative && plan.view_window(node, out, start, step)) continue;
    const dt type = plan.at(node.inputs[0]).md.get_data_type();
    memory::dims strides(xs.size());
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < xs.size(); ++d) {
      strides[d] = in_strides[d] * step[d];
      offset += start[d] * in_strides[d];
    }
    // A strided view oneDNN accepts: not where a step reaches past the next axis's stride (a
    // subsampling slice of an odd extent, LeViT's: oneDNN refuses overlapping strides).
    std::optional<memory::desc> view;
    if (!negative) {
      try {
        view.emplace(dims_of(os), type, strides);
      } catch (const dnnl::error&) {
      }
    }
    if (!view) {
      const ArgRef src = plan.get_plain(node.inputs[0], dt::f32);
      const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
      plan.add_kernel(
          [xs, os, w](std::byte* const* p) {
            strided_copy(reinterpret_cast<const float*>(p[0]), xs, reinterpret_cast<float*>(p[1]),
                         os, w.start, w.step);
          },
          {src, dst}, node.describe(), KernelLoop::reference);
      plan.set(node.outputs[out], dst);
      continue;
    }
    const ArgRef src = plan.get_plain(node.inputs[0], type);
    const ArgRef dst = plan.new_buffer(plain(os, type));
    plan.add_reorder(
        ArgRef{src.kind, src.index,
               src.offset + static_cast<std::size_t>(offset) * memory::data_type_size(type), *view},
        dst, node.describe());
    plan.set(node.outputs[out], dst);
  }
}

// --- Pad -----------------------------------------------------------------------------------------

// Pads and value are attributes before opset 11 and constant inputs since.
std::vector<InferredOutput> infer_pad(Node& node, const InferArgs& a) {
  std::vector<std::int64_t> pads;
  float value = 0;
  if (a.opset < 11) {
    pads = node.ints_attr("pads");
    value = node.float_attr("value", 0);
  } else {
    pads = need_constant(node, a.constants, 1, "pads").as_ints();
    if (has_input(node, 2))
      value = static_cast<float>(need_constant(node, a.constants, 2, "constant_value").at(0));
    if (has_input(node, 3)) bad(node, "the axes input of Pad is not supported");
  }
  const auto rank = a.in[0].size();
  if (pads.size() != 2 * rank) bad(node, "pads must have 2 entries per axis");
  const std::string mode = node.string_attr("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "edge")
    bad(node, "unknown mode '" + mode + "'");
  node.attrs["pads"] = ints_attribute(pads);
  node.attrs["value"] = float_attribute(value);
  Shape out = a.in[0];
  for (std::size_t k = 0; k < rank; ++k) out[k] += pads[k] + pads[k + rank];
  return {{out, a.types[0]}};
}

// The reference and the engine's kernel alike, on row-major float buffers.
void pad(const float* src, const Shape& ss, float* dst, const Shape& ds,
         const std::vector<std::int64_t>& pads, const std::string& mode, float value) {
  const std::size_t rank = ss.size();
  const Shape st = strides_of(ss);
  for_each_index(ds, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      std::int64_t i = idx[d] - pads[d];
      const std::int64_t n = ss[d];
      if (i < 0 || i >= n) {
        if (mode == "constant") {
          dst[k] = value;
          return;
        }
        if (mode == "edge")
          i = i < 0 ? 0 : n - 1;
        else { // reflect: mirror without repeating the edge
          const std::int64_t period = std::max<std::int64_t>(2 * (n - 1), 1);
          i = ((i % period) + period) % period;
          if (i >= n) i = period - i;
        }
      }
      off += i * st[d];
    }
    dst[k] = src[off];
  });
}

std::vector<Tensor> evaluate_pad(const Node& node, const std::vector<const Tensor*>& x,
                                 const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  pad(x[0]->f.data(), x[0]->shape, r.data(), os, node.ints_attr("pads"),
      node.string_attr("mode", "constant"), node.float_attr("value", 0));
  return {Tensor::floats(os, std::move(r))};
}

// Every element of the padded buffer `dst` (shape `os`, row-major) outside the window that holds
// the input (begin pads `lo`, input extents `xs`) set to `value`; axes past `last` have no pads,
// so a row of the window is whole from there on.
void fill_border(float* dst, const Shape& os, const Shape& st, const Shape& xs,
                 const std::vector<std::int64_t>& lo, std::size_t last, std::size_t d,
                 float value) {
  const std::int64_t begin = lo[d], end = lo[d] + xs[d], block = st[d];
  if (begin > 0) std::fill(dst, dst + begin * block, value);
  if (end < os[d]) std::fill(dst + end * block, dst + os[d] * block, value);
  if (d == last) return;
  for (std::int64_t i = begin; i < end; ++i)
    fill_border(dst + i * block, os, st, xs, lo, last, d + 1, value);
}

// A constant Pad with no negative pads is a copy of the input into the window of a new buffer
// (oneDNN's reorder into a strided view of it) and a fill of the border around the window; one
// that pads nothing is the input itself. Cropping (negative) pads, edge and reflect run the plain
// kernel element by element.
void lower_pad(Lowering& plan, const Node& node) {
  const Shape xs = plan.graph().shape(node.inputs[0]), os = plan.graph().shape(node.outputs[0]);
  const auto pads = node.ints_attr("pads");
  const std::string mode = node.string_attr("mode", "constant");
  const float value = node.float_attr("value", 0);
  const std::size_t rank = xs.size();
  if (mode == "constant" && std::all_of(pads.begin(), pads.end(), [](auto v) { return v >= 0; })) {
    if (os == xs) return plan.set(node.outputs[0], plan.at(node.inputs[0]));
    const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
    const Shape st = strides_of(os);
    std::size_t offset = 0;
    std::size_t last = 0; // the last padded axis
    for (std::size_t d = 0; d < rank; ++d) {
      offset += static_cast<std::size_t>(pads[d] * st[d]);
      if (pads[d] != 0 || pads[d + rank] != 0) last = d;
    }
    const ArgRef window{dst.kind, dst.index, dst.offset + offset * sizeof(float),
                        memory::desc(dims_of(xs), dt::f32, dims_of(st))};
    plan.add_reorder(plan.at(node.inputs[0]), window, node.describe());
    const std::vector<std::int64_t> lo(pads.begin(),
                                       pads.begin() + static_cast<std::ptrdiff_t>(rank));
    plan.add_kernel(
        [os, st, xs, lo, last, value](std::byte* const* p) {
          fill_border(reinterpret_cast<float*>(p[0]), os, st, xs, lo, last, 0, value);
        },
        {dst}, node.describe() + " border");
    return plan.set(node.outputs[0], dst);
  }
  const ArgRef src = plan.get_plain(node.inputs[0], dt::f32);
  const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
  plan.add_kernel(
      [xs, os, pads, mode, value](std::byte* const* p) {
        pad(reinterpret_cast<const float*>(p[0]), xs, reinterpret_cast<float*>(p[1]), os, pads,
            mode, value);
      },
      {src, dst}, node.describe(), KernelLoop::reference);
  plan.set(node.outputs[0], dst);
}

constexpr OpDef kOps[] = {
    {.name = "Identity",
     .infer = same_shape,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true},
    {.name = "Dropout",
     .infer = same_shape,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true,
     .training_outputs = true},
    {.name = "Flatten",
     .infer = infer_flatten,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true},
    {.name = "Reshape",
     .min_inputs = 2,
     .infer = infer_reshape,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true},
    {.name = "Squeeze",
     .infer = infer_squeeze,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true},
    {.name = "Unsqueeze",
     .infer = infer_unsqueeze,
     .evaluate = evaluate_view,
     .lower = lower_view,
     .view = true},
    {.name = "Transpose",
     .infer = infer_transpose,
     .evaluate = evaluate_transpose,
     .lower = lower_transpose},
    {.name = "Concat", .infer = infer_concat, .evaluate = evaluate_concat, .lower = lower_concat},
    {.name = "Split",
     .infer = infer_split,
     .evaluate = evaluate_window<split_window>,
     .lower = lower_window<split_window>},
    {.name = "Slice",
     .infer = infer_slice,
     .evaluate = evaluate_window<slice_window>,
     .lower = lower_window<slice_window>},
    {.name = "Pad",
     .float_inputs = 1,
     .infer = infer_pad,
     .evaluate = evaluate_pad,
     .lower = lower_pad},
};

} // namespace

std::span<const OpDef> shape_ops() { return kOps; }

} // namespace kdflow::teacher
