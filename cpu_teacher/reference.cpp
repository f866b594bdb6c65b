// Reference ops: shape inference (with normalization of opset variants) and plain-loop evaluation.
#include "kdflow/cpu_teacher/reference.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

[[noreturn]] void bad(const Node& node, const std::string& what) {
  throw InputError(fmt::format("{}: {}", node.describe(), what));
}

std::int64_t norm_axis(const Node& node, std::int64_t axis, std::int64_t rank) {
  if (axis < -rank || axis >= std::max<std::int64_t>(rank, 1))
    bad(node, fmt::format("axis {} out of range for rank {}", axis, rank));
  return axis < 0 ? axis + rank : axis;
}

Shape strides_of(const Shape& s) {
  Shape st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

Shape broadcast(const Node& node, const Shape& a, const Shape& b) {
  const std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t k = 0; k < r; ++k) {
    const std::int64_t da = k + a.size() >= r ? a[k + a.size() - r] : 1;
    const std::int64_t db = k + b.size() >= r ? b[k + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      bad(node, fmt::format("shapes {} and {} do not broadcast", format_shape(a), format_shape(b)));
    out[k] = da == 1 ? db : da;
  }
  return out;
}

// Strides of `in` seen from an output of shape `out` under numpy broadcasting (0 on broadcast
// dims).
Shape broadcast_strides(const Shape& in, const Shape& out) {
  const Shape st = strides_of(in);
  Shape bs(out.size(), 0);
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::size_t o = k + out.size() - in.size();
    bs[o] = in[k] == 1 ? 0 : st[k];
  }
  return bs;
}

template <typename F>
void for_each_index(const Shape& shape, F&& f) {
  const std::int64_t n = numel(shape);
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    f(k, idx);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T>
T apply_binary(const std::string& op, T a, T b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  if constexpr (std::is_integral_v<T>)
    return b == 0 ? 0 : a / b; // ONNX integer Div truncates
  else
    return a / b;
}

float activation(const std::string& op, float x, float alpha, float beta) {
  if (op == "Relu") return x > 0 ? x : 0;
  if (op == "LeakyRelu") return x >= 0 ? x : alpha * x;
  if (op == "Clip") return std::min(std::max(x, alpha), beta);
  if (op == "Sigmoid") return 1.f / (1.f + std::exp(-x));
  if (op == "HardSigmoid") return std::max(0.f, std::min(1.f, alpha * x + beta));
  if (op == "HardSwish") return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f));
  return x; // Identity, Dropout
}

// Pooling / convolution output extent along one axis.
std::int64_t out_extent(std::int64_t in, std::int64_t k, std::int64_t stride, std::int64_t dil,
                        std::int64_t pb, std::int64_t pe, bool ceil_mode) {
  const std::int64_t eff = (k - 1) * dil + 1;
  const std::int64_t span = in + pb + pe - eff;
  std::int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // A window may not start in the right padding only (ceil mode).
  if (ceil_mode && (out - 1) * stride >= in + pb) --out;
  return out;
}

// Turns auto_pad into explicit pads and fills defaults for a 2-D window op.
void normalize_window(Node& node, const Shape& x, const Shape& kernel) {
  if (x.size() != 4)
    bad(node, fmt::format("only 2-D inputs (NCHW) are supported, got {}", format_shape(x)));
  const auto strides = node.ints_attr("strides", {1, 1});
  const auto dil = node.ints_attr("dilations", {1, 1});
  auto pads = node.ints_attr("pads", {0, 0, 0, 0});
  if (strides.size() != 2 || dil.size() != 2 || pads.size() != 4 || kernel.size() != 2)
    bad(node, "strides, dilations, kernel_shape and pads must describe 2 spatial axes");
  const std::string auto_pad = node.string_attr("auto_pad", "NOTSET");
  if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    for (int a = 0; a < 2; ++a) {
      const std::int64_t in = x[2 + a];
      const std::int64_t out = (in + strides[a] - 1) / strides[a];
      const std::int64_t total =
          std::max<std::int64_t>(0, (out - 1) * strides[a] + (kernel[a] - 1) * dil[a] + 1 - in);
      const std::int64_t small = total / 2;
      pads[a] = auto_pad == "SAME_UPPER" ? small : total - small;
      pads[a + 2] = total - pads[a];
    }
  } else if (auto_pad == "VALID") {
    pads = {0, 0, 0, 0};
  } else if (auto_pad != "NOTSET") {
    bad(node, "unknown auto_pad '" + auto_pad + "'");
  }
  node.attrs.erase("auto_pad");
  node.attrs["strides"] = {Attribute::Kind::ints, 0, 0, {}, strides, {}, {}};
  node.attrs["dilations"] = {Attribute::Kind::ints, 0, 0, {}, dil, {}, {}};
  node.attrs["pads"] = {Attribute::Kind::ints, 0, 0, {}, pads, {}, {}};
  node.attrs["kernel_shape"] = {Attribute::Kind::ints, 0, 0, {}, kernel, {}, {}};
}

