// Host-to-device bandwidth of the student's copy path (ring slots through the SlotFeeder) against
// the CUDA runtime's own copy from page-locked memory, measured in one run: bench-overlap reports
// both, at the run's slot size and at a large one. No torch headers.
#pragma once

#include "kdflow/core/slot_layout.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace kdflow::student {

struct H2dBandwidth {
  std::size_t bytes = 0; // per copy: one slot
  std::uint64_t copies = 0;
  // Ring slots in cudaHostRegister'ed memory: a producer thread publishes, the feeder copies on its
  // stream and releases each slot when its event completes (what the training loop does, minus
  // the step).
  double slots_gb_per_s = 0;
  // The peer: back-to-back cudaMemcpyAsync on one stream from cudaHostAlloc memory, same sizes.
  double memcpy_gb_per_s = 0;
  std::string slot_memory; // the ring's memory kind (cuda-pinned unless registration failed)
  [[nodiscard]] double ratio() const { return slots_gb_per_s / memcpy_gb_per_s; }
};

// nullopt without a CUDA device. Each side runs `copies` copies after a warm-up lap; the median of
// `repeats` windows is kept.
std::optional<H2dBandwidth> measure_h2d(const SlotLayout& layout, std::uint32_t slots,
                                        std::uint64_t copies, int repeats = 3);

} // namespace kdflow::student
