// A student the user brings: a module saved by torch.jit.script or torch.jit.trace, loaded with
// LibTorch and trained as it is. Its parameters and buffers are registered in the Net under their
// own names, sharing storage with the scripted module, so the optimizer, checkpoints and device
// moves of the built-in students apply unchanged.
#include "models.hpp"

#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <torch/script.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::student {
namespace {

// The first sentence of a LibTorch error, without its backtrace.
std::string first_sentence(const c10::Error& e) {
  std::string what = e.what_without_backtrace();
  what = what.substr(0, what.find('\n'));
  return what.substr(0, what.find(". "));
}

// The cause of an error from the TorchScript interpreter: the last line that says something (its
// message ends a serialized-code traceback).
std::string last_line(const std::exception& e) {
  std::string what = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    what = c10_error->what_without_backtrace();
  std::string line;
  std::istringstream in(what);
  for (std::string l; std::getline(in, l);)
    if (l.find_first_not_of(" \t") != std::string::npos) line = l;
  const auto start = line.find_first_not_of(" \t");
  return start == std::string::npos ? std::string("(no message)") : line.substr(start);
}

// Parameter and buffer names of nn::Module may not hold dots: "layer1.0.conv.weight" is kept as
// "layer1/0/conv/weight".
std::string registered_name(std::string name) {
  std::replace(name.begin(), name.end(), '.', '/');
  return name;
}

struct ScriptNet : Net {
  explicit ScriptNet(const StudentSpec& spec) : path(spec.path) {
    if (path.empty())
      throw InputError("student.arch = torchscript needs student.path (a module saved by "
                       "torch.jit.script(m).save(...) or torch.jit.trace)");
    check_script_archive(path, "student.path");
    try {
      module = torch::jit::load(path, torch::kCPU);
    } catch (const c10::Error& e) {
      throw InputError(fmt::format("student.path = {}: not a TorchScript archive ({})", path,
                                   first_sentence(e)));
    }
    if (!module.find_method("forward"))
      throw InputError(fmt::format("student.path = {}: the module has no forward method", path));
    std::int64_t trainable = 0;
    for (const auto& p : module.named_parameters(/*recurse=*/true)) {
      const bool floating = p.value.is_floating_point();
      register_parameter(registered_name(p.name), p.value, floating);
      trainable += floating ? p.value.numel() : 0;
    }
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      register_buffer(registered_name(b.name), b.value);
    if (trainable == 0)
      throw InputError(fmt::format(
          "student.path = {}: the module has no floating-point parameters to train", path));
    check_dry_batch(spec);
  }

  // A dict's entries besides the logits are the module's taps.
  torch::Tensor forward(torch::Tensor x, Taps& taps) override {
    const c10::IValue out = module.forward({x});
    const torch::Tensor logits = script_logits(out, path);
    if (out.isGenericDict())
      for (const auto& entry : out.toGenericDict())
        if (entry.key().isString() && entry.value().isTensor())
          taps.put(entry.key().toStringRef(), entry.value().toTensor());
    return logits;
  }
  std::vector<std::string> tap_names() const override { return taps; }

  void train(bool on) override {
    torch::nn::Module::train(on);
    module.train(on);
  }