Attribute ints_attribute(std::vector<std::int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::ints;
  a.ints = std::move(v);
  return a;
}
Attribute float_attribute(float v) {
  Attribute a;
  a.kind = Attribute::Kind::f;
  a.f = v;
  return a;
}
Attribute int_attribute(std::int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::i;
  a.i = v;
  return a;
}

const Tensor& need_constant(const Node& node, const std::vector<const Tensor*>& c, std::size_t k,
                            const char* what) {
  if (k >= c.size() || c[k] == nullptr)
    bad(node,
        fmt::format("input {} ({}) must be a constant: kdflow runs at a fixed shape", k, what));
  return *c[k];
}

bool has_input(const Node& node, std::size_t k) {
  return k < node.inputs.size() && !node.inputs[k].empty();
}

} // namespace

std::vector<InferredOutput> infer(Node& node, const std::vector<Shape>& in,
                                  const std::vector<ElemType>& types,
                                  const std::vector<const Tensor*>& c, std::int64_t opset) {
  const std::string& op = node.op;
  const auto f32 = [](Shape s) { return InferredOutput{std::move(s), ElemType::f32}; };
  const auto need_inputs = [&](std::size_t n) {
    if (in.size() < n) bad(node, fmt::format("needs {} inputs, has {}", n, in.size()));
  };
  if (op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "HardSigmoid" ||
      op == "HardSwish" || op == "Identity" || op == "Dropout") {
    need_inputs(1);
    if (op == "LeakyRelu") node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 0.01f));
    if (op == "HardSigmoid") {
      node.attrs["alpha"] = float_attribute(node.float_attr("alpha", 0.2f));
      node.attrs["beta"] = float_attribute(node.float_attr("beta", 0.5f));
    }
    return {{in[0], types[0]}};
  }
  if (op == "Clip") {
    need_inputs(1);
    float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
    if (opset < 11) {
      lo = node.float_attr("min", lo);
      hi = node.float_attr("max", hi);
    } else {
      if (has_input(node, 1)) lo = static_cast<float>(need_constant(node, c, 1, "min").at(0));
      if (has_input(node, 2)) hi = static_cast<float>(need_constant(node, c, 2, "max").at(0));
    }
    node.attrs["min"] = float_attribute(lo);
    node.attrs["max"] = float_attribute(hi);
    return {f32(in[0])};
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    need_inputs(2);
    return {{broadcast(node, in[0], in[1]), types[0]}};
  }
  if (op == "Conv") {
    need_inputs(2);
    const Shape& x = in[0];
    const Shape& w = in[1];
    if (w.size() != 4) bad(node, "only 2-D convolutions are supported");
    normalize_window(node, x, {w[2], w[3]});
    const std::int64_t group = node.int_attr("group", 1);
    if (group < 1 || x[1] != w[1] * group || w[0] % group != 0)
      bad(node, fmt::format("input {} and weights {} do not match group {}", format_shape(x),
                            format_shape(w), group));
    if (has_input(node, 2) && numel(in[2]) != w[0])
      bad(node, "bias size differs from output channels");
    node.attrs["group"] = int_attribute(group);
    const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
               p = node.ints_attr("pads");
    Shape out = {x[0], w[0], out_extent(x[2], w[2], s[0], d[0], p[0], p[2], false),
                 out_extent(x[3], w[3], s[1], d[1], p[1], p[3], false)};
    if (out[2] <= 0 || out[3] <= 0) bad(node, "output would be empty");
    return {f32(out)};
  }
  if (op == "BatchNormalization") {
    need_inputs(5);
    node.attrs["epsilon"] = float_attribute(node.float_attr("epsilon", 1e-5f));
    return {f32(in[0])};
  }
  if (op == "MaxPool" || op == "AveragePool") {
    need_inputs(1);
    const auto kernel = node.ints_attr("kernel_shape");
    if (kernel.size() != 2) bad(node, "kernel_shape must have 2 entries");
    if (op == "AveragePool" && node.has("dilations") &&
        node.ints_attr("dilations") != std::vector<std::int64_t>{1, 1})
      bad(node, "dilated AveragePool is not supported");
    if (node.has("storage_order") && node.int_attr("storage_order", 0) != 0)
      bad(node, "storage_order = 1 is not supported");
    normalize_window(node, in[0], kernel);
    const bool ceil_mode = node.int_attr("ceil_mode", 0) != 0;
    node.attrs["ceil_mode"] = int_attribute(ceil_mode);
    node.attrs["count_include_pad"] = int_attribute(node.int_attr("count_include_pad", 0));
    const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
               p = node.ints_attr("pads");
    const Shape& x = in[0];
    Shape out = {x[0], x[1], out_extent(x[2], kernel[0], s[0], d[0], p[0], p[2], ceil_mode),
                 out_extent(x[3], kernel[1], s[1], d[1], p[1], p[3], ceil_mode)};
    if (out[2] <= 0 || out[3] <= 0) bad(node, "output would be empty");
    if (node.outputs.size() > 1) bad(node, "the Indices output of MaxPool is not supported");
    return {f32(out)};
  }
  if (op == "GlobalAveragePool") {
    need_inputs(1);
    if (in[0].size() != 4) bad(node, "only NCHW inputs are supported");
    return {f32({in[0][0], in[0][1], 1, 1})};
  }
  if (op == "ReduceMean") {
    need_inputs(1);
    std::vector<std::int64_t> axes;
    if (opset >= 18 && has_input(node, 1))
      axes = need_constant(node, c, 1, "axes").as_ints();
    else
      axes = node.ints_attr("axes");
    const auto rank = static_cast<std::int64_t>(in[0].size());
    if (axes.empty()) {
      axes.resize(static_cast<std::size_t>(rank));
      std::iota(axes.begin(), axes.end(), 0);
    }
    for (auto& a : axes) a = norm_axis(node, a, rank);
    std::sort(axes.begin(), axes.end());
    const bool keep = node.int_attr("keepdims", 1) != 0;
    node.attrs["axes"] = ints_attribute(axes);
    node.attrs["keepdims"] = int_attribute(keep);
    Shape out;
    for (std::int64_t d = 0; d < rank; ++d) {
      const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
      if (!reduced)
        out.push_back(in[0][static_cast<std::size_t>(d)]);
      else if (keep)
        out.push_back(1);
    }
    return {f32(out)};
  }
  if (op == "Flatten") {
    need_inputs(1);
    const auto rank = static_cast<std::int64_t>(in[0].size());
    const std::int64_t axis =
        node.int_attr("axis", 1) < 0 ? node.int_attr("axis", 1) + rank : node.int_attr("axis", 1);
    if (axis < 0 || axis > rank) bad(node, "axis out of range");
    node.attrs["axis"] = int_attribute(axis);
    std::int64_t a = 1, b = 1;
    for (std::int64_t d = 0; d < rank; ++d)
      (d < axis ? a : b) *= in[0][static_cast<std::size_t>(d)];
    return {{{a, b}, types[0]}};
  }
  if (op == "Reshape") {
    need_inputs(2);
    const auto spec = need_constant(node, c, 1, "shape").as_ints();
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
      out[k] = spec[k] == 0 && !allowzero ? (k < in[0].size() ? in[0][k] : 0) : spec[k];
      known *= out[k];
    }
    if (infer_at >= 0)
      out[static_cast<std::size_t>(infer_at)] = known == 0 ? 0 : numel(in[0]) / known;
    if (numel(out) != numel(in[0]))
      bad(node, fmt::format("cannot reshape {} into {}", format_shape(in[0]), format_shape(out)));
    return {{out, types[0]}};
  }
  if (op == "Transpose") {
    need_inputs(1);
    const auto rank = in[0].size();
    auto perm = node.ints_attr("perm");
    if (perm.empty())
      for (std::size_t k = 0; k < rank; ++k)
        perm.push_back(static_cast<std::int64_t>(rank - 1 - k));
    if (perm.size() != rank) bad(node, "perm has the wrong length");
    node.attrs["perm"] = ints_attribute(perm);
    Shape out(rank);
    for (std::size_t k = 0; k < rank; ++k) out[k] = in[0][static_cast<std::size_t>(perm[k])];
    return {{out, types[0]}};
  }
  if (op == "Concat") {
    need_inputs(1);
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
    return {{out, types[0]}};
  }
  if (op == "Split") {
    need_inputs(1);
    const auto rank = static_cast<std::int64_t>(in[0].size());
    const std::int64_t axis = norm_axis(node, node.int_attr("axis", 0), rank);
    const std::int64_t total = in[0][static_cast<std::size_t>(axis)];
    std::vector<std::int64_t> split;
    if (opset >= 13 && has_input(node, 1))
      split = need_constant(node, c, 1, "split").as_ints();
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
      Shape o = in[0];
      o[static_cast<std::size_t>(axis)] = s;
      out.push_back({o, types[0]});
    }
    return out;
  }
  if (op == "Slice") {
    need_inputs(1);
    std::vector<std::int64_t> starts, ends, axes, steps;
    if (opset < 10) {
      starts = node.ints_attr("starts");
      ends = node.ints_attr("ends");
      axes = node.ints_attr("axes");
    } else {
      starts = need_constant(node, c, 1, "starts").as_ints();
      ends = need_constant(node, c, 2, "ends").as_ints();
      if (has_input(node, 3)) axes = need_constant(node, c, 3, "axes").as_ints();
      if (has_input(node, 4)) steps = need_constant(node, c, 4, "steps").as_ints();
    }
    const auto rank = static_cast<std::int64_t>(in[0].size());
    if (axes.empty())
      for (std::size_t k = 0; k < starts.size(); ++k) axes.push_back(static_cast<std::int64_t>(k));
    if (steps.empty()) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        steps.size() != starts.size())
      bad(node, "starts, ends, axes and steps differ in length");
    std::vector<std::int64_t> full_start(static_cast<std::size_t>(rank), 0),
        full_step(static_cast<std::size_t>(rank), 1);
    Shape out = in[0];
    for (std::size_t k = 0; k < starts.size(); ++k) {
      const auto a = static_cast<std::size_t>(norm_axis(node, axes[k], rank));
      const std::int64_t dim = in[0][a];
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
        out[a] = std::max<std::int64_t>(0, (e - s + step - 1) / step);
      } else {
        s = clampi(s, 0, dim - 1);
        e = clampi(e, -1, dim - 1);
        out[a] = std::max<std::int64_t>(0, (s - e + (-step) - 1) / (-step));
      }
      full_start[a] = s;
      full_step[a] = step;
    }
    node.attrs["starts_full"] = ints_attribute(full_start);
    node.attrs["steps_full"] = ints_attribute(full_step);
    return {{out, types[0]}};
  }
  if (op == "Pad") {
    need_inputs(1);
    std::vector<std::int64_t> pads;
    float value = 0;
    if (opset < 11) {
      pads = node.ints_attr("pads");
      value = node.float_attr("value", 0);
    } else {
      pads = need_constant(node, c, 1, "pads").as_ints();
      if (has_input(node, 2))
        value = static_cast<float>(need_constant(node, c, 2, "constant_value").at(0));
      if (has_input(node, 3)) bad(node, "the axes input of Pad is not supported");
    }
    const auto rank = in[0].size();
    if (pads.size() != 2 * rank) bad(node, "pads must have 2 entries per axis");
    const std::string mode = node.string_attr("mode", "constant");
    if (mode != "constant" && mode != "reflect" && mode != "edge")
      bad(node, "unknown mode '" + mode + "'");
    node.attrs["pads"] = ints_attribute(pads);
    node.attrs["value"] = float_attribute(value);
    Shape out = in[0];
    for (std::size_t k = 0; k < rank; ++k) out[k] += pads[k] + pads[k + rank];
    return {{out, types[0]}};
  }
  if (op == "Gemm") {
    need_inputs(2);
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
    return {f32({m, n})};
  }
  if (op == "MatMul") {
    need_inputs(2);
    Shape a = in[0], b = in[1];
    if (a.size() < 2 || b.size() < 2) bad(node, "1-D MatMul operands are not supported");
    if (a.back() != b[b.size() - 2])
      bad(node, fmt::format("{} and {} do not multiply", format_shape(a), format_shape(b)));
    Shape batch = broadcast(node, Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
    batch.push_back(a[a.size() - 2]);
    batch.push_back(b.back());
    return {f32(batch)};
  }
  if (op == "Softmax") {
    need_inputs(1);
    const auto rank = static_cast<std::int64_t>(in[0].size());
    const std::int64_t axis = norm_axis(node, node.int_attr("axis", opset < 13 ? 1 : -1), rank);
    node.attrs["axis"] = int_attribute(axis);
    node.attrs["coerce_2d"] = int_attribute(opset < 13 ? 1 : 0);
    return {f32(in[0])};
  }
  if (op == "Shape") {
    need_inputs(1);
    const auto rank = static_cast<std::int64_t>(in[0].size());
    std::int64_t start = node.int_attr("start", 0), end = node.int_attr("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<std::int64_t>(start, 0, rank);
    end = std::clamp<std::int64_t>(end, 0, rank);
    node.attrs["start"] = int_attribute(start);
    node.attrs["end"] = int_attribute(end);
    return {{{std::max<std::int64_t>(0, end - start)}, ElemType::i64}};
  }
  if (op == "Gather") {
    need_inputs(2);
    const auto rank = static_cast<std::int64_t>(in[0].size());
    const std::int64_t axis = norm_axis(node, node.int_attr("axis", 0), rank);
    node.attrs["axis"] = int_attribute(axis);
    Shape out(in[0].begin(), in[0].begin() + axis);
    out.insert(out.end(), in[1].begin(), in[1].end());
    out.insert(out.end(), in[0].begin() + axis + 1, in[0].end());
    return {{out, types[0]}};
  }
  if (op == "Unsqueeze" || op == "Squeeze") {
    need_inputs(1);
    std::vector<std::int64_t> axes;
    if (opset >= 13 && has_input(node, 1))
      axes = need_constant(node, c, 1, "axes").as_ints();
    else
      axes = node.ints_attr("axes");
    Shape out;
    if (op == "Unsqueeze") {
      const auto rank = static_cast<std::int64_t>(in[0].size() + axes.size());
      for (auto& a : axes) a = norm_axis(node, a, rank);
      std::size_t next = 0;
      for (std::int64_t d = 0; d < rank; ++d)
        out.push_back(std::find(axes.begin(), axes.end(), d) != axes.end() ? 1 : in[0][next++]);
    } else {
      const auto rank = static_cast<std::int64_t>(in[0].size());
      for (auto& a : axes) a = norm_axis(node, a, rank);
      for (std::int64_t d = 0; d < rank; ++d) {
        const bool listed = std::find(axes.begin(), axes.end(), d) != axes.end();
        const std::int64_t dim = in[0][static_cast<std::size_t>(d)];
        if (listed && dim != 1) bad(node, fmt::format("cannot squeeze axis {} of size {}", d, dim));
        if (!(listed || (axes.empty() && dim == 1))) out.push_back(dim);
      }
    }
    return {{out, types[0]}};
  }
  if (op == "Cast") {
    need_inputs(1);
    const std::int64_t to = node.int_attr("to", 1);
    // FLOAT (1) stays float; integer and bool targets become int64 (shape arithmetic).
    const ElemType t = to == 1 || to == 10 || to == 11 || to == 16 ? ElemType::f32 : ElemType::i64;
    return {{in[0], t}};
  }
  if (op == "Constant") {
    if (node.has("value") && node.attrs.at("value").t)
      return {{node.attrs.at("value").t->shape, node.attrs.at("value").t->type}};
    if (node.has("value_float")) return {{{}, ElemType::f32}};
    if (node.has("value_floats"))
      return {{{static_cast<std::int64_t>(node.attrs.at("value_floats").floats.size())},
               ElemType::f32}};
    if (node.has("value_int")) return {{{}, ElemType::i64}};
    if (node.has("value_ints"))
      return {
          {{static_cast<std::int64_t>(node.attrs.at("value_ints").ints.size())}, ElemType::i64}};
    bad(node, "has no value kdflow can read");
  }
  if (op == "ConstantOfShape") {
    need_inputs(1);
    const auto shape = need_constant(node, c, 0, "shape").as_ints();
    ElemType t = ElemType::f32;
    if (node.has("value") && node.attrs.at("value").t) t = node.attrs.at("value").t->type;
    return {{shape, t}};
  }
  throw InputError(
      fmt::format("{}: op type '{}' is not supported by kdflow's teacher", node.describe(), op));
}

std::vector<Tensor> evaluate(const Node& node, const std::vector<const Tensor*>& x,
                             const std::vector<InferredOutput>& outs, std::int64_t opset) {
  (void)opset;
  const std::string& op = node.op;
  const Shape& os = outs[0].shape;
  const auto out_f = [&](std::vector<float> data) {
    return std::vector<Tensor>{Tensor::floats(os, std::move(data))};
  };
  const auto same_type_copy = [&](const Tensor& t, const Shape& shape) {
    Tensor r = t;
    r.shape = shape;
    return r;
  };

  if (op == "Identity" || op == "Dropout" || op == "Reshape" || op == "Flatten" ||
      op == "Unsqueeze" || op == "Squeeze")
    return {same_type_copy(*x[0], os)};
  if (op == "Relu" || op == "LeakyRelu" || op == "Sigmoid" || op == "HardSigmoid" ||
      op == "HardSwish" || op == "Clip") {
    const float alpha = op == "Clip" ? node.float_attr("min", 0) : node.float_attr("alpha", 0);
    const float beta = op == "Clip" ? node.float_attr("max", 0) : node.float_attr("beta", 0);
    std::vector<float> r(x[0]->f.size());
    for (std::size_t k = 0; k < r.size(); ++k) r[k] = activation(op, x[0]->f[k], alpha, beta);
    return out_f(std::move(r));
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
    const Shape sa = broadcast_strides(x[0]->shape, os), sb = broadcast_strides(x[1]->shape, os);
    if (x[0]->type == ElemType::i64 && x[1]->type == ElemType::i64) {
      std::vector<std::int64_t> r(static_cast<std::size_t>(numel(os)));
      for_each_index(os, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
        std::int64_t ia = 0, ib = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) {
          ia += idx[d] * sa[d];
          ib += idx[d] * sb[d];
        }
        r[static_cast<std::size_t>(k)] = apply_binary(op, x[0]->i[static_cast<std::size_t>(ia)],
                                                      x[1]->i[static_cast<std::size_t>(ib)]);
      });
      return {Tensor::ints(os, std::move(r))};
    }
    std::vector<float> r(static_cast<std::size_t>(numel(os)));
    for_each_index(os, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
      std::int64_t ia = 0, ib = 0;
      for (std::size_t d = 0; d < idx.size(); ++d) {
        ia += idx[d] * sa[d];
        ib += idx[d] * sb[d];
      }
      r[static_cast<std::size_t>(k)] =
          apply_binary(op, static_cast<float>(x[0]->at(ia)), static_cast<float>(x[1]->at(ib)));
    });
    return out_f(std::move(r));
  }
  if (op == "Conv") {
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
                  acc += double(x[0]->f[static_cast<std::size_t>(
                             ((n * xs[1] + grp * icg + ic) * xs[2] + iy) * xs[3] + ix)]) *
                         x[1]->f[static_cast<std::size_t>(((oc * icg + ic) * ws[2] + ky) * ws[3] +
                                                          kx)];
                }
              }
            r[static_cast<std::size_t>(((n * os[1] + oc) * os[2] + oy) * os[3] + ox)] =
                static_cast<float>(acc);
          }
      }
    return out_f(std::move(r));
  }
  if (op == "BatchNormalization") {
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
    return out_f(std::move(r));
  }
  if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool") {
    const Shape& xs = x[0]->shape;
    const bool global = op == "GlobalAveragePool";
    const auto k = global ? Shape{xs[2], xs[3]} : node.ints_attr("kernel_shape");
    const auto s = global ? Shape{1, 1} : node.ints_attr("strides");
    const auto d = global ? Shape{1, 1} : node.ints_attr("dilations");
    const auto p = global ? Shape{0, 0, 0, 0} : node.ints_attr("pads");
    const bool include_pad = node.int_attr("count_include_pad", 0) != 0;
    const bool is_max = op == "MaxPool";
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
    return out_f(std::move(r));
  }
  if (op == "ReduceMean") {
    const Shape& xs = x[0]->shape;
    const auto axes = node.ints_attr("axes");
    Shape kept = xs;
    for (const auto a : axes) kept[static_cast<std::size_t>(a)] = 1;
    std::vector<double> acc(static_cast<std::size_t>(numel(kept)), 0.0);
    const Shape ks = strides_of(kept);
    for_each_index(xs, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
      std::int64_t o = 0;
      for (std::size_t dd = 0; dd < idx.size(); ++dd) o += (kept[dd] == 1 ? 0 : idx[dd]) * ks[dd];
      acc[static_cast<std::size_t>(o)] += x[0]->f[static_cast<std::size_t>(k)];
    });
    const double n = static_cast<double>(numel(xs)) / static_cast<double>(numel(kept));
    std::vector<float> r(acc.size());
    for (std::size_t k = 0; k < r.size(); ++k) r[k] = static_cast<float>(acc[k] / n);
    return out_f(std::move(r));
  }
  if (op == "Transpose") {
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
  if (op == "Concat") {
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
          if (t->type != ElemType::f32)
            throw InputError(node.describe() + ": inputs differ in type");
          r.f.insert(r.f.end(), t->f.begin() + o * chunk, t->f.begin() + (o + 1) * chunk);
        } else {
          for (std::int64_t q = 0; q < chunk; ++q) r.i.push_back(t->int_at(o * chunk + q));
        }
      }
    return {r};
  }
  if (op == "Split" || op == "Slice") {
    std::vector<Tensor> result;
    const Shape& xs = x[0]->shape;
    const Shape st = strides_of(xs);
    std::int64_t offset = 0;
    for (std::size_t out = 0; out < outs.size(); ++out) {
      std::vector<std::int64_t> start(xs.size(), 0), step(xs.size(), 1);
      if (op == "Slice") {
        start = node.ints_attr("starts_full");
        step = node.ints_attr("steps_full");
      } else {
        start[static_cast<std::size_t>(node.int_attr("axis", 0))] = offset;
        offset += node.ints_attr("split")[out];
      }
      Tensor r;
      r.type = x[0]->type;
      r.shape = outs[out].shape;
      for_each_index(r.shape, [&](std::int64_t, const std::vector<std::int64_t>& idx) {
        std::int64_t src = 0;
        for (std::size_t dd = 0; dd < idx.size(); ++dd)
          src += (start[dd] + idx[dd] * step[dd]) * st[dd];
        if (r.type == ElemType::f32)
          r.f.push_back(x[0]->f[static_cast<std::size_t>(src)]);
        else
          r.i.push_back(x[0]->i[static_cast<std::size_t>(src)]);
      });
      result.push_back(std::move(r));
    }
    return result;
  }
  if (op == "Pad") {
    std::vector<float> r(static_cast<std::size_t>(numel(os)));
    ref::pad(x[0]->f.data(), x[0]->shape, r.data(), os, node.ints_attr("pads"),
             node.string_attr("mode", "constant"), node.float_attr("value", 0));
    return out_f(std::move(r));
  }
  if (op == "Gemm" || op == "MatMul") {
    const Tensor& a = *x[0];
    const Tensor& b = *x[1];
    const bool gemm = op == "Gemm";
    const bool ta = gemm && node.int_attr("transA", 0), tb = gemm && node.int_attr("transB", 0);
    const float alpha = gemm ? node.float_attr("alpha", 1) : 1.f,
                beta = gemm ? node.float_attr("beta", 1) : 1.f;
    const std::int64_t m = os[os.size() - 2], n = os.back();
    const std::int64_t k = ta ? a.shape[a.shape.size() - 2] : a.shape.back();
    const Shape batch(os.begin(), os.end() - 2);
    const Shape abatch(a.shape.begin(), a.shape.end() - 2),
        bbatch(b.shape.begin(), b.shape.end() - 2);
    const Shape sa = broadcast_strides(abatch, batch), sb = broadcast_strides(bbatch, batch);
    std::vector<float> r(static_cast<std::size_t>(numel(os)));
    Shape cstr;
    if (gemm && x.size() > 2 && x[2]) cstr = broadcast_strides(x[2]->shape, {m, n});
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
          if (!cstr.empty())
            v += beta * x[2]->f[static_cast<std::size_t>(i * cstr[0] + j * cstr[1])];
          r[static_cast<std::size_t>(bi * m * n + i * n + j)] = static_cast<float>(v);
        }
      ++bi;
    });
    return out_f(std::move(r));
  }
  if (op == "Softmax") {
    const Shape& xs = x[0]->shape;
    const auto axis = static_cast<std::size_t>(node.int_attr("axis", 1));
    const bool coerce = node.int_attr("coerce_2d", 0) != 0;
    std::int64_t outer = 1, len = 1, inner = 1;
    for (std::size_t dd = 0; dd < xs.size(); ++dd) {
      if (dd < axis)
        outer *= xs[dd];
      else if (dd == axis || coerce)
        len *= xs[dd];
      else
        inner *= xs[dd];
    }
    std::vector<float> r(x[0]->f.size());
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t in = 0; in < inner; ++in) {
        const auto at = [&](std::int64_t q) {
          return static_cast<std::size_t>((o * len + q) * inner + in);
        };
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (std::int64_t q = 0; q < len; ++q) mx = std::max<double>(mx, x[0]->f[at(q)]);
        for (std::int64_t q = 0; q < len; ++q) sum += std::exp(x[0]->f[at(q)] - mx);
        for (std::int64_t q = 0; q < len; ++q)
          r[at(q)] = static_cast<float>(std::exp(x[0]->f[at(q)] - mx) / sum);
      }
    return out_f(std::move(r));
  }
  if (op == "Shape") {
    std::vector<std::int64_t> dims(x[0]->shape.begin() + node.int_attr("start", 0),
                                   x[0]->shape.begin() + node.int_attr("end", 0));
    return {Tensor::ints(os, dims)};
  }
  if (op == "Gather") {
    const Tensor& data = *x[0];
    const auto axis = static_cast<std::size_t>(node.int_attr("axis", 0));
    const std::int64_t outer =
        numel(Shape(data.shape.begin(), data.shape.begin() + static_cast<std::ptrdiff_t>(axis)));
    const std::int64_t dim = data.shape[axis];
    const std::int64_t inner =
        numel(Shape(data.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, data.shape.end()));
    const auto idx = x[1]->as_ints();
    Tensor r;
    r.type = data.type;
    r.shape = os;
    for (std::int64_t o = 0; o < outer; ++o)
      for (auto q : idx) {
        if (q < 0) q += dim;
        if (q < 0 || q >= dim) throw InputError(node.describe() + ": index out of range");
        for (std::int64_t in = 0; in < inner; ++in) {
          const std::int64_t src = (o * dim + q) * inner + in;
          if (r.type == ElemType::f32)
            r.f.push_back(data.f[static_cast<std::size_t>(src)]);
          else
            r.i.push_back(data.i[static_cast<std::size_t>(src)]);
        }
      }
    return {r};
  }
  if (op == "Cast") {
    const Tensor& t = *x[0];
    if (outs[0].type == ElemType::f32) {
      std::vector<float> r(static_cast<std::size_t>(t.size()));
      for (std::int64_t k = 0; k < t.size(); ++k)
        r[static_cast<std::size_t>(k)] = static_cast<float>(t.at(k));
      return out_f(std::move(r));
    }
    return {Tensor::ints(os, t.as_ints())};
  }
  if (op == "Constant") {
    if (node.has("value")) return {*node.attrs.at("value").t};
    if (node.has("value_float")) return {Tensor::floats({}, {node.attrs.at("value_float").f})};
    if (node.has("value_floats")) return {Tensor::floats(os, node.attrs.at("value_floats").floats)};
    if (node.has("value_int")) return {Tensor::ints({}, {node.attrs.at("value_int").i})};
    return {Tensor::ints(os, node.attrs.at("value_ints").ints)};
  }
  if (op == "ConstantOfShape") {
    const std::int64_t n = numel(os);
    if (outs[0].type == ElemType::i64) {
      const std::int64_t v = node.has("value") ? node.attrs.at("value").t->int_at(0) : 0;
      return {Tensor::ints(os, std::vector<std::int64_t>(static_cast<std::size_t>(n), v))};
    }
    const float v = node.has("value") ? static_cast<float>(node.attrs.at("value").t->at(0)) : 0.f;
    return out_f(std::vector<float>(static_cast<std::size_t>(n), v));
  }
  throw InputError(
      fmt::format("{}: op type '{}' is not supported by kdflow's teacher", node.describe(), op));
}

namespace ref {

void binary(const std::string& op, const float* a, const Shape& as, const float* b, const Shape& bs,
            float* out, const Shape& os) {
  const Shape sa = broadcast_strides(as, os), sb = broadcast_strides(bs, os);
  for_each_index(os, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t ia = 0, ib = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
    }
    out[k] = apply_binary(op, a[ia], b[ib]);
  });
}

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

void slice(const float* src, const Shape& ss, float* dst, const Shape& ds,
           const std::vector<std::int64_t>& starts, const std::vector<std::int64_t>& steps) {
  const Shape st = strides_of(ss);
  for_each_index(ds, [&](std::int64_t k, const std::vector<std::int64_t>& idx) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) off += (starts[d] + idx[d] * steps[d]) * st[d];
    dst[k] = src[off];
  });
}

} // namespace ref
} // namespace kdflow::teacher
