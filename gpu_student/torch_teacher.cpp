// Each node of the imported graph (after kdflow's passes: batch norms folded into convolutions,
// activations and residual sums as post-ops) as the matching ATen call. Nothing here is tuned:
// it is the straightforward LibTorch execution a colocated teacher gets.
#include "torch_teacher_impl.hpp"

#include "kdflow/core/error.hpp"
#include "torch_util.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

namespace kdflow::student {
namespace {

using teacher::Graph;
using teacher::Node;
using teacher::PostOp;
using teacher::Shape;

const std::set<std::string>& supported_ops() {
  static const std::set<std::string> ops = {"Conv",
                                            "BatchNormalization",
                                            "Relu",
                                            "LeakyRelu",
                                            "Clip",
                                            "Sigmoid",
                                            "HardSigmoid",
                                            "HardSwish",
                                            "Add",
                                            "Sub",
                                            "Mul",
                                            "Div",
                                            "MaxPool",
                                            "AveragePool",
                                            "GlobalAveragePool",
                                            "ReduceMean",
                                            "Flatten",
                                            "Reshape",
                                            "Squeeze",
                                            "Unsqueeze",
                                            "Identity",
                                            "Dropout",
                                            "Transpose",
                                            "Concat",
                                            "Split",
                                            "Slice",
                                            "Pad",
                                            "Gemm",
                                            "MatMul",
                                            "Softmax"};
  return ops;
}

torch::Tensor activation(const std::string& op, const torch::Tensor& x, float alpha, float beta) {
  if (op == "Relu") return torch::relu(x);
  if (op == "LeakyRelu") return torch::leaky_relu(x, alpha);
  if (op == "Clip") return torch::clamp(x, alpha, beta);
  if (op == "Sigmoid") return torch::sigmoid(x);
  if (op == "HardSigmoid") return torch::clamp(x * alpha + beta, 0.0, 1.0);
  if (op == "HardSwish") return x * torch::clamp(x / 6.0 + 0.5, 0.0, 1.0);
  throw std::logic_error("activation: " + op);
}

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

torch::Tensor pool(const Node& node, const torch::Tensor& x) {
  const auto k = node.ints_attr("kernel_shape"), s = node.ints_attr("strides"),
             d = node.ints_attr("dilations", {1, 1}), p = node.ints_attr("pads");
  const bool ceil = node.int_attr("ceil_mode", 0) != 0;
  const bool include_pad = node.int_attr("count_include_pad", 0) != 0;
  const bool is_max = node.op == "MaxPool";
  const bool native = symmetric(p) && p[0] * 2 <= k[0] && p[1] * 2 <= k[1];
  if (native) {
    if (is_max) return torch::max_pool2d(x, k, s, {p[0], p[1]}, d, ceil);
    return torch::avg_pool2d(x, k, s, {p[0], p[1]}, ceil, include_pad);
  }
  // Asymmetric (or wide) padding: pad explicitly, then pool without padding.
  const auto pads = torch_pads(p, 2);
  if (is_max)
    return torch::max_pool2d(
        torch::constant_pad_nd(x, pads, -std::numeric_limits<double>::infinity()), k, s, {0, 0}, d,
        ceil);
  const torch::Tensor sum =
      torch::avg_pool2d(torch::constant_pad_nd(x, pads, 0), k, s, {0, 0}, ceil, true);
  if (include_pad) return sum;
  // Exclude the padding from each window's count: divide by the pooled mask of real pixels.
  const torch::Tensor ones = torch::ones({1, 1, x.size(2), x.size(3)}, x.options());
  return sum / torch::avg_pool2d(torch::constant_pad_nd(ones, pads, 0), k, s, {0, 0}, ceil, true);
}

} // namespace

std::vector<torch::Tensor> TorchTeacher::Impl::forward(const torch::Tensor& input) const {
  torch::NoGradGuard no_grad;
  AutocastScope amp(bf16, torch::kBFloat16);
  std::unordered_map<std::string, torch::Tensor> env;
  const auto value = [&](const std::string& name) -> const torch::Tensor& {
    if (const auto c = constants.find(name); c != constants.end()) return c->second;
    return env.at(name);
  };
  env[graph.input] = input;
  for (const Node& node : graph.nodes) {
    const std::string& op = node.op;
    const Shape& os = graph.shape(node.outputs[0]);
    const torch::Tensor& x = value(node.inputs[0]);
    torch::Tensor y;
    std::vector<torch::Tensor> many;
    if (op == "Conv" && node.has("kdflow_unrolled")) {
      // Unrolled by the passes (unroll_tiny_maps): channels-last rows times the unrolled kernel.
      const torch::Tensor& w = value(node.inputs[1]);
      const torch::Tensor rows = x.permute({0, 2, 3, 1}).reshape({x.size(0), w.size(1)});
      y = torch::matmul(rows, w.reshape({w.size(0), w.size(1)}).t());
      if (node.inputs.size() > 2 && !node.inputs[2].empty()) y = y + value(node.inputs[2]);
      y = y.reshape({os[0], os[2], os[3], os[1]}).permute({0, 3, 1, 2}).contiguous();
    } else if (op == "Conv") {
      const auto s = node.ints_attr("strides"), d = node.ints_attr("dilations"),
                 p = node.ints_attr("pads");
      const torch::Tensor bias = node.inputs.size() > 2 && !node.inputs[2].empty()
                                     ? value(node.inputs[2])
                                     : torch::Tensor();
      const bool even = symmetric(p);
      y = torch::conv2d(
          even ? x : torch::constant_pad_nd(x, torch_pads(p, 2), 0), value(node.inputs[1]), bias, s,
          even ? std::vector<std::int64_t>{p[0], p[1]} : std::vector<std::int64_t>{0, 0}, d,
          node.int_attr("group", 1));
    } else if (op == "BatchNormalization") {
      y = torch::batch_norm(x, value(node.inputs[1]), value(node.inputs[2]), value(node.inputs[3]),
                            value(node.inputs[4]), false, 0.0, node.float_attr("epsilon", 1e-5f),
                            false);
    } else if (op == "Relu" || op == "LeakyRelu" || op == "Clip" || op == "Sigmoid" ||
               op == "HardSigmoid" || op == "HardSwish") {
      const float alpha = op == "Clip" ? node.float_attr("min", 0) : node.float_attr("alpha", 0);
      const float beta = op == "Clip" ? node.float_attr("max", 0) : node.float_attr("beta", 0);
      y = activation(op, x, alpha, beta);
    } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") {
      const torch::Tensor& b = value(node.inputs[1]);
      y = op == "Add" ? x + b : op == "Sub" ? x - b : op == "Mul" ? x * b : x / b;
    } else if (op == "MaxPool" || op == "AveragePool") {
      y = pool(node, x);
    } else if (op == "GlobalAveragePool") {
      y = x.mean({2, 3}, true);
    } else if (op == "ReduceMean") {
      y = x.mean(node.ints_attr("axes"), true).reshape(to_vector(os));
    } else if (op == "Flatten" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" ||
               op == "Identity" || op == "Dropout") {
      y = x.reshape(to_vector(os));
    } else if (op == "Transpose") {
      y = x.permute(node.ints_attr("perm"));
    } else if (op == "Concat") {
      std::vector<torch::Tensor> parts;
      for (const auto& name : node.inputs) parts.push_back(value(name));
      y = torch::cat(parts, node.int_attr("axis", 0));
    } else if (op == "Split") {
      many = torch::split_with_sizes(x, node.ints_attr("split"), node.int_attr("axis", 0));
    } else if (op == "Slice") {
      const auto start = node.ints_attr("starts_full"), step = node.ints_attr("steps_full");
      y = x;
      for (std::size_t d = 0; d < os.size(); ++d) {
        if (step[d] == 1 && start[d] == 0 && os[d] == x.size(static_cast<std::int64_t>(d)))
          continue;
        const torch::Tensor index = torch::arange(start[d], start[d] + os[d] * step[d], step[d],
                                                  torch::TensorOptions(device).dtype(torch::kLong));
        y = y.index_select(static_cast<std::int64_t>(d), index);
      }
    } else if (op == "Pad") {
      const auto pads = node.ints_attr("pads");
      const std::string mode = node.string_attr("mode", "constant");
      const std::size_t rank = os.size();
      if (mode == "constant") {
        y = torch::constant_pad_nd(x, torch_pads(pads, rank), node.float_attr("value", 0));
      } else {
        // reflect / edge pad the spatial dims only (the importer accepts nothing else).
        std::vector<std::int64_t> spatial;
        for (std::size_t d = rank; d-- > 2;) {
          spatial.push_back(pads[d]);
          spatial.push_back(pads[d + rank]);
        }
        y = at::pad(x, spatial, mode == "reflect" ? "reflect" : "replicate");
      }
    } else if (op == "Gemm") {
      torch::Tensor a = x.dim() > 2 ? x.reshape({x.size(0), -1}) : x;
      torch::Tensor b = value(node.inputs[1]);
      if (node.int_attr("transA", 0)) a = a.t();
      if (node.int_attr("transB", 0)) b = b.t();
      y = torch::matmul(a, b) * node.float_attr("alpha", 1);
      if (node.inputs.size() > 2 && !node.inputs[2].empty())
        y = y + value(node.inputs[2]) * node.float_attr("beta", 1);
    } else if (op == "MatMul") {
      y = torch::matmul(x, value(node.inputs[1]));
    } else if (op == "Softmax") {
      const auto axis = node.int_attr("axis", 1);
      if (node.int_attr("coerce_2d", 0) != 0)
        y = torch::softmax(x.flatten(axis), -1).reshape(x.sizes());
      else
        y = torch::softmax(x, axis);
    }
    for (const PostOp& post : node.post_ops)
      y = post.kind == PostOp::Kind::sum ? y + value(post.sum_input)
                                         : activation(post.op, y, post.alpha, post.beta);
    if (many.empty()) many.push_back(std::move(y));
    for (std::size_t k = 0; k < many.size(); ++k) env[node.outputs[k]] = std::move(many[k]);
  }
  std::vector<torch::Tensor> out;
  for (const auto& name : graph.outputs) out.push_back(value(name));
  return out;
}

