// Elementwise arithmetic with numpy broadcasting (Add, Sub, Mul, Div): oneDNN's binary primitive,
// which broadcasts its second operand only; a plain kernel where the first one broadcasts, or
// where oneDNN has only its reference implementation for the broadcast (a mask or bias repeated
// over windows and heads: Swin's attention).
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <optional>
#include <string>

namespace kdflow::teacher {
namespace {

struct Arithmetic {
  dnnl_alg_kind_t algorithm;
  bool commutative;
  float (*f)(float a, float b);
  std::int64_t (*i)(std::int64_t a, std::int64_t b);
};

constexpr Arithmetic kAdd{dnnl_binary_add, true, [](float a, float b) { return a + b; },
                          [](std::int64_t a, std::int64_t b) { return a + b; }};
constexpr Arithmetic kSub{dnnl_binary_sub, false, [](float a, float b) { return a - b; },
                          [](std::int64_t a, std::int64_t b) { return a - b; }};
constexpr Arithmetic kMul{dnnl_binary_mul, true, [](float a, float b) { return a * b; },
                          [](std::int64_t a, std::int64_t b) { return a * b; }};
// ONNX integer Div truncates; kdflow reads x / 0 as 0 rather than trapping.
constexpr Arithmetic kDiv{dnnl_binary_div, false, [](float a, float b) { return a / b; },
                          [](std::int64_t a, std::int64_t b) { return b == 0 ? 0 : a / b; }};

std::vector<InferredOutput> infer_binary(Node& node, const InferArgs& a) {
  if (a.types[0] != a.types[1])
    bad(node, "its inputs differ in element type (one holds integers, the other floats)");
  return {{broadcast(node, a.in[0], a.in[1]), a.types[0]}};
}

// out = a (op) b, each operand read through its broadcast strides.
template <typename T, typename A, typename B, typename F>
void broadcast_loop(const A& a, const Shape& as, const B& b, const Shape& bs, T* out,
                    const Shape& os, F&& f) {
  const Shape sa = broadcast_strides(as, os), sb = broadcast_strides(bs, os);
  for_each_index(os, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t ia = 0, ib = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
    }
    out[k] = f(a(ia), b(ib));
  });
}

// out = x (op) gate over a channel-blocked x (oneDNN's aBcd8b and kin: [N][C/B][spatial][B], C
// padded to whole blocks) and a per-channel gate ([N or 1][C], plain), out in x's layout; the
// padding channels written 0, as oneDNN keeps them.
template <const Arithmetic& A, int B>
void run_blocked_channel(const float* x, const float* gate, float* out, std::int64_t n,
                         std::int64_t c, std::int64_t spatial, std::int64_t gate_n_stride) {
  const std::int64_t blocks = (c + B - 1) / B;
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, n * blocks),
                            [&](const oneapi::tbb::blocked_range<std::int64_t>& range) {
                              for (std::int64_t i = range.begin(); i != range.end(); ++i) {
                                const std::int64_t ni = i / blocks, cb = i % blocks;
                                float g[B];
                                bool pad = false;
                                for (int l = 0; l < B; ++l) {
                                  const std::int64_t ch = cb * B + l;
                                  g[l] = ch < c ? gate[ni * gate_n_stride + ch] : 0.f;
                                  pad |= ch >= c;
                                }
                                const float* px = x + i * spatial * B;
                                float* py = out + i * spatial * B;
                                for (std::int64_t sp = 0; sp < spatial; ++sp)
                                  for (int l = 0; l < B; ++l)
                                    py[sp * B + l] = A.f(px[sp * B + l], g[l]);
                                if (pad)
                                  for (std::int64_t sp = 0; sp < spatial; ++sp)
                                    for (int l = static_cast<int>(c - cb * B); l < B; ++l)
                                      py[sp * B + l] = 0.f;
                              }
                            });
}