  // One batch of two zero images through forward in eval mode: the shape the data gives must be
  // accepted and give [2, classes] floating-point logits. The buffers are put back afterwards (a
  // module traced in train mode updates BatchNorm's statistics even in eval mode).
  void check_dry_batch(const StudentSpec& spec) {
    torch::NoGradGuard no_grad;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> saved;
    for (const auto& b : module.named_buffers(/*recurse=*/true))
      saved.emplace_back(b.value, b.value.clone());
    const auto restore = [&] {
      for (auto& [buffer, copy] : saved) buffer.copy_(copy);
    };
    module.eval();
    const std::vector<std::int64_t> shape = {2, spec.channels, spec.height, spec.width_px};
    c10::IValue out;
    try {
      out = module.forward({torch::zeros(shape)});
    } catch (const std::exception& e) { // c10::Error, or the interpreter's runtime_error
      restore();
      throw InputError(fmt::format("student.path = {}: forward rejects a batch of shape [{}] "
                                   "(the data's images): {}",
                                   path, fmt::join(shape, ", "), last_line(e)));
    }
    module.train();
    restore();
    const torch::Tensor y = script_logits(out, path);
    if (out.isGenericDict())
      for (const auto& entry : out.toGenericDict())
        if (entry.key().isString() && entry.value().isTensor() &&
            !entry.value().toTensor().is_same(y))
          taps.push_back(entry.key().toStringRef());
    if (y.dim() != 2 || y.size(0) != 2 || y.size(1) != spec.classes || !y.is_floating_point())
      throw InputError(fmt::format(
          "student.path = {}: forward gives {} [{}] for a batch of 2; the data has {} classes, so "
          "the logits must be [2, {}]",
          path, c10::toString(y.scalar_type()), fmt::join(y.sizes(), ", "), spec.classes,
          spec.classes));
  }

  std::string path;
  torch::jit::Module module;
  std::vector<std::string> taps; // a dict's tensor entries besides the logits, in its order
};

} // namespace

// A TorchScript module is a zip archive: its first local header and its end record are checked
// before LibTorch reads it whole, so a large file of anything else is refused at once.
void check_script_archive(const std::string& path, std::string_view what) {
  const std::uint64_t size = check_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  char head[4] = {};
  in.read(head, sizeof(head));
  bool zip = in && std::memcmp(head, "PK\x03\x04", 4) == 0;
  if (zip) {
    // The end of central directory record lies in the last 22 bytes plus a comment of at most
    // 65535.
    const std::uint64_t tail = std::min<std::uint64_t>(size, 22 + 65535);
    std::string bytes(static_cast<std::size_t>(tail), '\0');
    in.seekg(static_cast<std::streamoff>(size - tail));
    in.read(bytes.data(), static_cast<std::streamsize>(tail));
    zip = in && bytes.rfind(std::string("PK\x05\x06", 4)) != std::string::npos;
  }
  if (!zip)
    throw InputError(fmt::format("{} {}: not a TorchScript archive (not a zip file, {} bytes)",
                                 what, path, size));
}

torch::Tensor script_logits(const c10::IValue& out, const std::string& path) {
  if (out.isTensor()) return out.toTensor();
  if (out.isTuple() && !out.toTupleRef().elements().empty() &&
      out.toTupleRef().elements()[0].isTensor())
    return out.toTupleRef().elements()[0].toTensor();
  if (out.isGenericDict() && !out.toGenericDict().empty()) {
    const auto dict = out.toGenericDict();
    for (const auto& entry : dict)
      if (entry.key().isString() && entry.key().toStringRef() == "logits" &&
          entry.value().isTensor())
        return entry.value().toTensor();
    if (dict.begin()->value().isTensor()) return dict.begin()->value().toTensor();
  }
  throw InputError(fmt::format("{}: forward returns {}, not the logits (a tensor, or a tuple or "
                               "dict whose first or 'logits' entry is one)",
                               path, out.tagKind()));
}

std::shared_ptr<Net> make_script_net(const StudentSpec& spec) {
  return std::make_shared<ScriptNet>(spec);
}

std::string script_digest(const std::string& path) {
  check_script_archive(path, "student.path");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return fmt::format("{:016x}", fnv1a(std::as_bytes(std::span(bytes.data(), bytes.size()))));
}

void save_script_net(Net& net, std::ostream& out) {
  auto* script = dynamic_cast<ScriptNet*>(&net);
  if (script == nullptr) throw std::logic_error("save_script_net: not a TorchScript student");
  const bool was_training = script->is_training();
  script->train(false); // saved for inference: eval() is what a user deploys
  script->module.save(out);
  script->train(was_training);
}

} // namespace kdflow::student
