// A 3x3 or 5x5 convolution (stride 1, one group) by Winograd's minimal filtering, F(m x m, r x r)
// with m = 4 or 2 (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):
// each a x a input tile d (a = m + r - 1) and r x r kernel g give the m x m output tile
//     Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// so the products of a whole layer become a^2 independent matrix products, one per element of
// the transformed tile: (tiles x C) times (C x K). Those run through oneDNN's batched matmul;
// the transforms are kdflow's, vectorized over 16 channels of the channels-last tensors. The
// kernel's transform U = G g G^T is computed once at load (in double). F(4x4, 3x3) multiplies 4x
// fewer than the direct convolution, F(2x2, 3x3) 2.25x fewer, F(4x4, 5x5) 6.25x (a 4x4 output
// tile's 400 products in 64) and F(2x2, 5x5) 2.78x, for transforms that read and write each
// tile's channels once; the tuner times them against oneDNN's direct convolution. F(4x4, 3x3)
// and F(2x2, 5x5) share their six interpolation points (0, +-1, +-2 and infinity), so their input
// transform B^T is the same; their G and A^T differ.
//
// In bf16 plans (activations stored bf16) the transformed tiles are written bf16 and the products
// run as bf16 x bf16 -> f32 (AVX512_BF16's dot products, or AMX), as oneDNN's bf16 convolutions
// do: the input is read bf16, the transforms add in f32, each transformed element is rounded once
// to bf16 (as a direct bf16 convolution rounds its input once), the products accumulate in f32,
// and the output transform, bias and post-ops run in f32 before the one rounding of the result.
//
// The tiles are processed in chunks sized so that a chunk's transformed tiles and products stay
// in the caches (about 2 MiB of them per thread): transform a chunk's input tiles
// (parallel over tiles), one matmul over the chunk, transform its products back into the output
// with the bias and the node's post-ops (activations, the residual sum), parallel over tiles.
#include "winograd.hpp"

#include "bf16.hpp"
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

using simd16::kLanes;
using simd16::load;
using simd16::store;
using simd16::Vec;
// The one-dimensional transforms along a line of a tile (`s`: the stride between its elements):
// B^T d for the input, A^T m for the products. The 2-D transforms apply them to the columns,
// then to the rows. B^T, G and A^T as in Lavin and Gray (interpolation points 0, +-1, +-2, +-1/2
// and infinity for a = 8; 0, +-1, +-2 and infinity for a = 6; 0, +-1 and infinity for a = 4):
// G's row for a finite point p is (1, p, p^2, ...) / prod over the other finite points q of
// (p - q), its row for infinity picks the kernel's last tap; A^T's row i is (p^i) over the finite
// points, with 1 under infinity in the last row only; B^T's row for p is the coefficients of
// prod over the other finite points q of (x - q), its last row those of the product over all.
template <int M, int R>
struct Transform;

template <>
struct Transform<4, 3> {
  [[gnu::always_inline]] static void input(const Vec* d, int s, Vec* r, int rs) {
    const Vec d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s];
    r[0] = 4 * d0 - 5 * d2 + d4;
    const Vec a = d4 - 4 * d2, b = d3 - 4 * d1;
    r[rs] = a + b;
    r[2 * rs] = a - b;
    const Vec c = d4 - d2, e = 2 * (d3 - d1);
    r[3 * rs] = c + e;
    r[4 * rs] = c - e;
    r[5 * rs] = 4 * d1 - 5 * d3 + d5;
  }
  [[gnu::always_inline]] static void output(const Vec* m, int s, Vec* y, int ys) {
    const Vec m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
    const Vec a = m1 + m2, b = m3 + m4, c = m1 - m2, e = m3 - m4;
    y[0] = m0 + a + b;
    y[ys] = c + 2 * e;
    y[2 * ys] = a + 4 * b;
    y[3 * ys] = c + 8 * e + m5;
  }
  static constexpr double G[6][3] = {{1.0 / 4, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                     {0, 0, 1}};
};

template <>
struct Transform<2, 3> {
  [[gnu::always_inline]] static void input(const Vec* d, int s, Vec* r, int rs) {
    const Vec d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s];
    r[0] = d0 - d2;
    r[rs] = d1 + d2;
    r[2 * rs] = d2 - d1;
    r[3 * rs] = d1 - d3;
  }
  [[gnu::always_inline]] static void output(const Vec* m, int s, Vec* y, int ys) {
    const Vec m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s];
    y[0] = m0 + m1 + m2;
    y[ys] = m1 - m2 - m3;
  }
  static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
};

