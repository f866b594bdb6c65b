// A plain NCHW float tensor of few channels (a network's image input: 1 to 4 planes) quantized
// channels-last by kdflow's own kernel instead of oneDNN's reorder (internal).
#pragma once

#include "lowering.hpp"

#include <optional>
#include <string>

namespace kdflow::teacher {

struct PlanarKernel {
  Kernel kernel;
  std::string impl; // StepInfo::impl
};

// The kernel for a reorder of `from` (4-D, f32, plain abcd, 1-4 channels) into `to` (the same
// dims, channels-last acdb, u8 or s8: the value divided by `scale`, rounded to nearest even and
// saturated, byte for byte as oneDNN's quantizing reorder writes it), run over the calling
// thread's arena. Operands: the source, the destination. nullopt where it does not apply: other
// layouts, types or channel counts, or a vector ISA below AVX-512 (the effective one, as
// ONEDNN_MAX_CPU_ISA caps it), or a CPU without AVX512_VBMI. oneDNN's reorder runs there.
std::optional<PlanarKernel> planar_to_channels_last(const memory::desc& from,
                                                    const memory::desc& to, float scale);

} // namespace kdflow::teacher