template <const Arithmetic& A>
std::vector<Tensor> evaluate_binary(const Node&, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const Shape& os = outs[0].shape;
  const Tensor &a = *x[0], &b = *x[1];
  if (a.type == ElemType::i64 && b.type == ElemType::i64) {
    std::vector<std::int64_t> r(static_cast<std::size_t>(numel(os)));
    const auto at = [](const Tensor& t) {
      return [&t](std::int64_t k) { return t.i[static_cast<std::size_t>(k)]; };
    };
    broadcast_loop(at(a), a.shape, at(b), b.shape, r.data(), os, A.i);
    return {Tensor::ints(os, std::move(r))};
  }
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  const auto at = [](const Tensor& t) {
    return [&t](std::int64_t k) { return static_cast<float>(t.at(k)); };
  };
  broadcast_loop(at(a), a.shape, at(b), b.shape, r.data(), os, A.f);
  return {Tensor::floats(os, std::move(r))};
}

// A broadcast elementwise op as rows: the output's longest run of trailing axes on which each
// operand is either read in full (contiguously) or repeated as one value, computed by one inner
// loop per row; each row's operand offsets computed at load.
struct Rows {
  std::int64_t run = 1;
  bool a_repeats = false, b_repeats = false; // the operand's one value along the whole run
  std::vector<std::int64_t> a_off, b_off;
};

// nullopt where the rows would be too short to pay for their offsets (under 16 elements).
std::optional<Rows> broadcast_rows(const Shape& as, const Shape& bs, const Shape& os) {
  const Shape sa = broadcast_strides(as, os), sb = broadcast_strides(bs, os);
  Rows r;
  // An axis's pattern for one operand: 0 any (extent 1), 1 read in full, 2 repeated.
  int pa = 0, pb = 0;
  std::size_t d = os.size();
  for (; d-- > 0;) {
    if (os[d] == 1) continue;
    const int ka = sa[d] == 0 ? 2 : 1, kb = sb[d] == 0 ? 2 : 1;
    if ((pa != 0 && ka != pa) || (pb != 0 && kb != pb)) break;
    // Read in full: contiguous with the run so far.
    if ((ka == 1 && sa[d] != r.run) || (kb == 1 && sb[d] != r.run)) break;
    pa = ka;
    pb = kb;
    r.run *= os[d];
  }
  if (r.run < 16) return std::nullopt;
  r.a_repeats = pa == 2;
  r.b_repeats = pb == 2;
  const Shape outer(os.begin(), os.begin() + static_cast<std::ptrdiff_t>(d + 1));
  for_each_index(outer, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
    std::int64_t oa = 0, ob = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) {
      oa += idx[k] * sa[k];
      ob += idx[k] * sb[k];
    }
    r.a_off.push_back(oa);
    r.b_off.push_back(ob);
  });
  return r;
}

template <const Arithmetic& A>
void run_rows(const Rows& r, const float* a, const float* b, float* out) {
  const auto rows = static_cast<std::int64_t>(r.a_off.size());
  const std::int64_t n = r.run;
  oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, rows),
                            [&](const oneapi::tbb::blocked_range<std::int64_t>& range) {
                              for (std::int64_t row = range.begin(); row != range.end(); ++row) {
                                const float* pa = a + r.a_off[static_cast<std::size_t>(row)];
                                const float* pb = b + r.b_off[static_cast<std::size_t>(row)];
                                float* y = out + row * n;
                                if (r.a_repeats)
                                  for (std::int64_t i = 0; i < n; ++i) y[i] = A.f(pa[0], pb[i]);
                                else if (r.b_repeats)
                                  for (std::int64_t i = 0; i < n; ++i) y[i] = A.f(pa[i], pb[0]);
                                else
                                  for (std::int64_t i = 0; i < n; ++i) y[i] = A.f(pa[i], pb[i]);
                              }
                            });
}

