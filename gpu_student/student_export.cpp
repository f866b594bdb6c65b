// The trained student out of kdflow: built-in students as ONNX graphs written from their layers
// (GraphWriter, BatchNorm folded into the convolutions), TorchScript students saved back as
// TorchScript, and an exported TorchScript file run again for the export's check.
#include "models.hpp"

#include "kdflow/core/error.hpp"
#include "torch_util.hpp"

#include <torch/script.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace kdflow::student {
namespace {

using teacher::Attribute;

std::vector<float> host_floats(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().to(torch::kCPU).to(torch::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

} // namespace

std::string Net::export_onnx(GraphWriter&, const std::string&) {
  throw InputError("this student has no ONNX form in kdflow (a TorchScript student is exported as "
                   "TorchScript: train.export = torchscript)");
}

GraphWriter::GraphWriter(const StudentSpec& spec) : classes_(spec.classes) {
  g_.opset = 17;
  g_.batch = 1;
  g_.input = "input";
  g_.input_shape = {1, spec.channels, spec.height, spec.width_px};
  g_.shapes[g_.input] = g_.input_shape;
}

std::string GraphWriter::node(const std::string& op, std::vector<std::string> inputs,
                              std::map<std::string, Attribute> attrs) {
  teacher::Node n;
  n.op = op;
  n.name = fmt::format("{}_{}", op, count_++);
  n.inputs = std::move(inputs);
  n.outputs = {n.name + "_out"};
  n.attrs = std::move(attrs);
  g_.nodes.push_back(std::move(n));
  return g_.nodes.back().outputs[0];
}

std::string GraphWriter::constant(const std::string& hint, const torch::Tensor& t) {
  const std::string name = fmt::format("{}_{}", hint, count_++);
  g_.constants[name] =
      teacher::Tensor::floats({t.sizes().begin(), t.sizes().end()}, host_floats(t));
  return name;
}

std::string GraphWriter::conv(const std::string& x, const torch::nn::Conv2dImpl& conv,
                              const torch::nn::BatchNorm2dImpl* bn) {
  const auto& o = conv.options;
  torch::Tensor w = conv.weight.detach().to(torch::kCPU).to(torch::kDouble);
  torch::Tensor b = conv.bias.defined() ? conv.bias.detach().to(torch::kCPU).to(torch::kDouble)
                                        : torch::zeros({w.size(0)}, torch::kDouble);
  if (bn != nullptr) { // eval-mode BatchNorm folded in: y = (conv - mean) * gamma / sd + beta
    const auto cpu = [](const torch::Tensor& t) {
      return t.detach().to(torch::kCPU).to(torch::kDouble);
    };
    const torch::Tensor scale =
        cpu(bn->weight) / torch::sqrt(cpu(bn->running_var) + bn->options.eps());
    w = w * scale.view({-1, 1, 1, 1});
    b = (b - cpu(bn->running_mean)) * scale + cpu(bn->bias);
  }
  const auto& k = *o.kernel_size();
  const auto& s = *o.stride();
  const auto& d = *o.dilation();
  const auto* pad = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (pad == nullptr) throw std::logic_error("GraphWriter::conv: padding given by mode");
  const std::int64_t ph = (**pad)[0], pw = (**pad)[1];
  return node("Conv", {x, constant("w", w), constant("b", b)},
              {{"kernel_shape", teacher::ints_attribute({k[0], k[1]})},
               {"strides", teacher::ints_attribute({s[0], s[1]})},
               {"dilations", teacher::ints_attribute({d[0], d[1]})},
               {"pads", teacher::ints_attribute({ph, pw, ph, pw})},
               {"group", teacher::int_attribute(o.groups())}});
}

std::string GraphWriter::linear(const std::string& x, const torch::nn::LinearImpl& fc) {
  std::vector<std::string> in = {x, constant("w", fc.weight)};
  if (fc.bias.defined()) in.push_back(constant("b", fc.bias));
  return node("Gemm", std::move(in), {{"transB", teacher::int_attribute(1)}});
}

std::string GraphWriter::relu(const std::string& x) { return node("Relu", {x}); }

std::string GraphWriter::relu6(const std::string& x) {
  return node("Clip",
              {x, constant("min", torch::tensor(0.f)), constant("max", torch::tensor(6.f))});
}

std::string GraphWriter::add(const std::string& a, const std::string& b) {
  return node("Add", {a, b});
}

std::string GraphWriter::max_pool(const std::string& x, std::int64_t k) {
  return max_pool(x, k, k, 0);
}

std::string GraphWriter::max_pool(const std::string& x, std::int64_t k, std::int64_t stride,
                                  std::int64_t pad) {
  return node("MaxPool", {x},
              {{"kernel_shape", teacher::ints_attribute({k, k})},
               {"strides", teacher::ints_attribute({stride, stride})},
               {"pads", teacher::ints_attribute({pad, pad, pad, pad})}});
}

std::string GraphWriter::global_mean(const std::string& x) {
  return flatten(node("GlobalAveragePool", {x}));
}

std::string GraphWriter::flatten(const std::string& x) {
  return node("Flatten", {x}, {{"axis", teacher::int_attribute(1)}});
}

teacher::Graph GraphWriter::finish(const std::string& logits) {
  for (auto& n : g_.nodes)
    for (auto& out : n.outputs)
      if (out == logits) out = "logits";
  g_.outputs = {"logits"};
  g_.shapes["logits"] = {1, classes_};
  return std::move(g_);
}

struct ScriptRunner::Impl {
  std::string path;
  StudentSpec spec;
  torch::Device where;
  torch::jit::Module m;
};

ScriptRunner::ScriptRunner(const std::string& path, const StudentSpec& spec, const Device& device)
    : impl_(std::make_unique<Impl>(Impl{path, spec, to_torch(device), {}})) {
  check_script_archive(path, "--model");
  try {
    impl_->m = torch::jit::load(path, impl_->where);
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw InputError(
        fmt::format("{}: not a TorchScript archive ({})", path, what.substr(0, what.find('\n'))));
  }
  impl_->m.eval();
}

ScriptRunner::~ScriptRunner() = default;

std::vector<float> run_torchscript(const std::string& path, std::span<const float> images,
                                   const StudentSpec& spec, const Device& device,
                                   std::int64_t batch, double* seconds) {
  return ScriptRunner(path, spec, device).run(images, batch, seconds);
}

std::vector<float> ScriptRunner::run(std::span<const float> images, std::int64_t batch,
                                     double* seconds) {
  const std::string& path = impl_->path;
  const StudentSpec& spec = impl_->spec;
  const torch::Device where = impl_->where;
  torch::jit::Module& m = impl_->m;
  torch::NoGradGuard no_grad;
  const std::int64_t sample = spec.channels * spec.height * spec.width_px;
  const auto count = static_cast<std::int64_t>(images.size()) / sample;
  std::vector<float> logits;
  double forward_s = 0;
  for (std::int64_t i = 0; i < count; i += batch) {
    const std::int64_t n = std::min(batch, count - i);
    const torch::Tensor x =
        torch::from_blob(const_cast<float*>(images.data()) + i * sample,
                         {n, spec.channels, spec.height, spec.width_px}, torch::kFloat)
            .to(where);
    const auto t0 = std::chrono::steady_clock::now();
    const c10::IValue out = m.forward({x});
    const torch::Tensor y = script_logits(out, path);
    const std::vector<float> rows = host_floats(y); // waits for the device
    forward_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    logits.insert(logits.end(), rows.begin(), rows.end());
  }
  if (seconds != nullptr) *seconds = forward_s;
  return logits;
}

} // namespace kdflow::student