// F(2, 5): F(4, 3)'s points, so its input transform; two output rows.
template <>
struct Transform<2, 5> {
  [[gnu::always_inline]] static void input(const Vec* d, int s, Vec* r, int rs) {
    Transform<4, 3>::input(d, s, r, rs);
  }
  [[gnu::always_inline]] static void output(const Vec* m, int s, Vec* y, int ys) {
    const Vec m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s];
    y[0] = m0 + m1 + m2 + m3 + m4;
    y[ys] = (m1 - m2) + 2 * (m3 - m4) + m5;
  }
  static constexpr double G[6][5] = {{1.0 / 4, 0, 0, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6, 1.0 / 3, 2.0 / 3},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6, -1.0 / 3, 2.0 / 3},
                                     {0, 0, 0, 0, 1}};
};

// F(4, 5): eight points, 0, +-1, +-2, +-1/2 and infinity (those of F(6, 3)). B^T's first row is
// negated from the derivation's, and G's with it, so that both start with +1.
template <>
struct Transform<4, 5> {
  [[gnu::always_inline]] static void input(const Vec* d, int s, Vec* r, int rs) {
    const Vec d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], d5 = d[5 * s],
              d6 = d[6 * s], d7 = d[7 * s];
    r[0] = d0 - d6 + 5.25f * (d4 - d2);
    const Vec a1 = d2 + d6 - 4.25f * d4, b1 = d1 + d5 - 4.25f * d3;
    r[rs] = a1 + b1;
    r[2 * rs] = a1 - b1;
    const Vec a2 = 0.25f * d2 - 1.25f * d4 + d6, b2 = 0.5f * d1 - 2.5f * d3 + 2 * d5;
    r[3 * rs] = a2 + b2;
    r[4 * rs] = a2 - b2;
    const Vec a3 = 4 * d2 - 5 * d4 + d6, b3 = 2 * d1 - 2.5f * d3 + 0.5f * d5;
    r[5 * rs] = a3 + b3;
    r[6 * rs] = a3 - b3;
    r[7 * rs] = d7 - d1 + 5.25f * (d3 - d5);
  }
  [[gnu::always_inline]] static void output(const Vec* m, int s, Vec* y, int ys) {
    const Vec m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], m5 = m[5 * s],
              m6 = m[6 * s], m7 = m[7 * s];
    const Vec a1 = m1 + m2, b1 = m1 - m2, a2 = m3 + m4, b2 = m3 - m4, a3 = m5 + m6, b3 = m5 - m6;
    y[0] = m0 + a1 + a2 + a3;
    y[ys] = b1 + 2 * b2 + 0.5f * b3;
    y[2 * ys] = a1 + 4 * a2 + 0.25f * a3;
    y[3 * ys] = b1 + 8 * b2 + 0.125f * b3 + m7;
  }
  static constexpr double G[8][5] = {{1, 0, 0, 0, 0},
                                     {-2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9, -2.0 / 9},
                                     {-2.0 / 9, 2.0 / 9, -2.0 / 9, 2.0 / 9, -2.0 / 9},
                                     {1.0 / 90, 2.0 / 90, 4.0 / 90, 8.0 / 90, 16.0 / 90},
                                     {1.0 / 90, -2.0 / 90, 4.0 / 90, -8.0 / 90, 16.0 / 90},
                                     {32.0 / 45, 16.0 / 45, 8.0 / 45, 4.0 / 45, 2.0 / 45},
                                     {32.0 / 45, -16.0 / 45, 8.0 / 45, -4.0 / 45, 2.0 / 45},
                                     {0, 0, 0, 0, 1}};
};

// The layer's shape as the kernels walk it.
struct Geometry {
  std::int64_t c = 0, k = 0;   // input and output channels
  std::int64_t cp = 0, kp = 0; // the same padded to whole vectors
  std::int64_t h = 0, w = 0;   // input map
  std::int64_t ho = 0, wo = 0; // output map
  std::int64_t pad_top = 0, pad_left = 0;
  std::int64_t tiles_w = 0, tiles_per_image = 0, tiles = 0;
  std::int64_t chunk = 0; // tiles per matmul
};

