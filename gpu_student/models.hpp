// The student networks, by name and width multiplier, in LibTorch. Input shape and class count
// come from the data. Private to gpu_student (includes torch).
#pragma once

#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/gpu_student/students.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kdflow::student {

// A built-in student written as an ONNX graph (student_export.cpp): each network writes its layers
// through this, in eval mode (BatchNorm folded into the convolution before it).
class GraphWriter {
public:
  GraphWriter(const StudentSpec& spec); // the graph's input "input", [batch, C, H, W]
  [[nodiscard]] const std::string& input() const { return g_.input; }
  std::string conv(const std::string& x, const torch::nn::Conv2dImpl& conv,
                   const torch::nn::BatchNorm2dImpl* bn);
  std::string linear(const std::string& x, const torch::nn::LinearImpl& fc);
  std::string relu(const std::string& x);
  std::string relu6(const std::string& x);
  std::string add(const std::string& a, const std::string& b);
  std::string max_pool(const std::string& x, std::int64_t k); // k x k, stride k, no padding
  std::string max_pool(const std::string& x, std::int64_t k, std::int64_t stride, std::int64_t pad);
  std::string global_mean(const std::string& x); // mean over height and width -> [batch, C]
  std::string flatten(const std::string& x);
  // The graph with `logits` renamed "logits" as its output, [batch, classes].
  teacher::Graph finish(const std::string& logits);

private:
  std::string node(const std::string& op, std::vector<std::string> inputs,
                   std::map<std::string, teacher::Attribute> attrs = {});
  std::string constant(const std::string& hint, const torch::Tensor& t);
  teacher::Graph g_;
  std::int64_t classes_;
  int count_ = 0;
};

// The intermediate outputs a feature loss reads from the student (its taps), by name: a network
// passes each of its taps to put() as it computes it, and the ones asked for are kept, in the
// order asked.
class Taps {
public:
  Taps() = default; // none asked for
  // `names` must outlive the Taps (the trainer's list, kept for the run: nothing copied per step).
  explicit Taps(std::span<const std::string> names) : names_(names), got_(names.size()) {}
  void put(const std::string& name, const torch::Tensor& t) {
    for (std::size_t k = 0; k < names_.size(); ++k)
      if (names_[k] == name) got_[k] = t;
  }
  // The next stage's output: "stage1", "stage2", ... in the order the network passes them.
  void stage(const torch::Tensor& t) {
    ++stages_;
    if (!names_.empty()) put("stage" + std::to_string(stages_), t);
  }
  [[nodiscard]] const std::vector<torch::Tensor>& got() const { return got_; }

private:
  std::span<const std::string> names_;
  std::vector<torch::Tensor> got_;
  int stages_ = 0;
};

struct Net : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x) {
    Taps none;
    return forward(x, none);
  }
  // The logits, each tap passed to `taps` on the way.
  virtual torch::Tensor forward(torch::Tensor x, Taps& taps) = 0;
  // The names forward() passes to its Taps: stage1..stageN (each stage's output) and penultimate
  // (what the classifier reads, [batch, features]) for the built-in students; a TorchScript
  // student's named outputs besides its logits.
  [[nodiscard]] virtual std::vector<std::string> tap_names() const = 0;
  // Writes the network's layers after `x`; returns the logits' value. InputError for a student
  // that has no ONNX form here (a TorchScript student is exported as TorchScript).
  virtual std::string export_onnx(GraphWriter& w, const std::string& x);
};

// The registry's network for `spec`. InputError for an unknown name or an input too small for the
// network's strides.
std::shared_ptr<Net> make_student(const StudentSpec& spec);

// script_net.cpp: a TorchScript module (spec.path) as a Net, checked at load with one dry batch of
// the data's shape (InputError naming the file: not an archive, no forward, an input it rejects,
// logits that are not [batch, spec.classes], no floating-point parameters); the digest of its
// file, for checkpoints; and the module saved back (trained, in eval mode) to `out`.
std::shared_ptr<Net> make_script_net(const StudentSpec& spec);
std::string script_digest(const std::string& path);
// A TorchScript module is a zip archive: its first local header and end record, checked before
// LibTorch reads the file whole (InputError "<what> <path>: ..." for anything else, at once).
void check_script_archive(const std::string& path, std::string_view what);
// The logits in what a TorchScript student's forward returns: the tensor itself, a tuple's first
// entry, a dict's "logits" entry (else its first); InputError naming `path` otherwise.
torch::Tensor script_logits(const c10::IValue& out, const std::string& path);
void save_script_net(Net& net, std::ostream& out);

} // namespace kdflow::student
