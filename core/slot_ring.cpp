// Slot ring hot path: one CAS to claim, one fetch_add to hand on, a futex wake only when someone
// sleeps. Waiters spin briefly (a hand-off usually lands within a microsecond when both sides run),
// then park with C++20 atomic wait.
#include "kdflow/core/slot_ring.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace kdflow {
namespace sp = slot_protocol;
namespace {

// A waiter first re-checks a few times, yielding its core in between (a peer that shares the core,
// or is about to hand on, then runs), and only then parks on a futex: a park and its wake cost two
// system calls. Measured on a 2-vCPU VM (bench/ring_bench): pause-spinning before the yields only
// slowed hand-offs (5.6M/s without, 4.7M/s with 16 pauses), as the spinner steals the line the
// peer is about to write.
constexpr int kYieldSpins = 16;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

} // namespace

SlotRing::SlotRing(SlotLayout layout, std::uint32_t slots, HostMemory memory,
                   std::uint32_t teachers)
    : layout_(std::move(layout)), slots_(slots), memory_(std::move(memory)),
      words_(std::make_unique<Word[]>(slots)),
      teacher_tickets_(std::make_unique<Ticket[]>(std::max<std::uint32_t>(teachers, 1))),
      max_teachers_(std::max<std::uint32_t>(teachers, 1)), teachers_(max_teachers_) {
  if (slots < 2) throw InputError(fmt::format("ring.slots = {}: the ring needs at least 2", slots));
  if (memory_.size() < std::size_t{slots} * layout_.slot_bytes())
    throw std::invalid_argument(fmt::format("slot ring: slab of {} bytes < {} slots x {} bytes",
                                            memory_.size(), slots, layout_.slot_bytes()));
  for (std::uint32_t i = 0; i < slots; ++i)
    words_[i].value.store(sp::encode(0, SlotState::free), std::memory_order_relaxed);
}