// A post-op as the output transform applies it, in the node's order.
struct Post {
  enum class Kind { relu, activation, sum } kind = Kind::relu;
  float (*scalar)(float, float, float) = nullptr;
  float alpha = 0, beta = 0;
};

// Input tiles [first, first + count) of the chunk whose first tile is `chunk_first`, transformed
// into v ([alpha^2][chunk][cp], each row one tile's channels); T: the element type of both (f32,
// or bf16 in bf16 plans).
template <int M, int R, class T>
[[gnu::always_inline]] inline void input_tiles(const Geometry& g, const T* x, T* v,
                                               std::int64_t chunk_first, std::int64_t first,
                                               std::int64_t count) {
  constexpr int A = M + R - 1;
  for (std::int64_t t = first; t < first + count; ++t) {
    const std::int64_t tile = chunk_first + t;
    const std::int64_t n = tile / g.tiles_per_image, r = tile % g.tiles_per_image;
    const std::int64_t y0 = (r / g.tiles_w) * M - g.pad_top, x0 = (r % g.tiles_w) * M - g.pad_left;
    const bool inside = y0 >= 0 && x0 >= 0 && y0 + A <= g.h && x0 + A <= g.w;
    for (std::int64_t c0 = 0; c0 < g.cp; c0 += kLanes) {
      const std::int64_t lanes = std::min<std::int64_t>(kLanes, g.c - c0);
      Vec d[A * A];
      if (inside && lanes == kLanes) {
        for (int i = 0; i < A; ++i)
          for (int j = 0; j < A; ++j)
            load(d[i * A + j], x + ((n * g.h + y0 + i) * g.w + x0 + j) * g.c + c0);
      } else {
        for (int i = 0; i < A; ++i)
          for (int j = 0; j < A; ++j) {
            Vec e = {};
            const std::int64_t yy = y0 + i, xx = x0 + j;
            if (yy >= 0 && yy < g.h && xx >= 0 && xx < g.w) {
              const T* p = x + ((n * g.h + yy) * g.w + xx) * g.c + c0;
              for (std::int64_t l = 0; l < lanes; ++l) e[l] = to_float(p[l]);
            }
            d[i * A + j] = e;
          }
      }
      Vec cols[A * A], out[A * A];
      for (int j = 0; j < A; ++j) Transform<M, R>::input(d + j, A, cols + j, A);
      for (int i = 0; i < A; ++i) Transform<M, R>::input(cols + i * A, 1, out + i * A, 1);
      for (int e = 0; e < A * A; ++e) store(v + (e * g.chunk + t) * g.cp + c0, out[e]);
    }
  }
}

// The products of tiles [first, first + count) of the chunk (mm: [alpha^2][chunk][kp], f32)
// transformed back into the output map y (channels-last, T: f32 or bf16, as the input and the
// summand of a residual sum), with the bias and the post-ops.
template <int M, int R, class T>
[[gnu::always_inline]] inline void
output_tiles(const Geometry& g, const float* mm, const float* bias, const Post* post, int posts,
             T* y, std::int64_t chunk_first, std::int64_t first, std::int64_t count) {
  constexpr int A = M + R - 1;
  for (std::int64_t t = first; t < first + count; ++t) {
    const std::int64_t tile = chunk_first + t;
    const std::int64_t n = tile / g.tiles_per_image, r = tile % g.tiles_per_image;
    const std::int64_t y0 = (r / g.tiles_w) * M, x0 = (r % g.tiles_w) * M;
    for (std::int64_t k0 = 0; k0 < g.k; k0 += kLanes) {
      const std::int64_t lanes = std::min<std::int64_t>(kLanes, g.k - k0);
      Vec m[A * A], cols[M * A], out[M * M];
      for (int e = 0; e < A * A; ++e) load(m[e], mm + (e * g.chunk + t) * g.kp + k0);
      for (int j = 0; j < A; ++j) Transform<M, R>::output(m + j, A, cols + j, A);
      for (int i = 0; i < M; ++i) Transform<M, R>::output(cols + i * A, 1, out + i * M, 1);
      Vec b;
      load(b, bias + k0);
      for (int i = 0; i < M && y0 + i < g.ho; ++i)
        for (int j = 0; j < M && x0 + j < g.wo; ++j) {
          T* p = y + ((n * g.ho + y0 + i) * g.wo + x0 + j) * g.k + k0;
          Vec v = out[i * M + j] + b;
          for (int q = 0; q < posts; ++q) {
            const Post& o = post[q];
            if (o.kind == Post::Kind::relu) {
              for (int l = 0; l < kLanes; ++l) v[l] = v[l] > 0.f ? v[l] : 0.f;
            } else if (o.kind == Post::Kind::sum) {
              Vec s = {};
              if (lanes == kLanes) {
                load(s, p);
              } else {
                for (std::int64_t l = 0; l < lanes; ++l) s[l] = to_float(p[l]);
              }
              v += s;
            } else {
              for (int l = 0; l < kLanes; ++l) v[l] = o.scalar(v[l], o.alpha, o.beta);
            }
          }
          if (lanes == kLanes) {
            store(p, v);
          } else {
            for (std::int64_t l = 0; l < lanes; ++l) put(p[l], v[l]);
          }
        }
    }
  }
}

