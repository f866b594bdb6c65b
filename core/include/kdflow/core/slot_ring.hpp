// The slot ring: a bounded, lock-free hand-off of batches from loaders to teacher replicas to the
// student, in one slab of (page-locked) host memory. Batch b lives in slot b % slots; each stage
// waits for "its" batch number, so several loaders and replicas may finish out of order while the
// student still receives batch k+1 after batch k. See slot_protocol.hpp for the state word.
#pragma once

#include "kdflow/core/host_memory.hpp"
#include "kdflow/core/slot_layout.hpp"
#include "kdflow/core/slot_protocol.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

namespace kdflow {

using slot_protocol::SlotState;

// A claimed slot: valid from the acquire that returned it until the publish/release that hands it
// on.
class Slot {
public:
  Slot(std::uint64_t batch, std::uint32_t index, std::byte* base, const SlotLayout* layout)
      : batch_(batch), index_(index), base_(base), layout_(layout) {}

  [[nodiscard]] std::uint64_t batch() const { return batch_; }
  [[nodiscard]] std::uint32_t index() const { return index_; }
  [[nodiscard]] std::byte* data() const { return base_; }
  [[nodiscard]] SlotHeader& header() const { return *reinterpret_cast<SlotHeader*>(base_); }
  // Region `i` of the layout as T (hot paths keep the index; name lookups are for set-up).
  template <typename T>
  [[nodiscard]] std::span<T> region(std::size_t i) const {
    const Region& r = layout_->regions()[i];
    return {reinterpret_cast<T*>(base_ + r.offset), r.bytes / sizeof(T)};
  }

private:
  std::uint64_t batch_;
  std::uint32_t index_;
  std::byte* base_;
  const SlotLayout* layout_;
};

enum class RingStage { loader = 0, teacher = 1, student = 2 };
inline constexpr int kRingStages = 3;

struct RingStats {
  std::array<std::uint32_t, slot_protocol::kStates> occupancy{}; // slots in each state now
  struct Stage {
    std::uint64_t acquisitions = 0; // slots this stage claimed
    std::uint64_t waits = 0;        // claims that had to wait
    std::uint64_t wait_ns = 0;      // time spent waiting in those claims
  };
  std::array<Stage, kRingStages> stages{};
};

class SlotRing {
public:
  // `memory` must hold slots * layout.slot_bytes(). `teachers`: the teacher stages every batch
  // goes through side by side (several teachers, each its own replica pool).
  SlotRing(SlotLayout layout, std::uint32_t slots, HostMemory memory, std::uint32_t teachers = 1);
  // The ring is shared by reference between stage threads; it never moves.
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  // Loader: waits until batch's slot is free for it, claims it (free -> filling) and writes the
  // header's batch number. nullopt once the ring is closed.
  [[nodiscard]] std::optional<Slot> acquire_free(std::uint64_t batch);
  // Teacher `teacher`'s replica: waits for filled, claims it (filled -> teaching). nullopt once
  // closed. With several teachers each works on every batch at once, on its own regions: the first
  // claims the slot and the others join it while it is teaching; finish_teaching() names the last.
  [[nodiscard]] std::optional<Slot> acquire_filled(std::uint64_t batch, std::uint32_t teacher = 0);
  // A teacher's work on `slot` is done: true for the last of the batch's teachers, which then
  // writes what needs every teacher's outputs (their mix) and publishes teaching -> ready; false:
  // another teacher still works on it and will. Always true with one teacher.
  [[nodiscard]] bool finish_teaching(const Slot& slot);
  // The teachers each batch waits for, at most the constructor's: before any stage runs (a
  // benchmark measuring one teacher alone sets 1).
  void set_teachers(std::uint32_t teachers);
  [[nodiscard]] std::uint32_t teachers() const { return teachers_; }
  // Student: waits for ready, claims it (ready -> in_flight). After close() it still hands out the
  // batches that are ready (drain), then nullopt; after fail() it throws the stage's StageError.
  [[nodiscard]] std::optional<Slot> acquire_ready(std::uint64_t batch);
  // Whether acquire_ready(batch) would return without waiting (the batch is ready, or the ring is
  // closed or failed). A consumer that holds slots only it can release (a CUDA student's copies in
  // flight) asks first, and releases them before it waits: the producers may need those slots.
  [[nodiscard]] bool ready_now(std::uint64_t batch) const;

