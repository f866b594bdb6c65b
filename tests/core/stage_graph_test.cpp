// Stage graphs replaced while the pipeline runs, as kd-ctl does when it moves a CPU: a loader stage
// and a teacher stage over a small ring, each stopped and restarted on another arena (of another
// width) every few milliseconds while a student thread consumes. Every batch must be loaded once,
// taught once and consumed once, in order and intact, and the stage totals must count each batch
// exactly once across all the graphs. And faults: a stage body that throws, or stalls until the
// stall watchdog fails the ring.
#include "kdflow/core/error.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"
#include "kdflow/core/watchdog.hpp"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kdflow {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kValues = 64;

std::uint8_t payload(std::uint64_t batch, std::int64_t i) {
  return static_cast<std::uint8_t>((batch * 131 + static_cast<std::uint64_t>(i) * 7) & 0xff);
}

TEST(StageGraph, StagesRestartedOnOtherArenasMidRunLoseAndRepeatNoBatch) {
  const std::uint64_t batches =
      std::getenv("KDFLOW_STAGE_BATCHES")
          ? std::strtoull(std::getenv("KDFLOW_STAGE_BATCHES"), nullptr, 10)
          : 4000;
  const std::uint32_t slots = 4;
  SlotLayout layout({{"inputs", DType::u8, {1, kValues}}, {"logits", DType::f32, {1, 2}}});
  const std::size_t bytes = std::size_t{slots} * layout.slot_bytes();
  SlotRing ring(std::move(layout), slots, allocate_locked(bytes));
  const auto inputs = ring.layout().index_of("inputs");
  const auto logits = ring.layout().index_of("logits");

  // Two arenas per stage, of different widths: each restart moves the stage to the other one.
  oneapi::tbb::global_control parallelism(oneapi::tbb::global_control::max_allowed_parallelism,
                                          2 + 1 + 1 + 1 + 1);
  oneapi::tbb::task_arena loader_arenas[2] = {oneapi::tbb::task_arena(2, 0),
                                              oneapi::tbb::task_arena(1, 0)};
  oneapi::tbb::task_arena teacher_arenas[2] = {oneapi::tbb::task_arena(1, 0),
                                               oneapi::tbb::task_arena(1, 0)};
  std::vector<std::atomic<int>> loaded(batches), taught(batches);
  StageTotals loader_totals, teacher_totals;

  auto start_loader = [&](int which) {
    const int width = which == 0 ? 2 : 1;
    auto g = std::make_unique<StageGraph>(
        "loader", loader_arenas[which], width, ring, RingStage::loader, batches,
        [&](std::uint64_t b, int) {
          auto slot = ring.acquire_free(b);
          if (!slot) return false;
          loaded[b].fetch_add(1, std::memory_order_relaxed);
          auto in = slot->region<std::uint8_t>(inputs);
          for (std::int64_t i = 0; i < kValues; ++i)
            in[static_cast<std::size_t>(i)] = payload(b, i);
          ring.publish(*slot, SlotState::filling, SlotState::filled);
          return true;
        },
        &loader_totals);
    g->start();
    return g;
  };
  auto start_teacher = [&](int which) {
    auto g = std::make_unique<StageGraph>(
        "teacher", teacher_arenas[which], 1, ring, RingStage::teacher, batches,
        [&](std::uint64_t b, int) {
          auto slot = ring.acquire_filled(b);
          if (!slot) return false;
          taught[b].fetch_add(1, std::memory_order_relaxed);
          unsigned sum = 0;
          for (const auto v : slot->region<std::uint8_t>(inputs)) sum += v;
          auto out = slot->region<float>(logits);
          out[0] = static_cast<float>(b);
          out[1] = static_cast<float>(sum);
          ring.publish(*slot, SlotState::teaching, SlotState::ready);
          return true;
        },
        &teacher_totals);
    g->start();
    return g;
  };

  std::unique_ptr<StageGraph> loader = start_loader(0), teacher = start_teacher(0);
  std::atomic<bool> consumed_all{false};
  std::atomic<int> restarts{0};
  // kd-ctl's order: one stage is replaced while the other runs, so the bodies waiting for a slot
  // are always served.
  std::thread controller([&] {
    int which = 0;
    while (!consumed_all.load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(2ms);
      which ^= 1;
      loader->request_stop();
      loader->wait();
      loader = start_loader(which);
      teacher->request_stop();
      teacher->wait();
      teacher = start_teacher(which);
      restarts.fetch_add(1, std::memory_order_release);
    }
  });

  std::uint64_t bad = 0;
  for (std::uint64_t b = 0; b < batches; ++b) {
    // A student of >= 50 us a step: the run lasts >= 0.2 s, dozens of replacements. (Waiting for
    // the controller instead would deadlock: a stage being replaced finishes its batches only
    // while the student consumes.)
    std::this_thread::sleep_for(50us);
    auto slot = ring.acquire_ready(b);
    ASSERT_TRUE(slot) << "batch " << b;
    unsigned sum = 0;
    const auto in = slot->region<std::uint8_t>(inputs);
    for (std::int64_t i = 0; i < kValues; ++i) {
      bad += in[static_cast<std::size_t>(i)] != payload(b, i);
      sum += in[static_cast<std::size_t>(i)];
    }
    const auto out = slot->region<float>(logits);
    bad += out[0] != static_cast<float>(b) || out[1] != static_cast<float>(sum);
    ring.release(*slot);
  }
  consumed_all.store(true, std::memory_order_release);
  controller.join();
  loader->wait();
  teacher->wait();

  EXPECT_EQ(bad, 0u);
  EXPECT_GE(restarts.load(), 3) << "the stages were replaced while batches flowed";
  std::uint64_t once = 0;
  for (std::uint64_t b = 0; b < batches; ++b)
    once += loaded[b].load() == 1 && taught[b].load() == 1;
  EXPECT_EQ(once, batches) << "every batch loaded and taught exactly once";
  EXPECT_EQ(loader_totals.batches.load(), batches);
  EXPECT_EQ(teacher_totals.batches.load(), batches);
  EXPECT_GT(loader_totals.busy_ns.load(), 0u);
}

