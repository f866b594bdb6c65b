// A convolution over few input channels as im2col + one matrix product. oneDNN's direct
// convolutions vectorize over input channels (8 or 16 to a register, blocked): over an image's 3
// channels most lanes are empty, and an image network's stem (7x7 stride 2, 11x11 stride 4, 3
// channels in) ran at 30-75% of the FMA peak on AVX2 in the runs the README reads (alexnet's
// first convolution on the Zen 3). Unrolled, each output pixel's receptive field is one row of C x
// KH x KW columns (363 for an 11x11 kernel over 3 channels), and the whole layer is one matrix
// product
//     out[pixels, K] = columns[pixels, C*KH*KW] x W[C*KH*KW, K]
// whose depth (the columns) is large however few the channels: the product runs at a GEMM's rate.
//
// The rows are written in chunks that stay in the caches (about half the L2 per thread for a
// chunk's columns and products, with the weights): unroll a chunk's rows (parallel over rows),
// then one oneDNN matmul over the chunk writing straight into its rows of the channels-last output
// with the bias and the node's post-ops (activations, a residual sum) fused. Columns follow the
// ONNX kernel's order (channel, kernel row, kernel column), so that on plain NCHW input a kernel
// row's taps are one run of the input row (a copy where the stride and dilation along the row are
// 1, a strided read otherwise) and the weights are the ONNX kernel transposed.
#include "im2col.hpp"

#include "op_table.hpp"
#include "simd.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>

namespace kdflow::teacher {
namespace {

// Fewer input channels than this leave most of a 16-lane vector empty in a direct kernel.
constexpr std::int64_t kFewChannels = 16;

// The layer's shape as the unrolling walks it.
struct Geometry {
  std::int64_t batch = 0, c = 0, h = 0, w = 0; // input samples, channels and map
  std::int64_t kh = 0, kw = 0;                 // kernel
  std::int64_t sh = 0, sw = 0, dh = 0, dw = 0, pad_top = 0, pad_left = 0;
  std::int64_t ho = 0, wo = 0, k = 0; // output map and channels
  std::int64_t rows = 0, cols = 0;    // output pixels of the batch; C x KH x KW
  std::int64_t chunk = 0;             // rows per matmul
};

// `n` elements from `src` to `out` in blocks of 32 bytes (one AVX2 register; the compiler's
// fixed-size copies): a kernel row's few taps copied one by one cost more than the product they
// feed. A run shorter than a block reads and writes a whole block where `spare` says that much
// lies within both buffers (the elements past the run are rewritten by the row's next runs).
template <class T>
[[gnu::always_inline]] inline void copy_run(T* out, const T* src, std::int64_t n, bool spare) {
  constexpr std::int64_t kBlock = 32 / sizeof(T);
  if (n >= kBlock) {
    for (std::int64_t j = 0; j + kBlock <= n; j += kBlock)
      std::memcpy(out + j, src + j, kBlock * sizeof(T));
    if (n % kBlock != 0) std::memcpy(out + n - kBlock, src + n - kBlock, kBlock * sizeof(T));
  } else if (spare) {
    std::memcpy(out, src, kBlock * sizeof(T));
  } else {
    for (std::int64_t j = 0; j < n; ++j) out[j] = src[j];
  }
}

// Rows [first, first + count) of the chunk whose first row is `chunk_first`, unrolled into
// `col` ([chunk][cols]); T: the element's bits (f32, or bf16 in bf16 plans), copied unchanged.
template <class T>
void unroll_rows(const Geometry& g, const T* x, T* col, std::int64_t chunk_first,
                 std::int64_t first, std::int64_t count) {
  constexpr std::int64_t kBlock = 32 / sizeof(T);
  const std::int64_t pixels = g.ho * g.wo;
  const T* x_end = x + g.batch * g.c * g.h * g.w;
  for (std::int64_t r = first; r < first + count; ++r) {
    const std::int64_t row = chunk_first + r;
    const std::int64_t n = row / pixels, p = row % pixels;
    const std::int64_t oh = p / g.wo, ow = p % g.wo;
    const std::int64_t iw0 = ow * g.sw - g.pad_left;
    const bool run = g.dw == 1 && iw0 >= 0 && iw0 + g.kw <= g.w;
    T* out = col + r * g.cols;
    T* const row_end = out + g.cols;
    for (std::int64_t c = 0; c < g.c; ++c) {
      const T* plane = x + (n * g.c + c) * g.h * g.w;
      for (std::int64_t i = 0; i < g.kh; ++i, out += g.kw) {
        const std::int64_t ih = oh * g.sh - g.pad_top + i * g.dh;
        if (ih < 0 || ih >= g.h) {
          std::memset(out, 0, static_cast<std::size_t>(g.kw) * sizeof(T));
          continue;
        }
        const T* line = plane + ih * g.w;
        if (run) {
          const T* src = line + iw0;
          copy_run(out, src, g.kw, out + kBlock <= row_end && src + kBlock <= x_end);
        } else {
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const std::int64_t iw = iw0 + j * g.dw;
            if (iw >= 0 && iw < g.w) {
              out[j] = line[iw];
            } else {
              std::memset(out + j, 0, sizeof(T));
            }
          }
        }
      }
    }
  }
}

using UnrollFn = void (*)(const Geometry&, const void*, void*, std::int64_t, std::int64_t,
                          std::int64_t);
template <class T>
void unroll(const Geometry& g, const void* x, void* col, std::int64_t chunk_first,
            std::int64_t first, std::int64_t count) {
  unroll_rows(g, static_cast<const T*>(x), static_cast<T*>(col), chunk_first, first, count);
}

// The step's kernel: operands x, W, bias, the columns, the matmuls' scratchpad, y, and W as the
// last chunk's product reads it (the same buffer where its packing is the same).
struct Im2colKernel {
  Geometry g;
  dnnl::engine eng;
  dnnl::matmul full, tail; // over `chunk` rows, and over the last chunk's rows where fewer
  memory::desc col_md, tail_col_md, w_md, tail_w_md, bias_md, dst_md, tail_dst_md, pad_md;
  std::int64_t out_row_bytes = 0;
  UnrollFn unroll = nullptr;

