// Resize (opsets 11 on) over the two spatial axes of an NCHW tensor: nearest (every rounding) or
// linear, with the coordinate transformations exporters write (half_pixel, pytorch_half_pixel,
// align_corners, asymmetric). Where each output row and column samples is computed once at load
// (resize_taps); the reference, the engine's plain kernel and the LibTorch executor all use those
// taps, so they agree exactly.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include "kdflow/cpu_teacher/ops.hpp"

#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

const char* const kModes[] = {"nearest", "linear"};
const char* const kTransforms[] = {"half_pixel", "pytorch_half_pixel", "align_corners",
                                   "asymmetric"};
const char* const kRoundings[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};

template <std::size_t N>
void need_one_of(const Node& node, const char* attr, const std::string& v,
                 const char* const (&allowed)[N]) {
  for (const char* a : allowed)
    if (v == a) return;
  bad(node, fmt::format("{} = '{}' is not supported", attr, v));
}

// Output shape from `sizes` or from `scales` (floor(in * scale)); the scales the coordinate
// transformation uses are written to the node (kdflow_scale_h / _w): the given ones, or out / in.
std::vector<InferredOutput> infer_resize(Node& node, const InferArgs& a) {
  const Shape& x = a.in[0];
  if (x.size() != 4) bad(node, "only 4-D (NCHW) inputs are supported");
  const std::string mode = node.string_attr("mode", "nearest");
  const std::string transform = node.string_attr("coordinate_transformation_mode", "half_pixel");
  const std::string rounding = node.string_attr("nearest_mode", "round_prefer_floor");
  need_one_of(node, "mode", mode, kModes);
  need_one_of(node, "coordinate_transformation_mode", transform, kTransforms);
  need_one_of(node, "nearest_mode", rounding, kRoundings);
  if (node.int_attr("antialias", 0) != 0) bad(node, "antialias = 1 is not supported");
  if (node.has("axes")) bad(node, "the axes attribute is not supported");
  if (node.string_attr("keep_aspect_ratio_policy", "stretch") != "stretch")
    bad(node, "keep_aspect_ratio_policy other than 'stretch' is not supported");
  Shape out = x;
  double scale[2] = {0, 0};
  const bool sized = has_input(node, 3) && need_constant(node, a.constants, 3, "sizes").size() > 0;
  if (sized) {
    const Tensor& sizes = need_constant(node, a.constants, 3, "sizes");
    if (sizes.size() != 4) bad(node, "sizes must have 4 entries");
    for (std::size_t d = 0; d < 4; ++d) out[d] = sizes.as_ints()[d];
    for (std::size_t d = 0; d < 2; ++d)
      scale[d] = static_cast<double>(out[2 + d]) / static_cast<double>(x[2 + d]);
  } else {
    if (!has_input(node, 2)) bad(node, "neither scales nor sizes is given");
    const Tensor& scales = need_constant(node, a.constants, 2, "scales");
    if (scales.size() != 4) bad(node, "scales must have 4 entries");
    for (std::size_t d = 0; d < 4; ++d) {
      const double s = scales.at(static_cast<std::int64_t>(d));
      if (!(s > 0) || !std::isfinite(s)) bad(node, fmt::format("scale {} is not positive", s));
      out[d] = static_cast<std::int64_t>(std::floor(static_cast<double>(x[d]) * s));
      if (d >= 2) scale[d - 2] = s;
    }
  }
  if (out[0] != x[0] || out[1] != x[1]) bad(node, "only the two spatial axes may be resized");
  // Bounded before anything is allocated: at most 2^20 a side and 2^28 values a sample (1 GiB).
  if (out[2] < 1 || out[3] < 1 || out[2] > (std::int64_t{1} << 20) ||
      out[3] > (std::int64_t{1} << 20) || out[1] * out[2] * out[3] > (std::int64_t{1} << 28))
    bad(node, fmt::format("output {} is empty or too large", format_shape(out)));
  node.attrs["mode"].kind = Attribute::Kind::s;
  node.attrs["mode"].s = mode;
  node.attrs["coordinate_transformation_mode"].kind = Attribute::Kind::s;
  node.attrs["coordinate_transformation_mode"].s = transform;
  node.attrs["nearest_mode"].kind = Attribute::Kind::s;
  node.attrs["nearest_mode"].s = rounding;
  node.attrs["kdflow_scale_h"] = float_attribute(static_cast<float>(scale[0]));
  node.attrs["kdflow_scale_w"] = float_attribute(static_cast<float>(scale[1]));
  return {{out, ElemType::f32}};
}

