// Each node of the imported graph (after kdflow's passes: batch norms folded into convolutions,
// activations and residual sums as post-ops) as the matching ATen call, from a table keyed by op
// type. Nothing here is tuned: it is the straightforward LibTorch execution a colocated teacher
// gets.
#include "torch_teacher_impl.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/ops.hpp"
#include "torch_util.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

namespace kdflow::student {
namespace {

using teacher::Graph;
using teacher::Node;
using teacher::PostOp;
using teacher::resize_taps;
using teacher::ResizeTaps;
using teacher::Shape;
using Values = TorchTeacher::Impl::Values;
using OpFn = TorchTeacher::Impl::OpFn;
using ActivationFn = TorchTeacher::Impl::ActivationFn;

std::vector<std::int64_t> to_vector(const Shape& s) { return {s.begin(), s.end()}; }

// ONNX pads [begin..., end...] of the trailing spatial dims -> torch's pad list (last dim first).
std::vector<std::int64_t> torch_pads(const std::vector<std::int64_t>& pads, std::size_t dims) {
  std::vector<std::int64_t> out;
  for (std::size_t d = dims; d-- > 0;) {
    out.push_back(pads[d]);
    out.push_back(pads[d + dims]);
  }
  return out;
}

bool symmetric(const std::vector<std::int64_t>& pads) {
  const std::size_t half = pads.size() / 2;
  for (std::size_t d = 0; d < half; ++d)
    if (pads[d] != pads[d + half]) return false;
  return true;
}

bool has_input(const Node& node, std::size_t k) {
  return node.inputs.size() > k && !node.inputs[k].empty();
}

// --- the LibTorch lowering of each op ------------------------------------------------------------

std::vector<torch::Tensor> conv(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const torch::Tensor& w = value(node.inputs[1]);
  if (node.has("kdflow_unrolled")) {
    // Unrolled by the passes (unroll_tiny_maps): channels-last rows times the unrolled kernel.
    const Shape& os = value.m.graph.shape(node.outputs[0]);
    const torch::Tensor rows = x.permute({0, 2, 3, 1}).reshape({x.size(0), w.size(1)});
    torch::Tensor y = torch::matmul(rows, w.reshape({w.size(0), w.size(1)}).t());
    if (has_input(node, 2)) y = y + value(node.inputs[2]);
    return {y.reshape({os[0], os[2], os[3], os[1]}).permute({0, 3, 1, 2}).contiguous()};
  }
  const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
             p = node.ints_attr("pads");
  const torch::Tensor bias = has_input(node, 2) ? value(node.inputs[2]) : torch::Tensor();
  const bool even = symmetric(p);
  return {
      torch::conv2d(even ? x : torch::constant_pad_nd(x, torch_pads(p, 2), 0), w, bias, s,
                    even ? std::vector<std::int64_t>{p[0], p[1]} : std::vector<std::int64_t>{0, 0},
                    d, node.int_attr("group", 1))};
}

std::vector<torch::Tensor> batchnorm(const Values& value, const Node& node) {
  return {torch::batch_norm(value(node.inputs[0]), value(node.inputs[1]), value(node.inputs[2]),
                            value(node.inputs[3]), value(node.inputs[4]), false, 0.0,
                            node.float_attr("epsilon", 1e-5f), false)};
}

// An activation node is its input with itself as post-op (Step::post): one code for both.
std::vector<torch::Tensor> first_input(const Values& value, const Node& node) {
  return {value(node.inputs[0])};
}

// Add ('+'), Sub ('-'), Mul ('*') and Div (any other), broadcasting as numpy does.
template <char op>
std::vector<torch::Tensor> arithmetic(const Values& value, const Node& node) {
  const torch::Tensor &a = value(node.inputs[0]), &b = value(node.inputs[1]);
  if constexpr (op == '+')
    return {a + b};
  else if constexpr (op == '-')
    return {a - b};
  else if constexpr (op == '*')
    return {a * b};
  else
    return {a / b};
}

template <bool is_max>
std::vector<torch::Tensor> pool(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const auto k = node.ints_attr("kernel_shape"), s = node.ints_attr("strides"),
             d = node.ints_attr("dilations", {1, 1}), p = node.ints_attr("pads");
  const bool ceil = node.int_attr("ceil_mode", 0) != 0;
  const bool include_pad = node.int_attr("count_include_pad", 0) != 0;
  const bool native = symmetric(p) && p[0] * 2 <= k[0] && p[1] * 2 <= k[1];
  if (native) {
    if (is_max) return {torch::max_pool2d(x, k, s, {p[0], p[1]}, d, ceil)};
    return {torch::avg_pool2d(x, k, s, {p[0], p[1]}, ceil, include_pad)};
  }
  // Asymmetric (or wide) padding: pad explicitly, then pool without padding.
  const auto pads = torch_pads(p, 2);
  if (is_max)
    return {
        torch::max_pool2d(torch::constant_pad_nd(x, pads, -std::numeric_limits<double>::infinity()),
                          k, s, {0, 0}, d, ceil)};
  const torch::Tensor sum =
      torch::avg_pool2d(torch::constant_pad_nd(x, pads, 0), k, s, {0, 0}, ceil, true);
  if (include_pad) return {sum};
  // Exclude the padding from each window's count: divide by the pooled mask of real pixels.
  const torch::Tensor ones = torch::ones({1, 1, x.size(2), x.size(3)}, x.options());
  return {sum / torch::avg_pool2d(torch::constant_pad_nd(ones, pads, 0), k, s, {0, 0}, ceil, true)};
}

std::vector<torch::Tensor> global_average_pool(const Values& value, const Node& node) {
  return {value(node.inputs[0]).mean({2, 3}, true)};
}

std::vector<torch::Tensor> reduce_mean(const Values& value, const Node& node) {
  return {value(node.inputs[0])
              .mean(node.ints_attr("axes"), true)
              .reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

std::vector<torch::Tensor> reduce_l2(const Values& value, const Node& node) {
  return {value(node.inputs[0])
              .square()
              .sum(node.ints_attr("axes"), true)
              .sqrt()
              .reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

std::vector<torch::Tensor> reduce_sum(const Values& value, const Node& node) {
  return {value(node.inputs[0])
              .sum(node.ints_attr("axes"), true)
              .reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

std::vector<torch::Tensor> reduce_max(const Values& value, const Node& node) {
  torch::Tensor y = value(node.inputs[0]);
  for (const auto a : node.ints_attr("axes")) y = std::get<0>(y.max(a, true));
  return {y.reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

std::vector<torch::Tensor> expand(const Values& value, const Node& node) {
  return {
      value(node.inputs[0]).expand(to_vector(value.m.graph.shape(node.outputs[0]))).contiguous()};
}

std::vector<torch::Tensor> view(const Values& value, const Node& node) {
  return {value(node.inputs[0]).reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

std::vector<torch::Tensor> transpose(const Values& value, const Node& node) {
  return {value(node.inputs[0]).permute(node.ints_attr("perm"))};
}

std::vector<torch::Tensor> concat(const Values& value, const Node& node) {
  std::vector<torch::Tensor> parts;
  for (const auto& name : node.inputs) parts.push_back(value(name));
  return {torch::cat(parts, node.int_attr("axis", 0))};
}

std::vector<torch::Tensor> split(const Values& value, const Node& node) {
  return torch::split_with_sizes(value(node.inputs[0]), node.ints_attr("split"),
                                 node.int_attr("axis", 0));
}

std::vector<torch::Tensor> slice(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const Shape& os = value.m.graph.shape(node.outputs[0]);
  const auto start = node.ints_attr("starts_full"), step = node.ints_attr("steps_full");
  torch::Tensor y = x;
  for (std::size_t d = 0; d < os.size(); ++d) {
    if (step[d] == 1 && start[d] == 0 && os[d] == x.size(static_cast<std::int64_t>(d))) continue;
    const torch::Tensor index =
        torch::arange(start[d], start[d] + os[d] * step[d], step[d],
                      torch::TensorOptions(value.m.device).dtype(torch::kLong));
    y = y.index_select(static_cast<std::int64_t>(d), index);
  }
  return {y};
}

std::vector<torch::Tensor> pad(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const auto pads = node.ints_attr("pads");
  const std::string mode = node.string_attr("mode", "constant");
  const std::size_t rank = value.m.graph.shape(node.outputs[0]).size();
  if (mode == "constant")
    return {torch::constant_pad_nd(x, torch_pads(pads, rank), node.float_attr("value", 0))};
  // reflect / edge pad the spatial dims only (the importer accepts nothing else).
  std::vector<std::int64_t> spatial;
  for (std::size_t d = rank; d-- > 2;) {
    spatial.push_back(pads[d]);
    spatial.push_back(pads[d + rank]);
  }
  return {at::pad(x, spatial, mode == "reflect" ? "reflect" : "replicate")};
}

std::vector<torch::Tensor> gemm(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  torch::Tensor a = x.dim() > 2 ? x.reshape({x.size(0), -1}) : x;
  torch::Tensor b = value(node.inputs[1]);
  if (node.int_attr("transA", 0)) a = a.t();
  if (node.int_attr("transB", 0)) b = b.t();
  torch::Tensor y = torch::matmul(a, b) * node.float_attr("alpha", 1);
  if (has_input(node, 2)) y = y + value(node.inputs[2]) * node.float_attr("beta", 1);
  return {y};
}

std::vector<torch::Tensor> matmul(const Values& value, const Node& node) {
  const torch::Tensor y = torch::matmul(value(node.inputs[0]), value(node.inputs[1]));
  const float alpha = node.float_attr("alpha", 1); // a scale the passes fused
  return {alpha == 1 ? y : y * alpha};
}

std::vector<torch::Tensor> softmax(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const auto axis = node.int_attr("axis", 1);
  if (node.int_attr("coerce_2d", 0) != 0)
    return {torch::softmax(x.flatten(axis), -1).reshape(x.sizes())};
  return {torch::softmax(x, axis)};
}

std::vector<torch::Tensor> layer_norm(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const auto axis = node.int_attr("axis", -1);
  const std::vector<std::int64_t> normalized(x.sizes().begin() + axis, x.sizes().end());
  const auto full = [&](std::size_t k) {
    return has_input(node, k) ? value(node.inputs[k]).expand(normalized) : torch::Tensor();
  };
  return {torch::layer_norm(x, normalized, full(1), full(2), node.float_attr("epsilon", 1e-5f))};
}

std::vector<torch::Tensor> gather(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const auto axis = node.int_attr("axis", 0);
  const torch::Tensor i = value(node.inputs[1]).to(torch::kLong).flatten();
  return {torch::index_select(x, axis, torch::where(i < 0, i + x.size(axis), i))
              .reshape(to_vector(value.m.graph.shape(node.outputs[0])))};
}

// GatherND / ScatterND with their (constant) index tuples as one advanced index: batch axes as
// aranges broadcast against the tuples, negative indices wrapped.
c10::List<std::optional<torch::Tensor>> nd_index(const torch::Tensor& x, const torch::Tensor& idx,
                                                 std::int64_t batch_dims) {
  c10::List<std::optional<torch::Tensor>> index;
  for (std::int64_t d = 0; d < batch_dims; ++d) {
    std::vector<std::int64_t> shape(static_cast<std::size_t>(idx.dim() - 1), 1);
    shape[static_cast<std::size_t>(d)] = x.size(d);
    index.push_back(torch::arange(x.size(d), idx.options()).view(shape));
  }
  for (std::int64_t j = 0; j < idx.size(-1); ++j) {
    const torch::Tensor t = idx.select(-1, j);
    index.push_back(torch::where(t < 0, t + x.size(batch_dims + j), t));
  }
  return index;
}

std::vector<torch::Tensor> gather_nd(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const torch::Tensor idx = value(node.inputs[1]).to(x.device(), torch::kLong);
  return {x.index(nd_index(x, idx, node.int_attr("batch_dims", 0)))};
}

std::vector<torch::Tensor> scatter_nd(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const torch::Tensor idx = value(node.inputs[1]).to(x.device(), torch::kLong);
  const torch::Tensor& updates = value(node.inputs[2]);
  const std::string reduction = node.string_attr("reduction", "none");
  torch::Tensor y = x.clone();
  const auto index = nd_index(x, idx, 0);
  if (reduction == "none" || reduction == "add") {
    y.index_put_(index, updates.to(y.scalar_type()), reduction == "add");
    return {y};
  }
  // mul, max, min: the tuples in order, as the reference applies them.
  const torch::Tensor flat = idx.reshape({-1, idx.size(-1)}).cpu();
  const torch::Tensor rows = updates.reshape({flat.size(0), -1});
  for (std::int64_t t = 0; t < flat.size(0); ++t) {
    torch::Tensor slot = y;
    for (std::int64_t j = 0; j < flat.size(1); ++j) {
      std::int64_t q = flat[t][j].item<std::int64_t>();
      if (q < 0) q += x.size(j);
      slot = slot.select(0, q);
    }
    const torch::Tensor u = rows[t].view(slot.sizes()).to(y.scalar_type());
    slot.copy_(reduction == "mul"   ? slot * u
               : reduction == "max" ? torch::maximum(slot, u)
                                    : torch::minimum(slot, u));
  }
  return {y};
}

std::vector<torch::Tensor> einsum(const Values& value, const Node& node) {
  std::vector<torch::Tensor> operands;
  for (const std::string& v : node.inputs) operands.push_back(value(v));
  return {torch::einsum(node.string_attr("equation", ""), operands)};
}

// InstanceNormalization (a group per channel) and GroupNormalization (scale and bias per channel).
std::vector<torch::Tensor> group_norm(const Values& value, const Node& node) {
  const torch::Tensor& x = value(node.inputs[0]);
  const std::int64_t c = x.size(1);
  const std::int64_t groups =
      node.op == "InstanceNormalization" ? c : node.int_attr("num_groups", 1);
  const auto per_channel = [&](std::size_t k) { return value(node.inputs[k]).flatten(); };
  return {torch::group_norm(x, groups, per_channel(1).to(x.scalar_type()),
                            per_channel(2).to(x.scalar_type()), node.float_attr("epsilon", 1e-5f))};
}

// Resize: the taps the oneDNN engine's kernel samples with, as gathers and blends, columns then
// rows as that kernel blends them.
std::vector<torch::Tensor> resize(const Values& value, const Node& node) {
  torch::Tensor y = value(node.inputs[0]);
  const Shape& in = value.m.graph.shape(node.inputs[0]);
  const Shape& out = value.m.graph.shape(node.outputs[0]);
  for (const int axis : {1, 0}) {
    const ResizeTaps t = resize_taps(node, in, out, axis);
    const auto on = torch::TensorOptions().device(y.device());
    const torch::Tensor lo = torch::tensor(t.lo, on.dtype(torch::kLong));
    const torch::Tensor hi = torch::tensor(t.hi, on.dtype(torch::kLong));
    torch::Tensor w = torch::tensor(t.w, on.dtype(torch::kFloat)).to(y.scalar_type());
    w = axis == 0 ? w.view({-1, 1}) : w.view({1, -1});
    const torch::Tensor a = y.index_select(2 + axis, lo), b = y.index_select(2 + axis, hi);
    y = a + (b - a) * w;
  }
  return {y};
}

std::vector<torch::Tensor> erf(const Values& value, const Node& node) {
  return {torch::erf(value(node.inputs[0]))};
}

// An entry of the LibTorch op table: the node's call and, for an activation, the function its
// post-op applies.
struct TorchOp {
  OpFn run;
  ActivationFn activation = nullptr;
};

TorchOp activation(ActivationFn f) { return {first_input, f}; }

// The LibTorch lowering of every op the teacher's table runs at inference (the tests check that
// none is missing). Keyed by ONNX op type; after kdflow's passes, as the teacher's engine sees it.
const std::map<std::string, TorchOp, std::less<>>& torch_ops() {
  static const std::map<std::string, TorchOp, std::less<>> ops = {
      {"Conv", {conv}},
      {"BatchNormalization", {batchnorm}},
      {"Relu", activation([](const torch::Tensor& x, float, float) { return torch::relu(x); })},
      {"LeakyRelu", activation([](const torch::Tensor& x, float alpha, float) {
         return torch::leaky_relu(x, alpha);
       })},
      {"Clip", activation([](const torch::Tensor& x, float lo, float hi) {
         return torch::clamp(x, lo, hi);
       })},
      {"Sigmoid",
       activation([](const torch::Tensor& x, float, float) { return torch::sigmoid(x); })},
      {"Swish", activation([](const torch::Tensor& x, float alpha, float) {
         return x * torch::sigmoid(x * alpha);
       })},
      {"HardSigmoid", activation([](const torch::Tensor& x, float alpha, float beta) {
         return torch::clamp(x * alpha + beta, 0.0, 1.0);
       })},
      {"HardSwish", activation([](const torch::Tensor& x, float, float) {
         return x * torch::clamp(x / 6.0 + 0.5, 0.0, 1.0);
       })},
      {"Gelu", activation([](const torch::Tensor& x, float tanh_form, float) {
         return torch::gelu(x, tanh_form != 0 ? "tanh" : "none");
       })},
      {"Tanh", activation([](const torch::Tensor& x, float, float) { return torch::tanh(x); })},
      {"Sqrt", activation([](const torch::Tensor& x, float, float) { return torch::sqrt(x); })},
      {"Exp", activation([](const torch::Tensor& x, float, float) { return torch::exp(x); })},
      {"Log", activation([](const torch::Tensor& x, float, float) { return torch::log(x); })},
      {"Abs", activation([](const torch::Tensor& x, float, float) { return torch::abs(x); })},
      {"Neg", activation([](const torch::Tensor& x, float, float) { return -x; })},
      {"Pow", activation([](const torch::Tensor& x, float, float e) { return torch::pow(x, e); })},
      {"Erf", {erf}},
      {"Resize", {resize}},
      {"LayerNormalization", {layer_norm}},
      {"Gather", {gather}},
      {"GatherND", {gather_nd}},
      {"ScatterND", {scatter_nd}},
      {"Einsum", {einsum}},
      {"InstanceNormalization", {group_norm}},
      {"GroupNormalization", {group_norm}},
      {"Add", {arithmetic<'+'>}},
      {"Sub", {arithmetic<'-'>}},
      {"Mul", {arithmetic<'*'>}},
      {"Div", {arithmetic<'/'>}},
      {"MaxPool", {pool<true>}},
      {"AveragePool", {pool<false>}},
      {"GlobalAveragePool", {global_average_pool}},
      {"ReduceMean", {reduce_mean}},
      {"ReduceL2", {reduce_l2}},
      {"ReduceSum", {reduce_sum}},
      {"ReduceMax", {reduce_max}},
      {"Expand", {expand}},
      {"Flatten", {view}},
      {"Reshape", {view}},
      {"Squeeze", {view}},
      {"Unsqueeze", {view}},
      {"Identity", {view}},
      {"Dropout", {view}},
      {"Transpose", {transpose}},
      {"Concat", {concat}},
      {"Split", {split}},
      {"Slice", {slice}},
      {"Pad", {pad}},
      {"Gemm", {gemm}},
      {"MatMul", {matmul}},
      {"Softmax", {softmax}},
  };
  return ops;
}

} // namespace

const torch::Tensor& TorchTeacher::Impl::Values::operator()(const std::string& name) const {
  if (const auto c = m.constants.find(name); c != m.constants.end()) return c->second;
  return env.at(name);
}

torch::Tensor adapt_images(const ImageAdapter& adapter, const torch::Tensor& images) {
  if (adapter.passes_floats()) return images;
  namespace F = torch::nn::functional;
  torch::Tensor x = images.to(torch::kFloat);
  const ImageSpec& to = adapter.to();
  if (adapter.resizes()) // the adapter's (and PIL's) antialiased bilinear
    x = F::interpolate(x, F::InterpolateFuncOptions()
                              .size(std::vector<std::int64_t>{to.height, to.width})
                              .mode(torch::kBilinear)
                              .align_corners(false)
                              .antialias(true));
  if (adapter.from().channels != to.channels) x = x.expand({x.size(0), to.channels, -1, -1});
  const auto options = torch::TensorOptions().dtype(torch::kFloat);
  const torch::Tensor scale =
      torch::tensor(adapter.float_scale(), options).view({1, to.channels, 1, 1}).to(x.device());
  const torch::Tensor shift =
      torch::tensor(adapter.float_shift(), options).view({1, to.channels, 1, 1}).to(x.device());
  return x * scale + shift;
}

std::vector<torch::Tensor> TorchTeacher::Impl::forward(const torch::Tensor& input) const {
  if (graph.chunks == 1) return forward_once(input);
  // A model that fixes its batch: graph.batch rows at a time, as the oneDNN engine runs it.
  std::vector<std::vector<torch::Tensor>> parts;
  for (const torch::Tensor& rows : input.split(graph.batch)) parts.push_back(forward_once(rows));
  std::vector<torch::Tensor> out;
  for (std::size_t k = 0; k < parts.front().size(); ++k) {
    std::vector<torch::Tensor> pieces;
    for (const auto& p : parts) pieces.push_back(p[k]);
    out.push_back(torch::cat(pieces));
  }
  return out;
}

std::vector<torch::Tensor> TorchTeacher::Impl::forward_once(const torch::Tensor& input) const {
  torch::NoGradGuard no_grad;
  AutocastScope amp(bf16, torch::kBFloat16);
  std::unordered_map<std::string, torch::Tensor> env;
  const Values value{*this, env};
  env[graph.input] = input;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    const Step& step = steps[i];
    std::vector<torch::Tensor> out = step.run(value, node);
    for (const auto& [post, act] : step.post)
      out[0] = act != nullptr ? act(out[0], post.alpha, post.beta) : out[0] + value(post.sum_input);
    for (std::size_t k = 0; k < out.size(); ++k) env[node.outputs[k]] = std::move(out[k]);
  }
  std::vector<torch::Tensor> out;
  for (const auto& name : graph.outputs) out.push_back(value(name));
  for (const auto& name : graph.kept) out.push_back(value(name)); // the teacher's features
  return out;
}

TorchTeacher::TorchTeacher(const teacher::Graph& graph, const Device& device,
                           teacher::Precision precision)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.graph = graph;
  m.device = to_torch(device);
  m.bf16 = precision == teacher::Precision::bf16 && m.device.is_cuda();
  for (const Node& node : graph.nodes) {
    const auto op = torch_ops().find(node.op);
    if (op == torch_ops().end())
      throw InputError(fmt::format("{} in {}: {} is not supported by the LibTorch executor",
                                   node.describe(), graph.file, node.op));
    Impl::Step step{op->second.run, {}};
    if (op->second.activation != nullptr)
      step.post.emplace_back(teacher::activation_post_op(node), op->second.activation);
    // The passes fuse the teacher table's activations only, each of which has an entry here.
    for (const PostOp& post : node.post_ops)
      step.post.emplace_back(
          post, post.kind == PostOp::Kind::eltwise ? torch_ops().at(post.op).activation : nullptr);
    m.steps.push_back(std::move(step));
  }
  for (const auto& [name, t] : graph.constants) {
    const std::vector<std::int64_t> shape(t.shape.begin(), t.shape.end());
    torch::Tensor host =
        t.type == teacher::ElemType::f32
            ? torch::from_blob(const_cast<float*>(t.f.data()), shape, torch::kFloat).clone()
            : torch::from_blob(const_cast<std::int64_t*>(t.i.data()), shape, torch::kLong)
                  .to(torch::kFloat);
    m.constants[name] = host.to(m.device);
  }
  // One pass on zeros checks every value's shape against the graph's, so an op variant computed
  // differently here fails at load, naming its node, not with wrong logits later.
  const auto outputs = m.forward_once(
      torch::zeros(std::vector<std::int64_t>(graph.input_shape.begin(), graph.input_shape.end()),
                   torch::TensorOptions(m.device).dtype(torch::kFloat)));
  std::vector<std::string> names = graph.outputs;
  names.insert(names.end(), graph.kept.begin(), graph.kept.end());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Shape want = graph.shape(names[k]);
    if (outputs[k].sizes().vec() != std::vector<std::int64_t>(want.begin(), want.end()))
      throw InputError(fmt::format("{}: the LibTorch executor computes output {} as {}, the graph "
                                   "says {}",
                                   graph.file, names[k],
                                   teacher::format_shape(outputs[k].sizes().vec()),
                                   teacher::format_shape(want)));
  }
}

TorchTeacher::~TorchTeacher() = default;

void TorchTeacher::run(const float* input, std::span<float* const> outputs) const {
  const Impl& m = *impl_;
  Shape in = m.graph.input_shape;
  in[0] *= m.graph.chunks;
  const torch::Tensor x =
      torch::from_blob(const_cast<float*>(input), std::vector<std::int64_t>(in.begin(), in.end()),
                       torch::kFloat)
          .to(m.device);
  const std::vector<torch::Tensor> out = m.forward(x);
  for (std::size_t k = 0; k < out.size() && k < outputs.size(); ++k) {
    const torch::Tensor host = out[k].to(torch::kCPU, torch::kFloat).contiguous();
    std::copy_n(host.data_ptr<float>(), host.numel(), outputs[k]);
  }
}

std::vector<std::string> TorchTeacher::ops() {
  std::vector<std::string> names;
  for (const auto& [name, op] : torch_ops()) names.push_back(name);
  return names;
}

} // namespace kdflow::student