  void operator()(std::byte* const* ptrs) const {
    const void* x = ptrs[0];
    std::byte* col = ptrs[3];
    std::byte* y = ptrs[5];
    dnnl::stream stream(eng);
    const dnnl::memory w_mem(w_md, eng, ptrs[1]), tail_w_mem(tail_w_md, eng, ptrs[6]),
        bias_mem(bias_md, eng, ptrs[2]), pad_mem(pad_md, eng, ptrs[4]);
    const auto grain = std::max<std::int64_t>(1, g.chunk / 64);
    for (std::int64_t first = 0; first < g.rows; first += g.chunk) {
      const std::int64_t count = std::min(g.chunk, g.rows - first);
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, count, grain),
                                [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
                                  unroll(g, x, col, first, r.begin(), r.end() - r.begin());
                                });
      const bool whole = count == g.chunk;
      const std::unordered_map<int, dnnl::memory> args = {
          {DNNL_ARG_SRC, dnnl::memory(whole ? col_md : tail_col_md, eng, col)},
          {DNNL_ARG_WEIGHTS, whole ? w_mem : tail_w_mem},
          {DNNL_ARG_BIAS, bias_mem},
          {DNNL_ARG_DST,
           dnnl::memory(whole ? dst_md : tail_dst_md, eng, y + first * out_row_bytes)},
          {DNNL_ARG_SCRATCHPAD, pad_mem}};
      (whole ? full : tail).execute(stream, args);
      stream.wait();
    }
  }
};

} // namespace

std::vector<std::string> im2col_ways(const Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& ws = g.shape(node.inputs[1]);
  if (node.int_attr("group", 1) != 1 || ws.size() != 4 || ws[1] >= kFewChannels ||
      ws[2] * ws[3] < 2 || !plan.conv_into_channels_last(node))
    return {};
  return {"im2col"};
}