// The transforms built for each vector width: AVX-512 (one register per 16 channels), AVX2 with
// FMA (two), and the baseline (four SSE registers), for each element type. Which runs follows
// oneDNN's effective ISA (the CPU's, or less under ONEDNN_MAX_CPU_ISA), so that a capped run
// measures the transforms at the width the matmul runs at too.
using InputFn = void (*)(const Geometry&, const void*, void*, std::int64_t, std::int64_t,
                         std::int64_t);
using OutputFn = void (*)(const Geometry&, const float*, const float*, const Post*, int, void*,
                          std::int64_t, std::int64_t, std::int64_t);

template <int M, int R, class T>
void input_baseline(const Geometry& g, const void* x, void* v, std::int64_t chunk_first,
                    std::int64_t first, std::int64_t count) {
  input_tiles<M, R>(g, static_cast<const T*>(x), static_cast<T*>(v), chunk_first, first, count);
}
template <int M, int R, class T>
void output_baseline(const Geometry& g, const float* mm, const float* bias, const Post* post,
                     int posts, void* y, std::int64_t chunk_first, std::int64_t first,
                     std::int64_t count) {
  output_tiles<M, R>(g, mm, bias, post, posts, static_cast<T*>(y), chunk_first, first, count);
}
#ifdef KD_TARGET_X86
template <int M, int R, class T>
KD_TARGET_AVX512 void input_avx512(const Geometry& g, const void* x, void* v,
                                   std::int64_t chunk_first, std::int64_t first,
                                   std::int64_t count) {
  input_tiles<M, R>(g, static_cast<const T*>(x), static_cast<T*>(v), chunk_first, first, count);
}
template <int M, int R, class T>
KD_TARGET_AVX512 void output_avx512(const Geometry& g, const float* mm, const float* bias,
                                    const Post* post, int posts, void* y, std::int64_t chunk_first,
                                    std::int64_t first, std::int64_t count) {
  output_tiles<M, R>(g, mm, bias, post, posts, static_cast<T*>(y), chunk_first, first, count);
}
template <int M, int R, class T>
KD_TARGET_AVX2 void input_avx2(const Geometry& g, const void* x, void* v, std::int64_t chunk_first,
                               std::int64_t first, std::int64_t count) {
  input_tiles<M, R>(g, static_cast<const T*>(x), static_cast<T*>(v), chunk_first, first, count);
}
template <int M, int R, class T>
KD_TARGET_AVX2 void output_avx2(const Geometry& g, const float* mm, const float* bias,
                                const Post* post, int posts, void* y, std::int64_t chunk_first,
                                std::int64_t first, std::int64_t count) {
  output_tiles<M, R>(g, mm, bias, post, posts, static_cast<T*>(y), chunk_first, first, count);
}
#endif

struct Transforms {
  InputFn input = nullptr;
  OutputFn output = nullptr;
  const char* isa = "baseline";
};

// T: the element type of the input, the transformed tiles and the output (f32, or bf16).
template <int M, int R, class T>
Transforms transforms_for_isa() {
#ifdef KD_TARGET_X86
  switch (vector_isa()) {
  case VectorIsa::avx512: return {input_avx512<M, R, T>, output_avx512<M, R, T>, "avx512"};
  case VectorIsa::avx2: return {input_avx2<M, R, T>, output_avx2<M, R, T>, "avx2"};
  case VectorIsa::baseline: break;
  }
#endif
  return {input_baseline<M, R, T>, output_baseline<M, R, T>, "baseline"};
}

