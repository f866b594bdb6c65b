// The imported teacher graph executed with LibTorch ops on the student's device: the `colocated`
// baseline of bench-overlap (the teacher's forward pass on the student's device before each step,
// as torchdistill, Distiller and knowledge-distillation-pytorch do), and an implementation of the
// graph independent of oneDNN for the tests. Torch-free header.
#pragma once

#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/gpu_student/device.hpp"

#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kdflow::student {

class TorchTeacher {
public:
  // Copies the graph's weights to `device` once. bf16: autocast on CUDA, as a mixed-precision
  // colocated teacher runs (fp32 on the CPU). InputError naming the node for an op variant this
  // executor does not run.
  TorchTeacher(const teacher::Graph& graph, const Device& device,
               teacher::Precision precision = teacher::Precision::fp32);
  ~TorchTeacher();
  TorchTeacher(const TorchTeacher&) = delete;
  TorchTeacher& operator=(const TorchTeacher&) = delete;

  // Host float32 input of the graph's input shape -> host outputs (the graph outputs in order).
  void run(const float* input, std::span<float* const> outputs) const;
  // The op types this executor runs (its LibTorch op table), sorted.
  [[nodiscard]] static std::vector<std::string> ops();

  struct Impl; // torch-level interface, for the trainer (torch_teacher_impl.hpp)
  [[nodiscard]] const Impl& impl() const { return *impl_; }

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow::student
