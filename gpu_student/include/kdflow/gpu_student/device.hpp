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

// The rule, given how many CUDA devices the process sees: auto is CUDA device `local_rank`
// (torchrun's LOCAL_RANK; 0 for one process) where there is one, else the CPU. A node's local
// ranks never share a GPU: with fewer devices than local ranks (LOCAL_WORLD_SIZE) every rank
// refuses alike, before any rendezvous, whichever its own LOCAL_RANK. InputError naming
// student.device for cuda without a visible device or a name that is none of the three, and
// naming LOCAL_WORLD_SIZE when the node's GPUs are too few for its ranks.
Device choose_device(const std::string& wanted, int cuda_devices, int local_rank = 0,
                     int local_world = 1);
// The same against what LibTorch sees.
Device resolve_device(const std::string& wanted, int local_rank = 0, int local_world = 1);

// LibTorch's CPU intra-op threads for parallel work the calling thread starts.
int intra_op_threads();

} // namespace kdflow::student
