// GatherND and ScatterND with constant indices (what exporters write: an adaptive pooling the
// dynamo exporter spells as a gather of window positions, Swin's shifted-window mask built by
// slice assignment). Where every input is a constant the node folds at import; otherwise it runs
// as a plain copy over slice offsets computed once at load: the work is moving bytes, which no
// oneDNN primitive does faster than memcpy of the contiguous slices.
#include "common.hpp"
#include "lowering.hpp"
#include "op_table.hpp"

#include <cstring>

#include <fmt/format.h>

namespace kdflow::teacher {
namespace {

// The index tuples of `indices` ([..., k]) as element offsets into data of shape `ds`, after
// `batch_dims` leading dimensions shared by data and indices; each addresses a contiguous slice
// of numel(ds[batch_dims + k:]) elements.
struct SliceOffsets {
  std::vector<std::int64_t> offsets;
  std::int64_t slice = 1;
};

SliceOffsets slice_offsets(const Node& node, const Shape& ds, const Tensor& indices,
                           std::int64_t batch_dims) {
  const Shape& is = indices.shape;
  const std::int64_t k = is.back();
  const Shape dst = strides_of(ds);
  SliceOffsets r;
  r.slice = numel(Shape(ds.begin() + batch_dims + k, ds.end()));
  const std::int64_t tuples = numel(Shape(is.begin(), is.end() - 1));
  const std::int64_t per_batch = numel(Shape(is.begin() + batch_dims, is.end() - 1));
  const Shape batch_shape(ds.begin(), ds.begin() + batch_dims);
  r.offsets.reserve(static_cast<std::size_t>(tuples));
  for (std::int64_t t = 0; t < tuples; ++t) {
    // The batch position of tuple t, as an offset into data.
    std::int64_t b = per_batch > 0 ? t / per_batch : 0, off = 0;
    for (std::int64_t d = batch_dims; d-- > 0;) {
      off += (b % ds[static_cast<std::size_t>(d)]) * dst[static_cast<std::size_t>(d)];
      b /= ds[static_cast<std::size_t>(d)];
    }
    for (std::int64_t j = 0; j < k; ++j) {
      const auto axis = static_cast<std::size_t>(batch_dims + j);
      std::int64_t q = indices.int_at(t * k + j);
      if (q < 0) q += ds[axis];
      if (q < 0 || q >= ds[axis])
        bad(node, fmt::format("index {} is out of range for axis {} of size {}",
                              indices.int_at(t * k + j), axis, ds[axis]));
      off += q * dst[axis];
    }
    r.offsets.push_back(off);
  }
  return r;
}

const Tensor& constant_indices(const Node& node, const std::vector<const Tensor*>& c) {
  if (c.size() < 2 || c[1] == nullptr)
    bad(node, "indices computed from the input data are not supported (kdflow runs at a fixed "
              "shape; export with the indices as constants)");
  return *c[1];
}

// --- GatherND ------------------------------------------------------------------------------------

std::vector<InferredOutput> infer_gather_nd(Node& node, const InferArgs& a) {
  const Shape &ds = a.in[0], &is = a.in[1];
  const std::int64_t b = node.int_attr("batch_dims", 0);
  if (is.empty()) bad(node, "indices must have at least one dimension");
  const std::int64_t k = is.back();
  const auto r = static_cast<std::int64_t>(ds.size()), q = static_cast<std::int64_t>(is.size());
  if (b < 0 || b >= std::min(r, q) || k < 1 || b + k > r)
    bad(node, fmt::format("indices {} with batch_dims = {} do not index data {}", format_shape(is),
                          b, format_shape(ds)));
  for (std::int64_t d = 0; d < b; ++d)
    if (ds[static_cast<std::size_t>(d)] != is[static_cast<std::size_t>(d)])
      bad(node, "data and indices differ in their batch dimensions");
  (void)constant_indices(node, a.constants);
  node.attrs["batch_dims"] = int_attribute(b);
  Shape out(is.begin(), is.end() - 1);
  out.insert(out.end(), ds.begin() + b + k, ds.end());
  return {{out, a.types[0]}};
}

std::vector<Tensor> evaluate_gather_nd(const Node& node, const std::vector<const Tensor*>& x,
                                       const std::vector<InferredOutput>& outs) {
  const Tensor& data = *x[0];
  const SliceOffsets s = slice_offsets(node, data.shape, *x[1], node.int_attr("batch_dims", 0));
  Tensor r;
  r.type = data.type;
  r.shape = outs[0].shape;
  for (const std::int64_t off : s.offsets)
    for (std::int64_t e = 0; e < s.slice; ++e) {
      const auto src = static_cast<std::size_t>(off + e);
      if (r.type == ElemType::f32)
        r.f.push_back(data.f[src]);
      else
        r.i.push_back(data.i[src]);
    }
  return {r};
}

void lower_gather_nd(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& ds = g.shape(node.inputs[0]);
  const SliceOffsets s =
      slice_offsets(node, ds, g.constants.at(node.inputs[1]), node.int_attr("batch_dims", 0));
  const dt type = plan.at(node.inputs[0]).md.get_data_type();
  const std::size_t bytes = static_cast<std::size_t>(s.slice) * memory::data_type_size(type);
  const std::size_t elem = memory::data_type_size(type);
  const ArgRef src = plan.get_plain(node.inputs[0], type);
  const ArgRef dst = plan.new_buffer(plain(g.shape(node.outputs[0]), type));
  plan.add_kernel(
      [offsets = s.offsets, bytes, elem](std::byte* const* p) {
        std::byte* out = p[1];
        for (const std::int64_t off : offsets) {
          std::memcpy(out, p[0] + static_cast<std::size_t>(off) * elem, bytes);
          out += bytes;
        }
      },
      {src, dst}, node.describe());
  plan.set(node.outputs[0], dst);
}

// --- ScatterND -----------------------------------------------------------------------------------

enum class Reduction { none, add, mul, max, min };

Reduction reduction_of(const Node& node) {
  const std::string r = node.string_attr("reduction", "none");
  if (r == "none") return Reduction::none;
  if (r == "add") return Reduction::add;
  if (r == "mul") return Reduction::mul;
  if (r == "max") return Reduction::max;
  if (r == "min") return Reduction::min;
  bad(node, fmt::format("reduction = '{}' is not supported", r));
}

template <typename T>
void scatter(T* out, const T* updates, const SliceOffsets& s, Reduction red) {
  for (std::size_t t = 0; t < s.offsets.size(); ++t) {
    T* dst = out + s.offsets[t];
    const T* src = updates + static_cast<std::int64_t>(t) * s.slice;
    for (std::int64_t e = 0; e < s.slice; ++e) switch (red) {
      case Reduction::none: dst[e] = src[e]; break;
      case Reduction::add: dst[e] += src[e]; break;
      case Reduction::mul: dst[e] *= src[e]; break;
      case Reduction::max: dst[e] = std::max(dst[e], src[e]); break;
      case Reduction::min: dst[e] = std::min(dst[e], src[e]); break;
      }
  }
}

std::vector<InferredOutput> infer_scatter_nd(Node& node, const InferArgs& a) {
  const Shape &ds = a.in[0], &is = a.in[1], &us = a.in[2];
  if (is.empty()) bad(node, "indices must have at least one dimension");
  const std::int64_t k = is.back();
  if (k < 1 || k > static_cast<std::int64_t>(ds.size()))
    bad(node, fmt::format("indices {} do not index data {}", format_shape(is), format_shape(ds)));
  Shape want(is.begin(), is.end() - 1);
  want.insert(want.end(), ds.begin() + k, ds.end());
  if (us != want)
    bad(node, fmt::format("updates {} should be {} for indices {} into data {}", format_shape(us),
                          format_shape(want), format_shape(is), format_shape(ds)));
  (void)reduction_of(node);
  (void)constant_indices(node, a.constants);
  if (a.types[0] != a.types[2]) bad(node, "data and updates differ in element type");
  return {{ds, a.types[0]}};
}

std::vector<Tensor> evaluate_scatter_nd(const Node& node, const std::vector<const Tensor*>& x,
                                        const std::vector<InferredOutput>&) {
  Tensor r = *x[0];
  const SliceOffsets s = slice_offsets(node, r.shape, *x[1], 0);
  if (r.type == ElemType::f32)
    scatter(r.f.data(), x[2]->f.data(), s, reduction_of(node));
  else
    scatter(r.i.data(), x[2]->i.data(), s, reduction_of(node));
  return {r};
}

void lower_scatter_nd(Lowering& plan, const Node& node) {
  const Graph& g = plan.graph();
  const Shape& ds = g.shape(node.inputs[0]);
  const auto operand = [&](const std::string& v) {
    return g.is_constant(v) ? plan.constant(v, g.shape(v)) : plan.get_plain(v, dt::f32);
  };
  const ArgRef data = operand(node.inputs[0]), updates = operand(node.inputs[2]);
  const ArgRef dst = plan.new_buffer(plain(ds, dt::f32));
  plan.add_kernel(
      [s = slice_offsets(node, ds, g.constants.at(node.inputs[1]), 0), red = reduction_of(node),
       bytes = static_cast<std::size_t>(numel(ds)) * sizeof(float)](std::byte* const* p) {
        std::memcpy(p[2], p[0], bytes);
        scatter(reinterpret_cast<float*>(p[2]), reinterpret_cast<const float*>(p[1]), s, red);
      },
      {data, updates, dst}, node.describe());
  plan.set(node.outputs[0], dst);
}

constexpr OpDef kOps[] = {
    {.name = "GatherND",
     .min_inputs = 2,
     .infer = infer_gather_nd,
     .evaluate = evaluate_gather_nd,
     .lower = lower_gather_nd},
    {.name = "ScatterND",
     .min_inputs = 3,
     .infer = infer_scatter_nd,
     .evaluate = evaluate_scatter_nd,
     .lower = lower_scatter_nd},
};

} // namespace

std::span<const OpDef> indexing_ops() { return kOps; }

} // namespace kdflow::teacher
