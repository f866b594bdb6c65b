// The student's device, decided once from student.device (auto | cpu | cuda) and passed down as a
// value: the trainer and the co-located teacher run where it says. Torch-free: the app includes it.
#pragma once

#include <string>

namespace kdflow::student {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0; // the CUDA device's
  [[nodiscard]] bool is_cuda() const { return kind == Kind::cuda; }
  friend bool operator==(const Device&, const Device&) = default;
};

// auto: CUDA device 0 where LibTorch sees one, else the CPU. InputError naming student.device for
// cuda without a visible device, or a name that is none of the three.
Device resolve_device(const std::string& wanted);

} // namespace kdflow::student