template <int M, int R>
Transforms transforms_for(dt act) {
  return act == dt::f32 ? transforms_for_isa<M, R, float>() : transforms_for_isa<M, R, Bf16>();
}

// U = G g G^T for every (output, input) channel pair, as the matmul's weights [alpha^2][cp][kp]
// (zero in the padding), from the ONNX kernel [K][C][R][R].
template <int M, int R>
std::vector<float> transformed_kernel(const Geometry& g, const std::vector<float>& w) {
  constexpr int A = M + R - 1;
  std::vector<float> u(static_cast<std::size_t>(A * A * g.cp * g.kp), 0.f);
  for (std::int64_t k = 0; k < g.k; ++k)
    for (std::int64_t c = 0; c < g.c; ++c) {
      const float* kr = w.data() + (k * g.c + c) * R * R;
      double half[A][R];
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < R; ++j) {
          double s = 0;
          for (int q = 0; q < R; ++q) s += Transform<M, R>::G[i][q] * kr[q * R + j];
          half[i][j] = s;
        }
      for (int i = 0; i < A; ++i)
        for (int j = 0; j < A; ++j) {
          double s = 0;
          for (int q = 0; q < R; ++q) s += half[i][q] * Transform<M, R>::G[j][q];
          u[static_cast<std::size_t>(((i * A + j) * g.cp + c) * g.kp + k)] = static_cast<float>(s);
        }
    }
  return u;
}

// The step's kernel: operands x, U, bias, v, mm, the matmul's scratchpad, y.
struct WinogradKernel {
  Geometry g;
  dnnl::engine eng;
  dnnl::matmul product;
  memory::desc v_md, u_md, mm_md, pad_md;
  std::vector<Post> post;
  Transforms transforms;

  void operator()(std::byte* const* ptrs) const {
    const void* x = ptrs[0];
    const auto* bias = reinterpret_cast<const float*>(ptrs[2]);
    void* v = ptrs[3];
    auto* mm = reinterpret_cast<float*>(ptrs[4]);
    void* y = ptrs[6];
    dnnl::stream stream(eng);
    const dnnl::memory v_mem(v_md, eng, v), u_mem(u_md, eng, ptrs[1]), mm_mem(mm_md, eng, mm),
        pad_mem(pad_md, eng, ptrs[5]);
    const std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, v_mem},
                                                        {DNNL_ARG_WEIGHTS, u_mem},
                                                        {DNNL_ARG_DST, mm_mem},
                                                        {DNNL_ARG_SCRATCHPAD, pad_mem}};
    const auto grain = std::max<std::int64_t>(1, g.chunk / 64);
    for (std::int64_t first = 0; first < g.tiles; first += g.chunk) {
      const std::int64_t count = std::min(g.chunk, g.tiles - first);
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, count, grain),
                                [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
                                  transforms.input(g, x, v, first, r.begin(), r.end() - r.begin());
                                });
      // A last chunk short of `chunk` tiles leaves rows of v from the chunk before: the matmul
      // computes their rows of mm too (rows are independent) and nothing reads them.
      product.execute(stream, args);
      stream.wait();
      oneapi::tbb::parallel_for(oneapi::tbb::blocked_range<std::int64_t>(0, count, grain),
                                [&](const oneapi::tbb::blocked_range<std::int64_t>& r) {
                                  transforms.output(g, mm, bias, post.data(),
                                                    static_cast<int>(post.size()), y, first,
                                                    r.begin(), r.end() - r.begin());
                                });
    }
  }
};

// Chosen by a scratch comparison on a Zen 4 (1 MiB L2 per core, 2 threads, ResNet-18 at 224,
// batch 32, tuned plans timed alternately), not a committed result: 2 MiB was the fastest of
// 128 KiB to 2 MiB, within that VM's noise of 512 KiB. A chunk's products are read back right
// after they are written, so the shared L3 serves them well enough. On a Zen 3 (512 KiB L2),
// twice the L2 ran 0.82-0.89x and 4 MiB 1.00-1.10x this size, within the rounds' spread
// (bench/results/teacher_winograd_chunk_zen3_974e087.json): the matmuls' size matters more.
constexpr std::int64_t kChunkBytesPerThread = 2 << 20;

} // namespace

