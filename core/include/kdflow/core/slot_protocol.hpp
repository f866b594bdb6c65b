// The slot state word: the whole lock-free protocol in a few pure functions, shared by the ring and
// by the exhaustive-interleaving model check, so that what is checked is what runs.
//
// One 32-bit word per slot (32 bits: C++20 atomic wait maps straight onto a futex):
//   bit 0      closed flag (set by close(); every later transition keeps it)
//   bits 1..3  state
//   bits 4..31 lap = batch / slots, modulo 2^28
// Batch b always lives in slot b % slots, so the slot a stage waits for, and the value it waits
// for, follow from the batch number alone: no queue of indices, and in-order delivery is
// structural.
#pragma once

#include <cstdint>

namespace kdflow::slot_protocol {

enum class SlotState : std::uint32_t {
  free = 0,      // may be filled with batch `lap * slots + index`
  filling = 1,   // a loader writes inputs, labels, ids
  filled = 2,    // waiting for a teacher replica
  teaching = 3,  // a teacher replica reads inputs, writes its outputs
  ready = 4,     // waiting for the student
  in_flight = 5, // the student reads it (device copy in flight, or an in-place CPU step)
};
inline constexpr int kStates = 6;

inline constexpr std::uint32_t kClosedBit = 1u;
inline constexpr std::uint32_t kStateShift = 1;
inline constexpr std::uint32_t kLapShift = 4;

// The word value of `lap` in `state` (lap is truncated to its 28 bits by the shift).
constexpr std::uint32_t encode(std::uint64_t lap, SlotState state) {
  return static_cast<std::uint32_t>(lap << kLapShift) |
         (static_cast<std::uint32_t>(state) << kStateShift);
}
constexpr bool is_closed(std::uint32_t word) { return (word & kClosedBit) != 0; }
constexpr SlotState state_of(std::uint32_t word) {
  return static_cast<SlotState>((word >> kStateShift) & 7u);
}
constexpr bool holds(std::uint32_t word, std::uint64_t lap, SlotState state) {
  return (word & ~kClosedBit) == encode(lap, state);
}
// Added to the word to move forward within a lap (the closed bit is untouched by an add).
constexpr std::uint32_t advance_delta(SlotState from, SlotState to) {
  return (static_cast<std::uint32_t>(to) - static_cast<std::uint32_t>(from)) << kStateShift;
}
// Added to the word to go from in_flight to free for the next lap (batch + slots).
inline constexpr std::uint32_t kReleaseDelta =
    (1u << kLapShift) - (static_cast<std::uint32_t>(SlotState::in_flight) << kStateShift);

// What a stage waiting for (lap, from) does on seeing `word`. Producers stop as soon as the ring is
// closed; the consumer (drains = true) still takes a slot that is ready, so close() loses nothing
// that was finished. With several teachers (joins = true, from = filled), every teacher works on
// every batch: the first claims the slot (filled -> teaching), the others join it while it is
// teaching, and the last to finish hands it on (SlotRing::finish_teaching counts them).
enum class Decision { claim, join, stop, wait };
constexpr Decision decide(std::uint32_t word, std::uint64_t lap, SlotState from, bool drains,
                          bool joins = false) {
  const bool mine = holds(word, lap, from);
  if (is_closed(word) && !(drains && mine)) return Decision::stop;
  if (mine) return Decision::claim;
  return joins && holds(word, lap, SlotState::teaching) ? Decision::join : Decision::wait;
}

static_assert(encode(1, SlotState::in_flight) + kReleaseDelta == encode(2, SlotState::free));
static_assert(encode((1ull << 28) - 1, SlotState::in_flight) + kReleaseDelta ==
              encode(0, SlotState::free)); // the lap wraps cleanly

} // namespace kdflow::slot_protocol
