// The stall watchdog: a run's student says which batch it works on; when it has worked on (or
// waited for) the same batch longer than the limit, the watchdog fails the ring naming the stage
// that holds that batch, so every stage stops and the run ends with that stage's name, never a
// hang.
#pragma once

#include "kdflow/core/slot_ring.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kdflow {

class StallWatchdog {
public:
  // `first_batch`: the run's batch number of the ring's batch 0 (the student's batches are the
  // run's). `limit_s` (> 0): how long one batch may take; `key` names the setting in messages. The
  // watchdog's thread (kd-watchdog) calls `on_thread_start` first (to pin itself). After it failed
  // the ring, a run that has still not ended (destroyed this watchdog) `limit_s` later, at least
  // kMinGrace, is a stage that ignores the ring's close: the process then exits with code 1 and a
  // message (a stage stuck in a system call cannot be stopped any other way).
  StallWatchdog(SlotRing& ring, std::uint64_t first_batch, double limit_s, std::string key,
                std::function<void()> on_thread_start = {});
  ~StallWatchdog(); // stops and joins the thread
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  // The student works on the run's batch `batch` now (waits for it, or steps on it): its clock
  // starts. Two atomic stores: called once per step.
  void expect(std::uint64_t batch) {
    since_ns_.store(now_ns(), std::memory_order_relaxed);
    expected_.store(batch, std::memory_order_release);
  }
  // The student is busy with no batch (an evaluation, a checkpoint): nothing is timed.
  void idle() { expected_.store(kIdle, std::memory_order_release); }
  // Whether the watchdog failed the ring.
  [[nodiscard]] bool fired() const { return fired_.load(std::memory_order_acquire); }

  // A stalled batch's stage, from its slot's state: who must act next for the batch to move.
  [[nodiscard]] static std::string stage_holding(std::optional<SlotState> state);

  static constexpr std::chrono::seconds kMinGrace{5};

private:
  static constexpr std::uint64_t kIdle = ~std::uint64_t{0};
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void run(const std::function<void()>& on_thread_start);
  // The ring failed for the batch the student has waited on for `waited_s`.
  void fire(std::uint64_t batch, double waited_s);

  SlotRing& ring_;
  const std::uint64_t first_batch_;
  const double limit_s_;
  const std::string key_;
  std::atomic<std::uint64_t> expected_{kIdle};
  std::atomic<std::int64_t> since_ns_{0};
  std::atomic<bool> fired_{false};
  std::mutex mutex_; // the thread's sleep, and its stop
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

} // namespace kdflow
