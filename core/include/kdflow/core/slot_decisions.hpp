// One yes/no answer per ring slot, shared by the several teachers that work on the slot's batch
// side by side (kd.cache with several teachers: is the batch all in the cache?). The first teacher
// to ask answers it; the others read that answer, whatever they would have answered later, so
// either every teacher skips its forward pass or none does. The last teacher to finish the batch
// (SlotRing::finish_teaching) takes the answer, which clears it for the slot's next batch.
//
// Ordering: ask() is a CAS on the slot's byte (acq_rel), so a teacher that reads an answer sees
// what the one who gave it saw. take() runs after finish_teaching's acq_rel count has seen every
// teacher's ask(), and before the slot is published on; the next batch's asks come after the
// loader's refill, which that publish happens before.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace kdflow {

class SlotDecisions {
public:
  explicit SlotDecisions(std::uint32_t slots)
      : answers_(std::make_unique<std::atomic<std::uint8_t>[]>(slots)) {
    for (std::uint32_t i = 0; i < slots; ++i) answers_[i].store(kOpen, std::memory_order_relaxed);
  }

  // Slot `index`'s answer for its batch: `answer()`'s if this is the first ask since the last
  // take(), else the answer given then. `answer` runs only on the first asker.
  template <typename Answer>
  bool ask(std::uint32_t index, Answer&& answer) {
    std::atomic<std::uint8_t>& word = answers_[index];
    std::uint8_t now = word.load(std::memory_order_acquire);
    if (now == kOpen) {
      const std::uint8_t mine = answer() ? kYes : kNo;
      if (word.compare_exchange_strong(now, mine, std::memory_order_acq_rel)) return mine == kYes;
    }
    return now == kYes;
  }

  // The answer given for slot `index`'s batch (false when nobody asked), cleared for the next.
  bool take(std::uint32_t index) {
    return answers_[index].exchange(kOpen, std::memory_order_acq_rel) == kYes;
  }

private:
  enum : std::uint8_t { kOpen = 0, kYes = 1, kNo = 2 };
  std::unique_ptr<std::atomic<std::uint8_t>[]> answers_;
};

} // namespace kdflow