TorchTeacher::TorchTeacher(const teacher::Graph& graph, const Device& device,
                           teacher::Precision precision)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.graph = graph;
  m.device = to_torch(device);
  m.bf16 = precision == teacher::Precision::bf16 && m.device.is_cuda();
  for (const Node& node : graph.nodes)
    if (!supported_ops().count(node.op))
      throw InputError(fmt::format("{} in {}: {} is not supported by the LibTorch executor",
                                   node.describe(), graph.file, node.op));
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
  const auto outputs = m.forward(
      torch::zeros(std::vector<std::int64_t>(graph.input_shape.begin(), graph.input_shape.end()),
                   torch::TensorOptions(m.device).dtype(torch::kFloat)));
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Shape want = graph.shape(graph.outputs[k]);
    if (outputs[k].sizes().vec() != std::vector<std::int64_t>(want.begin(), want.end()))
      throw InputError(fmt::format("{}: the LibTorch executor computes output {} as {}, the graph "
                                   "says {}",
                                   graph.file, graph.outputs[k],
                                   teacher::format_shape(outputs[k].sizes().vec()),
                                   teacher::format_shape(want)));
  }
}

TorchTeacher::~TorchTeacher() = default;

void TorchTeacher::run(const float* input, std::span<float* const> outputs) const {
  const Impl& m = *impl_;
  const Shape& in = m.graph.input_shape;
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

std::string TorchTeacher::device() const { return impl_->device.str(); }

} // namespace kdflow::student