// `dims` (of as many axes as `md`) in the layout `md` is in, with elements of `type`: the same
// strides where `md` is plain (strided, without blocks), or oneDNN's channel-blocked tag (aBcd8b
// and kin: 8 or 16 channels innermost) where `md` is exactly one of those; nullopt otherwise.
std::optional<memory::desc> layout_like(const memory::desc& md, const Shape& dims, dt type) {
  const int nd = md.get_ndims();
  if (md.get_format_kind() != memory::format_kind::blocked ||
      dims.size() != static_cast<std::size_t>(nd) || md.get_submemory_offset() != 0)
    return std::nullopt;
  if (md.get_inner_nblks() == 0) {
    if (dims_of(dims) != md.get_dims()) return std::nullopt; // the strides are md's dims'
    return memory::desc(md.get_dims(), type, md.get_strides());
  }
  if (nd < 3 || nd > 5) return std::nullopt;
  using tag = memory::format_tag;
  const tag tags[3][2] = {
      {tag::aBc8b, tag::aBc16b}, {tag::aBcd8b, tag::aBcd16b}, {tag::aBcde8b, tag::aBcde16b}};
  for (const tag t : tags[nd - 3])
    if (memory::desc(md.get_dims(), md.get_data_type(), t) == md)
      return memory::desc(dims_of(dims), type, t);
  return std::nullopt;
}

