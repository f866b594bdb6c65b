// One stage of the training pipeline (loaders, a teacher replica) as a oneTBB flow graph inside the
// stage's own task arena, so its threads are the arena's pinned workers: a source node hands out
// the stage's next batch numbers (the ring's tickets, shared by every graph of the stage) to a
// function node of `concurrency` bodies. The ring bounds what is in flight and restores batch order
// for the stage after, so bodies may finish in any order.
#pragma once

#include "kdflow/core/slot_ring.hpp"

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace kdflow {

// What a stage did across the graphs that ran it (kd-ctl replaces a stage's graph when it moves
// cores; the stage's figures go on).
struct StageTotals {
  std::atomic<std::uint64_t> busy_ns{0}; // time inside bodies, summed over workers
  std::atomic<std::uint64_t> batches{0}; // batches completed
};

// A stage's work in seconds: its bodies' busy time less their waits for a slot (a body's time
// includes its wait; the ring counts those waits apart, RingStats).
inline double stage_work_s(std::uint64_t busy_ns, std::uint64_t ring_wait_ns) {
  return busy_ns > ring_wait_ns ? static_cast<double>(busy_ns - ring_wait_ns) / 1e9 : 0.0;
}

class StageGraph {
public:
  // Claims batch's slot, does the stage's work, hands the slot on. Returns false when the ring was
  // closed (the source then stops). `worker` is in [0, concurrency), unique among running bodies:
  // an index into per-worker state (a teacher replica, scratch buffers).
  using Body = std::function<bool(std::uint64_t batch, int worker)>;

  // Batches [.., end) of `stage`'s tickets. An exception in a body fails the ring with `name` as
  // the stage and the run's batch number (`first_batch` + the ring's), which stops every stage
  // and reaches the student as a StageError. `totals`, when given, accumulates its body time and
  // batches (it must outlive the graph). `lane`: whose tickets a teacher stage takes (its
  // teacher's, with several).
  StageGraph(std::string name, oneapi::tbb::task_arena& arena, int concurrency, SlotRing& ring,
             RingStage stage, std::uint64_t end, Body body, StageTotals* totals = nullptr,
             std::uint64_t first_batch = 0, std::uint32_t lane = 0);
  // Waits for the graph (close the ring first to stop it early).
  ~StageGraph();
  StageGraph(const StageGraph&) = delete;
  StageGraph& operator=(const StageGraph&) = delete;

  // Builds the graph inside the arena and runs it there, on a thread of its own that enters the
  // arena (arena_thread.hpp: the stage starts whether or not oneTBB sends the arena a worker);
  // returns at once.
  void start();
  // Blocks until the source has stopped, every body has returned and the driver's thread has
  // ended. Idempotent; safe from several threads at once.
  void wait();
  // The source takes no further ticket; the batches already taken are finished (their bodies may
  // wait for the stages around them, so those must keep running). Then wait(), and a new graph of
  // the same stage goes on from the next ticket: no batch is lost or done twice.
  void request_stop() { stopping_.store(true, std::memory_order_release); }
  [[nodiscard]] bool finished() const { return finished_.load(std::memory_order_acquire); }

  [[nodiscard]] const std::string& name() const { return name_; }

private:
  void run(); // the driver task inside the arena

  std::string name_;
  oneapi::tbb::task_arena& arena_;
  int concurrency_;
  SlotRing& ring_;
  RingStage stage_;
  std::uint32_t lane_;
  std::uint64_t end_;
  Body body_;
  std::uint64_t first_batch_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> finished_{false};
  std::mutex done_mutex_; // cold path: the end of the stage (and the driver's join)
  std::condition_variable done_;
  std::thread driver_;
  StageTotals* totals_;
};

} // namespace kdflow