std::vector<std::string> winograd_ways(const Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  using Ints = std::vector<std::int64_t>;
  if (node.int_attr("group", 1) != 1 || !g.is_constant(node.inputs[1]) ||
      node.ints_attr("strides") != Ints{1, 1} || node.ints_attr("dilations") != Ints{1, 1})
    return {};
  const Shape& ws = g.shape(node.inputs[1]);
  if (ws.size() != 4 || ws[2] != ws[3] || (ws[2] != 3 && ws[2] != 5) || ws[0] < kLanes ||
      ws[1] < kLanes)
    return {};
  // fp32 and bf16 (products in bf16; a bf16 plan's convolutions write bf16, as under PyTorch's
  // autocast); no int8. The output transform applies the activations itself.
  if (!plan.conv_into_channels_last(node)) return {};
  for (const auto& p : node.post_ops)
    if (p.kind != PostOp::Kind::sum &&
        (find_op(p.op) == nullptr || find_op(p.op)->activation == nullptr))
      return {};
  const dt act = plan.act();
  // In bf16 only F(2x2): its transforms add and subtract, so rounding the transformed tiles to
  // bf16 costs about what a direct bf16 convolution's rounding of its input costs (1.2-2x its
  // error on the winograd_* fixtures), where F(4x4)'s (weights 1/24 to 1, outputs summing 8x
  // products) multiplies bf16's error 10-20x (6e-2 against 3e-3 on the same fixtures). F(4x4)
  // with its tiles and products in f32 inside bf16 plans was built and timed (c167acf): on a Zen 5
  // it took 1.12-2.12x the time of the best bf16 way in each of its 60 timings (30 layers, 1 and 2
  // threads; bench/results/teacher_winograd4_bf16_*zen5_c167acf.json) and is not offered.
  // F(2x2, 5x5) shares F(4x4, 3x3)'s points and its coefficients (G's up to 2/3, a sum of 36
  // products per output), F(4x4, 5x5) F(6x6, 3x3)'s with +-1/2 (B^T's up to 5.25, 64 products),
  // so both are fp32's only, as F(4x4, 3x3) is. F(6x6, 3x3) itself, built on the same 8x8 tiles
  // and timed, lost to F(4x4, 3x3) on nearly every layer of a ResNet-18 (docs/DESIGN.md).
  if (ws[2] == 5)
    return act == dt::bf16 ? std::vector<std::string>{}
                           : std::vector<std::string>{"winograd_4x4", "winograd_2x2"};
  if (act == dt::bf16) return {"winograd_2x2"};
  return {"winograd_4x4", "winograd_2x2"};
}