template <const Arithmetic& A>
void lower_binary(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& os = g.shape(node.outputs[0]);
  std::string a = node.inputs[0], b = node.inputs[1];
  // oneDNN broadcasts only the second operand: put the full-shape computed operand first.
  if (A.commutative && (g.is_constant(a) || g.shape(a) != os) && !g.is_constant(b) &&
      g.shape(b) == os)
    std::swap(a, b);
  // The plain kernel by rows (where it has rows long enough) or element by element.
  const auto plain_kernel = [&](std::optional<Rows> rows) {
    const Shape as = g.shape(a), bs = g.shape(b);
    const ArgRef ra = g.is_constant(a) ? plan.constant(a, as) : plan.get_plain(a, dt::f32);
    const ArgRef rb = g.is_constant(b) ? plan.constant(b, bs) : plan.get_plain(b, dt::f32);
    const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
    if (rows) {
      plan.add_kernel(
          [rows = std::move(*rows)](std::byte* const* p) {
            run_rows<A>(rows, reinterpret_cast<const float*>(p[0]),
                        reinterpret_cast<const float*>(p[1]), reinterpret_cast<float*>(p[2]));
          },
          {ra, rb, dst}, node.describe());
      plan.set(node.outputs[0], dst);
      return;
    }
    plan.add_kernel(
        [as, bs, os](std::byte* const* p) {
          const auto* pa = reinterpret_cast<const float*>(p[0]);
          const auto* pb = reinterpret_cast<const float*>(p[1]);
          broadcast_loop([pa](std::int64_t k) { return pa[k]; }, as,
                         [pb](std::int64_t k) { return pb[k]; }, bs, reinterpret_cast<float*>(p[2]),
                         os, A.f);
        },
        {ra, rb, dst}, node.describe(), KernelLoop::reference);
    plan.set(node.outputs[0], dst);
  };
  if (g.is_constant(a) || g.shape(a) != os) // first operand broadcasts
    return plain_kernel(broadcast_rows(g.shape(a), g.shape(b), os));
  // A transpose's output is read where it lies (ConvNeXt's block output, permuted back to NCHW
  // before its layer scale and residual sum): the output takes its layout, which the next
  // convolution reads as channels-last, where a plain copy would be reordered twice.
  ArgRef src0 = plan.dense(a);
  Shape bs = g.shape(b);
  while (bs.size() < os.size()) bs.insert(bs.begin(), 1);
  const bool whole_b = !g.is_constant(b) && g.shape(b) == os;
  ArgRef src1;
  if (g.is_constant(b)) {
    src1 = plan.constant(b, bs);
  } else if (whole_b) {
    src1 = plan.dense(b);
  } else {
    const dt type = plan.at(b).md.get_data_type();
    const ArgRef r = plan.get_plain(b, type);
    src1 = ArgRef{r.kind, r.index, r.offset, plain(bs, type)};
  }
  // The output in the first operand's layout, in the type the output is kept in (f32 where a
  // parameter or an f32 operand promotes a bf16 one, as in PyTorch). In int8, where only
  // quantized products read it (an EfficientNet's or a RegNet's squeeze-and-excitation scale
  // before the block's projection), it is written in their quantization: divided by its scale
  // in a linear post-op, then rounded and saturated by the conversion, so that no reorder
  // quantizes it again. Not where a convolution sums into it or a MaxPool passes it on: those
  // ask whether its producer wrote it quantized (Lowering::quantized_output), which a binary op
  // does not claim.
  auto q_out = plan.stored_quant(node.outputs[0]);
  for (const std::size_t r : g.consumers(node.outputs[0])) {
    const Node& reader = g.nodes[r];
    const PostOp* sum = Lowering::sum_post(reader);
    if ((sum != nullptr && sum->sum_input == node.outputs[0]) || reader.op == "MaxPool")
      q_out.reset();
  }
  const dt out = q_out ? q_out->type : plan.type_of(node.outputs[0]);
  dnnl::primitive_attr attr = Lowering::plain_attr();
  if (q_out) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, 1.f / q_out->scale, 0.f);
    attr.set_post_ops(ops);
  }
  const auto describe = [&] {
    const memory::desc dst_md = src0.md.get_data_type() == out
                                    ? src0.md
                                    : memory::desc(dims_of(os), out, memory::format_tag::any);
    return dnnl::binary::primitive_desc(plan.eng(), static_cast<dnnl::algorithm>(A.algorithm),
                                        src0.md, src1.md, dst_md, attr);
  };
  const auto by_reference = [](const dnnl::binary::primitive_desc& d) {
    return std::string(d.impl_info_str()).rfind("ref", 0) == 0;
  };
  auto pd = describe();
  // Where oneDNN's kernels do not take a view's strides beside the other operand's layout but do
  // take plain operands, the plain copies at() makes, as before views were read here. (Where
  // neither is taken, the reference kernel reads the view in place: a copy would gain nothing.)
  const bool view_a = plan.is_view(a), view_b = whole_b && plan.is_view(b);
  if (by_reference(pd) && (view_a || view_b)) {
    const ArgRef in_place0 = src0, in_place1 = src1;
    if (view_a) src0.md = plain(os, src0.md.get_data_type());
    if (view_b) src1.md = plain(os, src1.md.get_data_type());
    if (by_reference(describe())) {
      src0 = in_place0;
      src1 = in_place1;
    } else {
      if (view_a) src0 = plan.at(a);
      if (view_b) src1 = plan.at(b);
      pd = describe();
    }
  }
  // Two computed operands of one shape in different layouts (a channels-last N x C x 1 x 1 beside
  // a channel-blocked one): oneDNN's kernels take the pair only in one layout, so the second is
  // read in the first's (a reorder where the two differ), rather than both reordered to plain for
  // the rows kernel and its output reordered back.
  if (by_reference(pd) && whole_b)
    if (const auto like = layout_like(src0.md, os, src1.md.get_data_type())) {
      const ArgRef before = src1;
      src1.md = *like;
      if (auto d = describe(); !by_reference(d)) {
        src1 = plan.get(b, *like);
        pd = std::move(d);
      } else {
        src1 = before;
      }
    }
  // A per-channel operand (a squeeze-and-excitation scale, N x C x 1 x 1) beside a first operand
  // in oneDNN's channel-blocked layout (a grouped convolution's output, say): oneDNN's kernels
  // take that broadcast only where the second operand is blocked alike, so it is put so (a
  // reorder of its few values) rather than the first, full-size one reordered to plain for the
  // rows kernel and its output reordered back for the next convolution.
  if (by_reference(pd) && !whole_b && g.shape(b).size() == os.size())
    if (const auto blocked = layout_like(src0.md, bs, src1.md.get_data_type())) {
      const ArgRef before = src1;
      src1.md = *blocked;
      if (auto d = describe(); !by_reference(d)) {
        src1 = g.is_constant(b) ? plan.constant(b, bs, *blocked) : plan.get(b, *blocked);
        pd = std::move(d);
      } else {
        src1 = before;
      }
    }
  // Where oneDNN has no kernel for that either (its AVX-512 binary kernels take 16 channels a
  // block only, where a grouped convolution of 8 channels a group writes 8), kdflow's kernel for
  // a per-channel operand over the blocked layout: x's layout in and out, no reorder of it.
  if (by_reference(pd) && !whole_b && !q_out && src0.md.get_data_type() == dt::f32 &&
      out == dt::f32 && bs.size() == os.size() && bs.size() >= 3 && bs[1] == os[1] &&
      (bs[0] == 1 || bs[0] == os[0]) &&
      std::all_of(bs.begin() + 2, bs.end(), [](std::int64_t d) { return d == 1; }))
    for (const int block : {8, 16}) {
      using tag = memory::format_tag;
      const tag t = os.size() == 3   ? (block == 8 ? tag::aBc8b : tag::aBc16b)
                    : os.size() == 4 ? (block == 8 ? tag::aBcd8b : tag::aBcd16b)
                    : os.size() == 5 ? (block == 8 ? tag::aBcde8b : tag::aBcde16b)
                                     : tag::undef;
      if (t == tag::undef || memory::desc(dims_of(os), dt::f32, t) != src0.md) continue;
      std::int64_t spatial = 1;
      for (std::size_t d = 2; d < os.size(); ++d) spatial *= os[d];
      const std::int64_t n = os[0], c = os[1], gate_n = bs[0] == 1 ? 0 : c;
      const ArgRef gate = g.is_constant(b) ? plan.constant(b, bs) : plan.get_plain(b, dt::f32);
      const ArgRef dst = plan.new_buffer(src0.md);
      const auto run = block == 8 ? run_blocked_channel<A, 8> : run_blocked_channel<A, 16>;
      plan.add_kernel(
          [run, n, c, spatial, gate_n](std::byte* const* p) {
            run(reinterpret_cast<const float*>(p[0]), reinterpret_cast<const float*>(p[1]),
                reinterpret_cast<float*>(p[2]), n, c, spatial, gate_n);
          },
          {src0, gate, dst}, node.describe(), KernelLoop::rows,
          fmt::format("kdflow per-channel {} over {}-channel blocks", node.op, block));
      plan.set(node.outputs[0], dst);
      return;
    }
  // oneDNN's reference implementation (a broadcast its kernels do not cover) is many times slower
  // than the rows kernel; the rows kernel where it applies.
  if (by_reference(pd))
    if (auto rows = broadcast_rows(g.shape(a), g.shape(b), os))
      return plain_kernel(std::move(rows));
  const ArgRef dst = plan.new_buffer(pd.dst_desc());
  plan.add_primitive(dnnl::binary(pd),
                     {{DNNL_ARG_SRC_0, src0}, {DNNL_ARG_SRC_1, src1}, {DNNL_ARG_DST, dst}},
                     node.describe(), pd.scratchpad_desc());
  plan.set(node.outputs[0], dst);
}

// A residual Add is fused as a sum post-op by the passes (fuse_residual), not through the table.
constexpr OpDef kOps[] = {
    {.name = "Add",
     .min_inputs = 2,
     .infer = infer_binary,
     .evaluate = evaluate_binary<kAdd>,
     .lower = lower_binary<kAdd>},
    {.name = "Sub",
     .min_inputs = 2,
     .infer = infer_binary,
     .evaluate = evaluate_binary<kSub>,
     .lower = lower_binary<kSub>},
    {.name = "Mul",
     .min_inputs = 2,
     .infer = infer_binary,
     .evaluate = evaluate_binary<kMul>,
     .lower = lower_binary<kMul>},
    {.name = "Div",
     .min_inputs = 2,
     .infer = infer_binary,
     .evaluate = evaluate_binary<kDiv>,
     .lower = lower_binary<kDiv>},
};

} // namespace

std::span<const OpDef> binary_ops() { return kOps; }

} // namespace kdflow::teacher