// A stage runs whether or not oneTBB sends its arena a worker: its graph runs on a thread of its
// own in the arena. Here oneTBB's only worker is held in another arena until the stage's batches
// have all arrived (or a minute has passed: then it is let go, so the test ends either way). A
// stage whose graph waited for a worker (enqueued into its arena) would get none; oneTBB 2021.8's
// market once left a replica's arena so, with an idle worker asleep, and the run hung.
TEST(StageGraph, AStageRunsWhenOneTbbSendsItsArenaNoWorker) {
  const std::uint64_t batches = 32;
  const std::uint32_t slots = 2;
  SlotLayout layout({{"inputs", DType::u8, {1, kValues}}});
  const std::size_t bytes = std::size_t{slots} * layout.slot_bytes();
  SlotRing ring(std::move(layout), slots, allocate_locked(bytes));
  oneapi::tbb::global_control one_worker(oneapi::tbb::global_control::max_allowed_parallelism, 2);
  oneapi::tbb::task_arena holder(1, 0), stage_arena(1, 0);
  // The holding task's flags are its own (an arena's destruction does not wait for its tasks).
  struct Hold {
    std::atomic<bool> held{false}, release{false}, done{false};
  };
  const auto hold = std::make_shared<Hold>();
  holder.enqueue([hold] {
    hold->held.store(true);
    hold->held.notify_all();
    while (!hold->release.load()) std::this_thread::sleep_for(1ms);
    hold->done.store(true);
  });
  hold->held.wait(false);

  std::atomic<std::thread::id> body_thread{};
  StageGraph stage("loader", stage_arena, 1, ring, RingStage::loader, batches,
                   [&](std::uint64_t b, int) {
                     auto slot = ring.acquire_free(b);
                     if (!slot) return false;
                     body_thread.store(std::this_thread::get_id());
                     auto in = slot->region<std::uint8_t>(0);
                     for (std::int64_t i = 0; i < kValues; ++i)
                       in[static_cast<std::size_t>(i)] = payload(b, i);
                     ring.publish(*slot, SlotState::filling, SlotState::ready);
                     return true;
                   });
  stage.start();
  std::atomic<std::uint64_t> consumed{0}, bad{0};
  std::thread student([&] {
    for (std::uint64_t b = 0; b < batches; ++b) {
      auto slot = ring.acquire_ready(b);
      if (!slot) return;
      const auto in = slot->region<std::uint8_t>(0);
      for (std::int64_t i = 0; i < kValues; ++i)
        bad.fetch_add(in[static_cast<std::size_t>(i)] != payload(b, i));
      ring.release(*slot);
      consumed.fetch_add(1);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (consumed.load() < batches && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  const std::uint64_t while_held = consumed.load();
  hold->release.store(true);
  student.join();
  stage.wait();
  while (!hold->done.load()) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(while_held, batches) << "the stage ran while oneTBB's only worker was elsewhere";
  EXPECT_EQ(consumed.load(), batches);
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_NE(body_thread.load(), std::this_thread::get_id());
}

// A loader stage and a teacher stage over a small ring, with the student on this thread; `fault`
// runs in the teacher's body for each batch (it may throw, or stall until the ring closes).
// Returns the StageError the student's acquire throws, with the batches it consumed before.
struct FaultRun {
  std::optional<StageError> error;
  std::uint64_t consumed = 0;
  bool watchdog_fired = false;
};

FaultRun run_with_fault(const std::function<void(std::uint64_t, const SlotRing&)>& fault,
                        double stall_limit_s) {
  const std::uint32_t slots = 4;
  const std::uint64_t batches = 64, first = 100; // the run's batch numbers start at 100
  SlotLayout layout({{"inputs", DType::u8, {1, kValues}}});
  const std::size_t bytes = std::size_t{slots} * layout.slot_bytes();
  SlotRing ring(std::move(layout), slots, allocate_locked(bytes));
  // Workers for both arenas, whatever the machine's CPU count.
  oneapi::tbb::global_control parallelism(oneapi::tbb::global_control::max_allowed_parallelism,
                                          2 + 1 + 1);
  oneapi::tbb::task_arena loader_arena(2, 0), teacher_arena(1, 0);
  StageGraph loaders(
      "loader", loader_arena, 2, ring, RingStage::loader, batches,
      [&](std::uint64_t b, int) {
        auto slot = ring.acquire_free(b);
        if (!slot) return false;
        ring.publish(*slot, SlotState::filling, SlotState::filled);
        return true;
      },
      nullptr, first);
  StageGraph teacher(
      "teacher", teacher_arena, 1, ring, RingStage::teacher, batches,
      [&](std::uint64_t b, int) {
        auto slot = ring.acquire_filled(b);
        if (!slot) return false;
        fault(first + b, ring);
        ring.publish(*slot, SlotState::teaching, SlotState::ready);
        return true;
      },
      nullptr, first);
  FaultRun out;
  {
    StallWatchdog watchdog(ring, first, stall_limit_s, "pipeline.stall_timeout_s");
    loaders.start();
    teacher.start();
    try {
      for (std::uint64_t b = 0; b < batches; ++b) {
        watchdog.expect(first + b);
        auto slot = ring.acquire_ready(b);
        watchdog.idle();
        if (!slot) break;
        ring.release(*slot);
        ++out.consumed;
      }
    } catch (const StageError& e) {
      out.error = e;
    }
    out.watchdog_fired = watchdog.fired();
    ring.close();
    teacher.wait();
    loaders.wait();
  }
  return out;
}

// The names of this process's threads.
std::vector<std::string> thread_names() {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    out.push_back(name);
  }
  return out;
}

TEST(StageGraph, AStageThatThrowsStopsEveryStageNamingItselfAndTheRunsBatch) {
  const FaultRun run = run_with_fault(
      [](std::uint64_t batch, const SlotRing&) {
        if (batch == 109) throw std::runtime_error("injected fault");
      },
      600);
  ASSERT_TRUE(run.error);
  EXPECT_EQ(run.error->stage(), "teacher");
  EXPECT_EQ(run.error->batch(), 109u);
  EXPECT_NE(std::string(run.error->what()).find("at batch 109: injected fault"), std::string::npos)
      << run.error->what();
  EXPECT_LE(run.consumed, 9u);
  EXPECT_FALSE(run.watchdog_fired);
}

TEST(StageGraph, AStalledStageIsStoppedByTheWatchdogNamingItselfAndTheBatch) {
  const auto t0 = std::chrono::steady_clock::now();
  const FaultRun run = run_with_fault(
      [](std::uint64_t batch, const SlotRing& ring) {
        while (batch == 109 && !ring.closed()) std::this_thread::sleep_for(2ms);
      },
      0.2);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(run.error);
  EXPECT_TRUE(run.watchdog_fired);
  EXPECT_EQ(run.error->stage(), "teacher");
  EXPECT_EQ(run.error->batch(), 109u);
  const std::string what = run.error->what();
  EXPECT_NE(what.find("no progress for"), std::string::npos) << what;
  EXPECT_NE(what.find("with a teacher replica"), std::string::npos) << what;
  EXPECT_NE(what.find("pipeline.stall_timeout_s = 0.2"), std::string::npos) << what;
  EXPECT_EQ(run.consumed, 9u) << "every batch before the stalled one reached the student";
  EXPECT_LT(took, 10.0) << "a stall is seen within about 1.25 limits";
  for (const auto& name : thread_names()) EXPECT_NE(name, "kd-watchdog") << "its thread is joined";
}

TEST(StallWatchdog, BlamesTheStageThatMustActNextOnTheBatch) {
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::free), "loader");
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::filling), "loader");
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::filled), "teacher");
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::teaching), "teacher");
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::ready), "student");
  EXPECT_EQ(StallWatchdog::stage_holding(SlotState::in_flight), "student");
  EXPECT_EQ(StallWatchdog::stage_holding(std::nullopt), "student");
}

} // namespace
} // namespace kdflow
