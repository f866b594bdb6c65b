// The stage graph: input_node (batch numbers) -> function_node (rejecting, `concurrency` bodies).
// The driver, on a thread of its own inside the arena (start_in_arena), builds the graph there (a
// flow graph runs its tasks in the arena it was made in) and waits for it, executing bodies
// meanwhile, so every body runs on one of the arena's pinned threads: the driver's, or a worker
// oneTBB sends to the arena's other slots.
#include "kdflow/core/stage_graph.hpp"

#include "kdflow/core/arena_thread.hpp"

#include <oneapi/tbb/concurrent_queue.h>
#include <oneapi/tbb/flow_graph.h>

#include <chrono>

namespace kdflow {

namespace flow = oneapi::tbb::flow;

StageGraph::StageGraph(std::string name, oneapi::tbb::task_arena& arena, int concurrency,
                       SlotRing& ring, RingStage stage, std::uint64_t end, Body body,
                       StageTotals* totals, std::uint64_t first_batch, std::uint32_t lane)
    : name_(std::move(name)), arena_(arena), concurrency_(concurrency), ring_(ring), stage_(stage),
      lane_(lane), end_(end), body_(std::move(body)), first_batch_(first_batch), totals_(totals) {}

StageGraph::~StageGraph() { wait(); }

void StageGraph::start() {
  if (started_) return;
  driver_ = start_in_arena(arena_, [this] { run(); });
  started_ = true; // only once the driver exists (a thread refused throws, and wait() returns)
}

void StageGraph::wait() {
  if (!started_) return;
  std::unique_lock lock(done_mutex_);
  done_.wait(lock, [this] { return finished_.load(std::memory_order_acquire); });
  // The driver has left run() and leaves the arena: joined before the arena may go.
  if (driver_.joinable()) driver_.join();
}

void StageGraph::run() {
  oneapi::tbb::concurrent_queue<int> free_workers;
  for (int w = 0; w < concurrency_; ++w) free_workers.push(w);
  {
    flow::graph graph;
    flow::input_node<std::uint64_t> source(graph, [this](oneapi::tbb::flow_control& control) {
      if (stopping_.load(std::memory_order_acquire) || ring_.closed()) {
        control.stop();
        return std::uint64_t{0};
      }
      const std::uint64_t b = ring_.take_ticket(stage_, lane_);
      if (b >= end_) control.stop();
      return b;
    });
    flow::function_node<std::uint64_t, flow::continue_msg, flow::rejecting> work(
        graph, static_cast<std::size_t>(concurrency_), [&](std::uint64_t batch) {
          int worker = 0;
          free_workers.try_pop(worker); // never empty: at most `concurrency` bodies run
          const auto t0 = std::chrono::steady_clock::now();
          bool done = false;
          try {
            done = body_(batch, worker);
            if (!done) stopping_.store(true, std::memory_order_release);
          } catch (...) {
            stopping_.store(true, std::memory_order_release);
            ring_.fail(name_, std::current_exception(), first_batch_ + batch);
          }
          if (totals_) {
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - t0);
            totals_->busy_ns.fetch_add(static_cast<std::uint64_t>(ns.count()),
                                       std::memory_order_relaxed);
            if (done) totals_->batches.fetch_add(1, std::memory_order_relaxed);
          }
          free_workers.push(worker);
          return flow::continue_msg{};
        });
    flow::make_edge(source, work);
    source.activate();
    graph.wait_for_all();
  }
  // Notified under the lock: a waiter may destroy this object as soon as it sees `finished_`.
  std::lock_guard lock(done_mutex_);
  finished_.store(true, std::memory_order_release);
  done_.notify_all();
}

} // namespace kdflow
