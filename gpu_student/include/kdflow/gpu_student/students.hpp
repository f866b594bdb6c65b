// The student networks kdflow builds, by name: the registry's public face (torch-free). The
// registry itself, one entry per architecture, is in gpu_student/models.cpp.
#pragma once

#include "kdflow/gpu_student/device.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kdflow::student {

// A student to build: its architecture (a registry name), width multiplier, and the data's input
// shape and class count.
struct StudentSpec {
  std::string arch = "cnn";
  double width = 1.0; // channel multiplier
  std::int64_t channels = 1, height = 28, width_px = 28, classes = 10;
  std::string path;          // arch "torchscript": the saved module (student.path)
  std::string stem = "auto"; // cifar | imagenet | auto (imagenet from kImagenetStemFrom pixels)
};

// The registry's names, in its order (student.arch's choices).
std::vector<std::string> student_names();
// student.stem's choices, and the stem a spec's network is built with: `auto` is the ImageNet stem
// for inputs of at least kImagenetStemFrom pixels a side where the architecture has one, else the
// CIFAR stem. InputError naming student.stem for a stem the architecture lacks.
inline constexpr std::int64_t kImagenetStemFrom = 96;
std::vector<std::string> stem_names();
std::string resolve_stem(const StudentSpec& spec);

// An exported TorchScript student (`path`) run in eval mode on `device` over `images` (float32
// [count, C, H, W] of spec's shape, normalized as the data), `batch` images at a time: its
// logits, [count, classes] row-major; `seconds`, when given, receives the forward passes' time.
// InputError naming the file when it is no TorchScript archive or gives no logits.
std::vector<float> run_torchscript(const std::string& path, std::span<const float> images,
                                   const StudentSpec& spec, const Device& device,
                                   std::int64_t batch = 256, double* seconds = nullptr);

// The same, the module loaded once for many calls (an evaluation a chunk at a time).
class ScriptRunner {
public:
  ScriptRunner(const std::string& path, const StudentSpec& spec, const Device& device);
  ~ScriptRunner();
  ScriptRunner(const ScriptRunner&) = delete;
  ScriptRunner& operator=(const ScriptRunner&) = delete;
  std::vector<float> run(std::span<const float> images, std::int64_t batch = 256,
                         double* seconds = nullptr);

private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace kdflow::student