std::optional<Slot> SlotRing::acquire(std::uint64_t batch, SlotState from, SlotState to,
                                      RingStage stage, bool joins) {
  const bool drains = stage == RingStage::student;
  if (drains && failed_.load(std::memory_order_acquire)) rethrow_if_failed();
  const auto index = static_cast<std::uint32_t>(batch % slots_);
  const std::uint64_t lap = batch / slots_;
  Word& w = words_[index];
  auto& word = w.value;
  std::uint64_t wait_start = 0;
  std::uint32_t cur = word.load(std::memory_order_acquire);
  for (int spins = 0;; ++spins) {
    const sp::Decision decision = sp::decide(cur, lap, from, drains, joins);
    if (decision == sp::Decision::stop) {
      if (drains) rethrow_if_failed();
      return std::nullopt;
    }
    // Another teacher claimed it: its acquire CAS continued the loader's release sequence, so this
    // acquire load already sees the batch.
    if (decision == sp::Decision::join) break;
    if (decision == sp::Decision::claim) {
      // Only this batch's holder for this stage waits for this value, so the CAS loses only to
      // close() setting the closed bit; the loop then decides again on the new value.
      if (word.compare_exchange_weak(cur, cur + sp::advance_delta(from, to),
                                     std::memory_order_acquire, std::memory_order_acquire))
        break;
      continue;
    }
    if (wait_start == 0) wait_start = now_ns();
    if (spins < kYieldSpins) {
      std::this_thread::yield();
    } else {
      // seq_cst pairs with advance(): either it sees this sleeper and wakes us, or our wait()
      // (which re-reads the word before sleeping) sees its new value.
      w.sleepers.fetch_add(1, std::memory_order_seq_cst);
      word.wait(cur, std::memory_order_seq_cst);
      w.sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
    cur = word.load(std::memory_order_acquire);
  }
  // A batch that became ready while the ring failed (a stalled stage, released by the failure) is
  // not handed on: after fail() the student gets the failure.
  if (drains && failed_.load(std::memory_order_acquire)) rethrow_if_failed();
  auto& c = counters_[static_cast<int>(stage)];
  c.acquisitions.fetch_add(1, std::memory_order_relaxed);
  if (wait_start != 0) {
    c.waits.fetch_add(1, std::memory_order_relaxed);
    c.wait_ns.fetch_add(now_ns() - wait_start, std::memory_order_relaxed);
  }
  return Slot(batch, index, memory_.data() + std::size_t{index} * layout_.slot_bytes(), &layout_);
}

std::optional<Slot> SlotRing::acquire_free(std::uint64_t batch) {
  auto slot = acquire(batch, SlotState::free, SlotState::filling, RingStage::loader);
  if (slot) slot->header().batch = batch;
  return slot;
}

std::optional<Slot> SlotRing::acquire_filled(std::uint64_t batch, std::uint32_t teacher) {
  // A lane of the constructor's teachers (set_teachers(1) measures one of them alone, any lane).
  assert(teacher < max_teachers_);
  (void)teacher; // the batch is the same for every teacher; each takes its own tickets
  return acquire(batch, SlotState::filled, SlotState::teaching, RingStage::teacher, teachers_ > 1);
}

bool SlotRing::finish_teaching(const Slot& slot) {
  if (teachers_ == 1) return true;
  Word& w = words_[slot.index()];
  // acq_rel: the last teacher sees every other one's writes to the slot, and its publish (a
  // release) hands them all on to the student.
  if (w.taught.fetch_add(1, std::memory_order_acq_rel) + 1 < teachers_) return false;
  w.taught.store(0, std::memory_order_relaxed);
  return true;
}

void SlotRing::set_teachers(std::uint32_t teachers) {
  if (teachers < 1 || teachers > max_teachers_)
    throw std::invalid_argument(
        fmt::format("slot ring: {} teachers, built for 1 to {}", teachers, max_teachers_));
  teachers_ = teachers;
}

std::optional<Slot> SlotRing::acquire_ready(std::uint64_t batch) {
  return acquire(batch, SlotState::ready, SlotState::in_flight, RingStage::student);
}

bool SlotRing::ready_now(std::uint64_t batch) const {
  if (failed_.load(std::memory_order_acquire)) return true;
  const std::uint32_t word = words_[batch % slots_].value.load(std::memory_order_acquire);
  return sp::decide(word, batch / slots_, SlotState::ready, /*drains=*/true) != sp::Decision::wait;
}

void SlotRing::advance(Word& w, std::uint32_t delta, [[maybe_unused]] std::uint32_t expect) {
  // seq_cst (not just release, which already publishes the slot's contents to the next claimer)
  // so that the sleepers check below cannot miss a waiter that is about to park.
  [[maybe_unused]] const std::uint32_t prev = w.value.fetch_add(delta, std::memory_order_seq_cst);
  assert((prev & ~sp::kClosedBit) == expect);
  if (w.sleepers.load(std::memory_order_seq_cst) != 0) w.value.notify_all();
}

void SlotRing::publish(const Slot& slot, SlotState from, SlotState to) {
  assert(static_cast<std::uint32_t>(to) > static_cast<std::uint32_t>(from));
  advance(words_[slot.index()], sp::advance_delta(from, to),
          sp::encode(slot.batch() / slots_, from));
}

void SlotRing::release(const Slot& slot) {
  advance(words_[slot.index()], sp::kReleaseDelta,
          sp::encode(slot.batch() / slots_, SlotState::in_flight));
}

void SlotRing::close() {
  closed_.store(true, std::memory_order_release);
  for (std::uint32_t i = 0; i < slots_; ++i) {
    words_[i].value.fetch_or(sp::kClosedBit, std::memory_order_acq_rel);
    words_[i].value.notify_all();
  }
}

void SlotRing::fail(const std::string& stage, std::exception_ptr error,
                    std::optional<std::uint64_t> batch) {
  {
    std::lock_guard lock(failure_mutex_);
    if (!failure_) {
      failed_stage_ = stage;
      failed_batch_ = batch;
      failure_ = std::move(error);
    }
  }
  failed_.store(true, std::memory_order_release);
  close();
}

std::optional<SlotState> SlotRing::state_of(std::uint64_t batch) const {
  const std::uint32_t word = words_[batch % slots_].value.load(std::memory_order_acquire);
  const std::uint32_t lap_bits = sp::encode(batch / slots_, SlotState::free);
  if (((word & ~sp::kClosedBit) >> sp::kLapShift) != (lap_bits >> sp::kLapShift))
    return std::nullopt;
  return sp::state_of(word);
}

void SlotRing::rethrow_if_failed() const {
  if (!failed_.load(std::memory_order_acquire)) return;
  std::string stage;
  std::optional<std::uint64_t> batch;
  std::exception_ptr error;
  {
    std::lock_guard lock(failure_mutex_);
    stage = failed_stage_;
    batch = failed_batch_;
    error = failure_;
  }
  const auto stage_error = [&](const std::string& what) {
    return batch ? StageError(stage, *batch, what) : StageError(stage, what);
  };
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    std::throw_with_nested(stage_error(e.what()));
  } catch (...) {
    std::throw_with_nested(stage_error("unknown exception"));
  }
}

RingStats SlotRing::stats() const {
  RingStats s;
  for (std::uint32_t i = 0; i < slots_; ++i)
    ++s.occupancy[static_cast<int>(sp::state_of(words_[i].value.load(std::memory_order_relaxed)))];
  for (int i = 0; i < kRingStages; ++i) {
    s.stages[i].acquisitions = counters_[i].acquisitions.load(std::memory_order_relaxed);
    s.stages[i].waits = counters_[i].waits.load(std::memory_order_relaxed);
    s.stages[i].wait_ns = counters_[i].wait_ns.load(std::memory_order_relaxed);
  }
  return s;
}

} // namespace kdflow