  // Hands a claimed slot on: filling -> filled (to the teacher), teaching -> ready, or
  // filling -> ready when no teacher runs (kd.alpha = 0).
  void publish(const Slot& slot, SlotState from, SlotState to);
  // in_flight -> free for batch + slots. Call only when nothing reads the slot any more: on a CUDA
  // student, after the copy's event completed; on a CPU student, after the step.
  void release(const Slot& slot);

  // Batch numbers for a stage's next claim, for stages whose workers take batches in turn: each
  // teacher (`lane`) has its own, as each works on every batch.
  [[nodiscard]] std::uint64_t take_ticket(RingStage stage, std::uint32_t lane = 0) {
    Ticket& t =
        stage == RingStage::teacher ? teacher_tickets_[lane] : tickets_[static_cast<int>(stage)];
    return t.next.fetch_add(1, std::memory_order_relaxed);
  }

  // Wakes every waiter; producers stop, the student drains what is ready. Idempotent.
  void close();
  // Records the first failure (with its stage's name, and the batch it was working on when known)
  // and closes the ring.
  void fail(const std::string& stage, std::exception_ptr error,
            std::optional<std::uint64_t> batch = std::nullopt);
  // Where `batch` stands now, for a watchdog's report: its slot's state while the slot holds
  // batch's lap; nullopt while the slot still holds an earlier batch (or has moved past it).
  [[nodiscard]] std::optional<SlotState> state_of(std::uint64_t batch) const;
  [[nodiscard]] bool closed() const { return closed_.load(std::memory_order_acquire); }
  // Throws the recorded StageError, if any.
  void rethrow_if_failed() const;

  [[nodiscard]] RingStats stats() const;
  [[nodiscard]] std::uint32_t slots() const { return slots_; }
  [[nodiscard]] const SlotLayout& layout() const { return layout_; }
  [[nodiscard]] MemoryKind memory_kind() const { return memory_.kind(); }
  [[nodiscard]] std::byte* slab() const { return memory_.data(); }

private:
  std::optional<Slot> acquire(std::uint64_t batch, SlotState from, SlotState to, RingStage stage,
                              bool joins = false);

  // Each slot's word and each stage's counters on their own cache line: the stages run on
  // different cores, and sharing a line would make every hand-off a coherency miss for all.
  struct alignas(64) Word {
    std::atomic<std::uint32_t> value;
    // Threads parked (or about to park) on `value`: a hand-off pays for a futex wake only when
    // someone sleeps, which is rare while every stage keeps up.
    std::atomic<std::uint32_t> sleepers{0};
    // Teachers done with the slot's batch (several teachers): the last resets it before it hands
    // the slot on, so the next lap's teachers, who claim after that, count from 0.
    std::atomic<std::uint32_t> taught{0};
  };
  // Moves the word forward by `delta` (its value must have been `expect`, closed bit aside) and
  // wakes the sleepers, if any.
  void advance(Word& word, std::uint32_t delta, std::uint32_t expect);

  struct alignas(64) StageCounters {
    std::atomic<std::uint64_t> acquisitions{0};
    std::atomic<std::uint64_t> waits{0};
    std::atomic<std::uint64_t> wait_ns{0};
  };
  struct alignas(64) Ticket {
    std::atomic<std::uint64_t> next{0};
  };

  SlotLayout layout_;
  std::uint32_t slots_;
  HostMemory memory_;
  std::unique_ptr<Word[]> words_;
  std::array<StageCounters, kRingStages> counters_;
  std::array<Ticket, kRingStages> tickets_;
  std::unique_ptr<Ticket[]> teacher_tickets_; // one per teacher
  std::uint32_t max_teachers_, teachers_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> failed_{false};
  mutable std::mutex failure_mutex_; // cold path only: first failure wins
  std::string failed_stage_;
  std::optional<std::uint64_t> failed_batch_;
  std::exception_ptr failure_;
};

} // namespace kdflow
