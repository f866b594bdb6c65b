// The stall watchdog (watchdog.hpp): a thread that looks at the student's batch a few times per
// limit and, on a stall, fails the ring with the stage that holds the batch.
#include "kdflow/core/watchdog.hpp"

#include "kdflow/core/error.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow {

StallWatchdog::StallWatchdog(SlotRing& ring, std::uint64_t first_batch, double limit_s,
                             std::string key, std::function<void()> on_thread_start)
    : ring_(ring), first_batch_(first_batch), limit_s_(limit_s), key_(std::move(key)) {
  if (!(limit_s > 0)) throw std::invalid_argument("StallWatchdog: the limit must be > 0");
  thread_ = std::thread([this, start = std::move(on_thread_start)] { run(start); });
}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string StallWatchdog::stage_holding(std::optional<SlotState> state) {
  // No state: the slot still holds the batch a lap before, which the student has not released.
  if (!state) return "student";
  switch (*state) {
  case SlotState::free:
  case SlotState::filling: return "loader";
  case SlotState::filled:
  case SlotState::teaching: return "teacher";
  case SlotState::ready:
  case SlotState::in_flight: return "student";
  }
  return "student";
}

void StallWatchdog::fire(std::uint64_t batch, double waited_s) {
  const std::optional<SlotState> state = ring_.state_of(batch - first_batch_);
  static_assert(slot_protocol::kStates == 6, "a description per slot state");
  static constexpr const char* kWhat[] = {"not yet claimed by a loader",   "being loaded",
                                          "waiting for a teacher replica", "with a teacher replica",
                                          "ready for the student",         "with the student"};
  const std::string where =
      state ? kWhat[static_cast<int>(*state)] : "behind its slot's previous batch";
  const std::string message = fmt::format("no progress for {:.1f} s on batch {} ({}; {} = {})",
                                          waited_s, batch, where, key_, limit_s_);
  fired_.store(true, std::memory_order_release);
  ring_.fail(stage_holding(state), std::make_exception_ptr(std::runtime_error(message)), batch);
}

void StallWatchdog::run(const std::function<void()>& on_thread_start) {
  pthread_setname_np(pthread_self(), "kd-watchdog");
  if (on_thread_start) on_thread_start();
  // A few looks per limit: a stall is seen within 1.25 limits; at most one a second, at least
  // every 10 ms, so that short test limits stay exact and long ones cost nothing.
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(std::clamp(limit_s_ / 4, 0.01, 1.0)));
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, period, [this] { return stopping_; });
    if (stopping_ || ring_.closed()) continue;
    const std::uint64_t batch = expected_.load(std::memory_order_acquire);
    if (batch == kIdle) continue;
    const double waited_s =
        static_cast<double>(now_ns() - since_ns_.load(std::memory_order_relaxed)) / 1e9;
    if (waited_s <= limit_s_ || expected_.load(std::memory_order_acquire) != batch) continue;
    fire(batch, waited_s);
    // The run ends now, unless a stage ignores the closed ring.
    const auto grace = std::max<std::chrono::steady_clock::duration>(
        kMinGrace, std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(limit_s_)));
    if (wake_.wait_for(lock, grace, [this] { return stopping_; })) break;
    const std::string message = fmt::format(
        "kdflow: error: batch {} stalled and its stage did not stop {:.0f} s after the run was "
        "stopped; exiting\n",
        batch, std::chrono::duration<double>(grace).count());
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, message.data(), message.size());
    ::_exit(kExitFailure);
  }
}

} // namespace kdflow
