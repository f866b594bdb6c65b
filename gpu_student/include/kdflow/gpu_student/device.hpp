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

// auto: CUDA device `local_rank` (torchrun's LOCAL_RANK; 0 for one process) where LibTorch sees
// one, else the CPU. InputError naming student.device for cuda without a visible device, or a
// name that is none of the three, and naming LOCAL_RANK when it has no device of its own.
Device resolve_device(const std::string& wanted, int local_rank = 0);

} // namespace kdflow::student