// out[n, c] = rows and columns sampled by the taps, each a blend of two source positions.
void resample(const float* x, float* y, std::int64_t planes, std::int64_t ih, std::int64_t iw,
              const ResizeTaps& rows, const ResizeTaps& cols) {
  const auto oh = static_cast<std::int64_t>(rows.lo.size());
  const auto ow = static_cast<std::int64_t>(cols.lo.size());
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* src = x + p * ih * iw;
    float* dst = y + p * oh * ow;
    for (std::int64_t oy = 0; oy < oh; ++oy) {
      const float* r0 = src + rows.lo[static_cast<std::size_t>(oy)] * iw;
      const float* r1 = src + rows.hi[static_cast<std::size_t>(oy)] * iw;
      const float wy = rows.w[static_cast<std::size_t>(oy)];
      for (std::int64_t ox = 0; ox < ow; ++ox) {
        const auto c0 = cols.lo[static_cast<std::size_t>(ox)];
        const auto c1 = cols.hi[static_cast<std::size_t>(ox)];
        const float wx = cols.w[static_cast<std::size_t>(ox)];
        const float top = r0[c0] + (r0[c1] - r0[c0]) * wx;
        const float bottom = r1[c0] + (r1[c1] - r1[c0]) * wx;
        dst[oy * ow + ox] = top + (bottom - top) * wy;
      }
    }
  }
}

std::vector<Tensor> evaluate_resize(const Node& node, const std::vector<const Tensor*>& x,
                                    const std::vector<InferredOutput>& outs) {
  const Shape& xs = x[0]->shape;
  const Shape& os = outs[0].shape;
  std::vector<float> r(static_cast<std::size_t>(numel(os)));
  resample(x[0]->f.data(), r.data(), xs[0] * xs[1], xs[2], xs[3], resize_taps(node, xs, os, 0),
           resize_taps(node, xs, os, 1));
  return {Tensor::floats(os, std::move(r))};
}

void lower_resize(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& xs = g.shape(node.inputs[0]);
  const Shape& os = g.shape(node.outputs[0]);
  const ArgRef src = plan.get_plain(node.inputs[0], dt::f32);
  const ArgRef dst = plan.new_buffer(plain(os, dt::f32));
  plan.add_kernel(
      [planes = xs[0] * xs[1], ih = xs[2], iw = xs[3], rows = resize_taps(node, xs, os, 0),
       cols = resize_taps(node, xs, os, 1)](std::byte* const* p) {
        resample(reinterpret_cast<const float*>(p[0]), reinterpret_cast<float*>(p[1]), planes, ih,
                 iw, rows, cols);
      },
      {src, dst}, node.describe());
  plan.set(node.outputs[0], dst);
}

constexpr OpDef kOps[] = {
    {.name = "Resize",
     .float_inputs = 1,
     .infer = infer_resize,
     .evaluate = evaluate_resize,
     .lower = lower_resize},
};

} // namespace

std::span<const OpDef> resize_ops() { return kOps; }

ResizeTaps resize_taps(const Node& node, const Shape& in, const Shape& out, int axis) {
  const std::int64_t n_in = in[2 + static_cast<std::size_t>(axis)];
  const std::int64_t n_out = out[2 + static_cast<std::size_t>(axis)];
  const double scale = node.float_attr(axis == 0 ? "kdflow_scale_h" : "kdflow_scale_w", 1.f);
  const std::string mode = node.string_attr("mode", "nearest");
  const std::string transform = node.string_attr("coordinate_transformation_mode", "half_pixel");
  const std::string rounding = node.string_attr("nearest_mode", "round_prefer_floor");
  const auto clamp = [&](std::int64_t i) {
    return std::min(std::max<std::int64_t>(i, 0), n_in - 1);
  };
  ResizeTaps t;
  for (std::int64_t o = 0; o < n_out; ++o) {
    double x = 0;
    if (transform == "half_pixel")
      x = (static_cast<double>(o) + 0.5) / scale - 0.5;
    else if (transform == "pytorch_half_pixel")
      x = n_out > 1 ? (static_cast<double>(o) + 0.5) / scale - 0.5 : 0.0;
    else if (transform == "align_corners")
      x = n_out > 1 ? static_cast<double>(o) * static_cast<double>(n_in - 1) /
                          static_cast<double>(n_out - 1)
                    : 0.0;
    else // asymmetric
      x = static_cast<double>(o) / scale;
    if (mode == "nearest") {
      double i = 0;
      const double frac = x - std::floor(x);
      if (rounding == "floor")
        i = std::floor(x);
      else if (rounding == "ceil")
        i = std::ceil(x);
      else if (frac == 0.5)
        i = rounding == "round_prefer_floor" ? std::floor(x) : std::ceil(x);
      else
        i = std::round(x);
      const std::int64_t k = clamp(static_cast<std::int64_t>(i));
      t.lo.push_back(k);
      t.hi.push_back(k);
      t.w.push_back(0.f);
    } else { // linear: the two neighbours, edges repeated
      const double f = std::floor(x);
      t.lo.push_back(clamp(static_cast<std::int64_t>(f)));
      t.hi.push_back(clamp(static_cast<std::int64_t>(f) + 1));
      t.w.push_back(static_cast<float>(x - f));
    }
  }
  return t;
}

} // namespace kdflow::teacher