void winograd_conv(Lowering& plan, const Node& node, int m) {
  const Graph& graph = plan.graph();
  const int r = static_cast<int>(graph.shape(node.inputs[1])[2]); // 3 or 5 (winograd_ways)
  // "Conv (winograd 2x2)" for 3x3 kernels as before; "Conv (winograd 2x2, 5x5)" for 5x5 ones.
  const std::string tile =
      r == 3 ? fmt::format("{}x{}", m, m) : fmt::format("{}x{}, {}x{}", m, m, r, r);
  plan.set_kind(fmt::format("Conv (winograd {})", tile));
  const Shape& xs = graph.shape(node.inputs[0]);
  const Shape& os = graph.shape(node.outputs[0]);
  const auto pads = node.ints_attr("pads");
  Geometry g;
  g.c = xs[1];
  g.k = os[1];
  g.cp = (g.c + kLanes - 1) / kLanes * kLanes;
  g.kp = (g.k + kLanes - 1) / kLanes * kLanes;
  g.h = xs[2];
  g.w = xs[3];
  g.ho = os[2];
  g.wo = os[3];
  g.pad_top = pads[0];
  g.pad_left = pads[1];
  g.tiles_w = (g.wo + m - 1) / m;
  g.tiles_per_image = ((g.ho + m - 1) / m) * g.tiles_w;
  g.tiles = xs[0] * g.tiles_per_image;
  // Chunks of about kChunkBytesPerThread of transformed tiles and products per thread, evened
  // out so that the last chunk is nearly full.
  const dt act = plan.act();
  const std::int64_t a2 = (m + r - 1) * (m + r - 1); // the transformed tile's elements
  const std::int64_t tile_bytes =
      a2 * (g.cp * static_cast<std::int64_t>(memory::data_type_size(act)) +
            g.kp * std::int64_t{sizeof(float)});
  const std::int64_t per_thread =
      std::clamp<std::int64_t>(kChunkBytesPerThread / tile_bytes, 8, 256);
  const std::int64_t target = std::min(g.tiles, per_thread * std::max(1, plan.threads()));
  const std::int64_t chunks = (g.tiles + target - 1) / target;
  g.chunk = (g.tiles + chunks - 1) / chunks;

  const memory::desc v_md({a2, g.chunk, g.cp}, act, memory::format_tag::abc);
  const memory::desc mm_md({a2, g.chunk, g.kp}, dt::f32, memory::format_tag::abc);
  const memory::desc u_user({a2, g.cp, g.kp}, dt::f32, memory::format_tag::abc);
  const dnnl::matmul::primitive_desc pd(
      plan.eng(), v_md, memory::desc({a2, g.cp, g.kp}, act, memory::format_tag::any), mm_md,
      Lowering::plain_attr());
  const std::vector<float>& w = graph.constants.at(node.inputs[1]).f;
  std::vector<float> bias(static_cast<std::size_t>(g.kp), 0.f);
  if (node.inputs.size() > 2 && !node.inputs[2].empty()) {
    const auto& b = graph.constants.at(node.inputs[2]).f;
    std::copy(b.begin(), b.end(), bias.begin());
  }
  const memory::desc bias_md({g.kp}, dt::f32, memory::format_tag::a);

  auto kernel = std::make_shared<WinogradKernel>();
  kernel->g = g;
  kernel->eng = plan.eng();
  kernel->product = dnnl::matmul(pd);
  kernel->transforms = r == 5 ? (m == 4 ? transforms_for<4, 5>(act) : transforms_for<2, 5>(act))
                              : (m == 4 ? transforms_for<4, 3>(act) : transforms_for<2, 3>(act));
  kernel->v_md = v_md;
  kernel->u_md = pd.weights_desc();
  kernel->mm_md = mm_md;
  const std::int64_t pad_bytes =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(pd.scratchpad_desc().get_size()));
  kernel->pad_md = memory::desc({pad_bytes}, dt::u8, memory::format_tag::a);
  const PostOp* sum = Lowering::sum_post(node);
  for (const auto& p : node.post_ops) {
    Post o;
    if (p.kind == PostOp::Kind::sum) {
      o.kind = Post::Kind::sum;
    } else {
      const Activation& a = *find_op(p.op)->activation;
      const bool relu = a.algorithm_for(p.alpha) == dnnl_eltwise_relu &&
                        a.onednn_params.value_or(std::pair{p.alpha, p.beta}).first == 0.f;
      o.kind = relu ? Post::Kind::relu : Post::Kind::activation;
      o.scalar = a.scalar;
      o.alpha = p.alpha;
      o.beta = p.beta;
    }
    kernel->post.push_back(o);
  }

  const memory::desc y_md(dims_of(os), act, memory::format_tag::acdb);
  ArgRef x = plan.get(node.inputs[0], memory::desc(dims_of(xs), act, memory::format_tag::acdb));
  ArgRef u = plan.weight(
      r == 5 ? (m == 4 ? transformed_kernel<4, 5>(g, w) : transformed_kernel<2, 5>(g, w))
             : (m == 4 ? transformed_kernel<4, 3>(g, w) : transformed_kernel<2, 3>(g, w)),
      u_user, pd.weights_desc());
  ArgRef b = plan.weight(std::move(bias), bias_md, bias_md);
  // With a residual sum it accumulates into the summand's buffer (dead after it), channels-last:
  // a copy where the summand lies otherwise (a view of another layout copied out).
  if (sum) plan.before_overwrite(sum->sum_input);
  ArgRef y = sum ? plan.get(sum->sum_input, y_md) : plan.new_buffer(y_md);
  plan.add_kernel(
      [kernel](std::byte* const* p) { (*kernel)(p); },
      {x, u, b, plan.new_buffer(v_md), plan.new_buffer(mm_md), plan.new_buffer(kernel->pad_md), y},
      node.describe(), KernelLoop::rows,
      fmt::format("kdflow winograd {} ({}{}) + {}", tile, kernel->transforms.isa,
                  act == dt::bf16 ? ", bf16" : "", pd.impl_info_str()));
  plan.set(node.outputs[0], y);
}

} // namespace kdflow::teacher
