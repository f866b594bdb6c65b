// Pinning: named threads bound to their role's CPUs, oneTBB arenas whose workers are pinned and
// named on entry, and memory bound to a NUMA node before it is locked.
#pragma once

#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/host_memory.hpp"

#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_scheduler_observer.h>

#include <string>

namespace kdflow::affinity {

// Names the calling thread (at most 15 characters, e.g. "kd-student") and binds it to `cpus`.
void pin_this_thread(const Topology& topology, const CpuList& cpus, const std::string& name);

// The CPUs the calling thread may run on now (sched_getaffinity), ascending.
CpuList current_thread_cpus();

// Binds [data, data + bytes) to the NUMA node holding `near_cpus` (before mlock faults it in).
PlaceMemory bind_to_numa_of(const Topology& topology, const CpuList& near_cpus);

// How an arena's workers compete for their CPUs with other threads bound there: as any thread
// (normal), or only when no other thread wants the CPU (background: Linux's SCHED_IDLE, set on
// each worker as it enters the arena and cleared as it leaves, since oneTBB's workers move between
// arenas).
enum class Priority { normal, background };

// A task arena of exactly cpus.size() threads for one role (loader pool, a teacher replica); every
// worker that enters it, and every thread start_in_arena() starts into it (a stage's driver,
// run_in_arena), is bound to `cpus` and named "kd-<role>-<first_index + slot>" (replicas
// number their threads on from the previous replica's, so names stay unique per role). A oneDNN
// primitive executed inside stays inside: the TBB runtime of oneDNN parallelizes over the current
// arena. oneTBB's worker pool is global (hardware threads - 1 by default): a process with several
// arenas raises it with tbb::global_control(max_allowed_parallelism, sum of arena sizes + 1), or
// the arenas wait for one another's workers (a stage's own thread still runs it, arena_thread.hpp).
class PinnedArena {
public:
  PinnedArena(const Topology& topology, CpuList cpus, std::string role, int first_index = 0,
              Priority priority = Priority::normal);
  ~PinnedArena();
  // Workers hold a pointer to the observer inside; the arena never moves.
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  [[nodiscard]] oneapi::tbb::task_arena& arena() { return arena_; }
  [[nodiscard]] const CpuList& cpus() const { return cpus_; }
  [[nodiscard]] const std::string& role() const { return role_; }

private:
  class Observer : public oneapi::tbb::task_scheduler_observer {
  public:
    Observer(oneapi::tbb::task_arena& arena, const PinnedArena& owner)
        : oneapi::tbb::task_scheduler_observer(arena), owner_(owner) {}
    void on_scheduler_entry(bool is_worker) override;
    void on_scheduler_exit(bool is_worker) override;

  private:
    const PinnedArena& owner_;
  };

  const Topology& topology_;
  CpuList cpus_;
  std::string role_;
  int first_index_;
  Priority priority_;
  oneapi::tbb::task_arena arena_;
  Observer observer_;
};

} // namespace kdflow::affinity