void im2col_conv(Lowering& plan, const Node& node) {
  const Graph& graph = plan.graph();
  plan.set_kind("Conv (im2col)");
  const Shape& xs = graph.shape(node.inputs[0]);
  const Shape& ws = graph.shape(node.inputs[1]);
  const Shape& os = graph.shape(node.outputs[0]);
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             pads = node.ints_attr("pads");
  const dt act = plan.act();
  const auto elt = static_cast<std::int64_t>(memory::data_type_size(act));
  Geometry g;
  g.batch = xs[0];
  g.c = xs[1];
  g.h = xs[2];
  g.w = xs[3];
  g.kh = ws[2];
  g.kw = ws[3];
  g.sh = s[0];
  g.sw = s[1];
  g.dh = d[0];
  g.dw = d[1];
  g.pad_top = pads[0];
  g.pad_left = pads[1];
  g.ho = os[2];
  g.wo = os[3];
  g.k = os[1];
  g.rows = xs[0] * g.ho * g.wo;
  g.cols = g.c * g.kh * g.kw;
  // Chunks of about half the L2 per thread for a chunk's columns and products (the weights
  // stay beside them), evened out so that the last chunk is nearly full.
  const std::int64_t row_bytes = g.cols * elt + g.k * elt;
  const std::int64_t w_bytes = g.cols * g.k * elt;
  const std::int64_t room = std::max<std::int64_t>(l2_bytes() / 2 - w_bytes, l2_bytes() / 8);
  const std::int64_t per_thread = std::clamp<std::int64_t>(room / row_bytes, 16, 4096);
  const std::int64_t target = std::min(g.rows, per_thread * std::max(1, plan.threads()));
  const std::int64_t chunks = (g.rows + target - 1) / target;
  g.chunk = (g.rows + chunks - 1) / chunks;
  const std::int64_t tail_rows = g.rows - (chunks - 1) * g.chunk;

  const PostOp* sum = Lowering::sum_post(node);
  const auto attr = plan.attr_with(node);
  const memory::desc w_any({g.cols, g.k}, act, memory::format_tag::any);
  const memory::desc bias_md({1, g.k}, dt::f32, memory::format_tag::ab);
  const auto matmul_for = [&](std::int64_t rows) {
    return dnnl::matmul::primitive_desc(
        plan.eng(), memory::desc({rows, g.cols}, act, memory::format_tag::ab), w_any, bias_md,
        memory::desc({rows, g.k}, act, memory::format_tag::ab), attr);
  };
  const auto full = matmul_for(g.chunk);
  const auto tail = matmul_for(tail_rows);

  auto kernel = std::make_shared<Im2colKernel>();
  kernel->g = g;
  kernel->eng = plan.eng();
  kernel->full = dnnl::matmul(full);
  kernel->tail = dnnl::matmul(tail);
  kernel->col_md = memory::desc({g.chunk, g.cols}, act, memory::format_tag::ab);
  kernel->tail_col_md = memory::desc({tail_rows, g.cols}, act, memory::format_tag::ab);
  kernel->w_md = full.weights_desc();
  kernel->tail_w_md = tail.weights_desc();
  kernel->bias_md = bias_md;
  kernel->dst_md = full.dst_desc();
  kernel->tail_dst_md = tail.dst_desc();
  kernel->out_row_bytes = g.k * elt;
  kernel->unroll = act == dt::f32 ? unroll<float> : unroll<std::uint16_t>;
  const std::int64_t pad_bytes = std::max<std::int64_t>(
      1, static_cast<std::int64_t>(
             std::max(full.scratchpad_desc().get_size(), tail.scratchpad_desc().get_size())));
  kernel->pad_md = memory::desc({pad_bytes}, dt::u8, memory::format_tag::a);

  // The ONNX kernel [K][C][KH][KW] is the columns' matrix transposed: {cols, K} in ba.
  const memory::desc w_user({g.cols, g.k}, dt::f32, memory::format_tag::ba);
  std::vector<float> bias(static_cast<std::size_t>(g.k), 0.f);
  if (node.inputs.size() > 2 && !node.inputs[2].empty())
    bias = graph.constants.at(node.inputs[2]).f;

  const memory::desc y_md(dims_of(os), act, memory::format_tag::acdb);
  ArgRef x = plan.get(node.inputs[0], memory::desc(dims_of(xs), act, memory::format_tag::abcd));
  const std::vector<float>& weights = graph.constants.at(node.inputs[1]).f;
  ArgRef w = plan.weight(weights, w_user, full.weights_desc());
  // oneDNN may pack the weights otherwise for fewer rows: then the last chunk's own copy.
  ArgRef w_tail = tail.weights_desc() == full.weights_desc()
                      ? w
                      : plan.weight(weights, w_user, tail.weights_desc());
  ArgRef b = plan.weight(std::move(bias), bias_md, bias_md);
  // With a residual sum the products accumulate into the summand's buffer (dead after it),
  // channels-last.
  if (sum) plan.before_overwrite(sum->sum_input);
  ArgRef y = sum ? plan.get(sum->sum_input, y_md) : plan.new_buffer(y_md);
  plan.add_kernel(
      [kernel](std::byte* const* p) { (*kernel)(p); },
      {x, w, b, plan.new_buffer(kernel->col_md), plan.new_buffer(kernel->pad_md), y, w_tail},
      node.describe(), KernelLoop::rows,
      fmt::format("kdflow im2col ({} rows a chunk) + {}", g.chunk, full.impl_info_str()));
  plan.set(node.outputs[0], y);
}

} // namespace kdflow::teacher
