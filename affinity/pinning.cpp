// Thread and memory binding through hwloc; thread names through pthread_setname_np.
#include "kdflow/affinity/pinning.hpp"

#include "hwloc_handle.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/error.hpp"

#include <pthread.h>
#include <sched.h>

#include <cerrno>

#include <fmt/format.h>

namespace kdflow::affinity {
namespace {

// The calling thread's scheduling policy (Linux applies sched_setscheduler(0, ...) to the calling
// thread alone). A refusal (a sandbox without the syscall) leaves the thread as it was: priorities
// change how fast a shared CPU is split, never what is computed.
void set_this_thread_policy(int policy) {
  sched_param param{};
  param.sched_priority = 0;
  (void)sched_setscheduler(0, policy, &param);
}

} // namespace

void pin_this_thread(const Topology& topology, const CpuList& cpus, const std::string& name) {
  // Linux limits thread names to 15 characters; longer ones would fail with ERANGE.
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  const Bitmap set = bitmap_of(cpus);
  if (hwloc_set_cpubind(topology.handle().topo, set.get(), HWLOC_CPUBIND_THREAD) != 0)
    throw_errno(errno, fmt::format("binding thread '{}' to CPUs {}", name, format_cpus(cpus)));
}

CpuList current_thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return {};
  CpuList out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

PlaceMemory bind_to_numa_of(const Topology& topology, const CpuList& near_cpus) {
  return [&topology, near_cpus](void* data, std::size_t bytes) {
    const Bitmap cpus = bitmap_of(near_cpus);
    // hwloc maps the CPU set to the NUMA node(s) local to it (HWLOC_MEMBIND_BYNODESET not set).
    if (hwloc_set_area_membind(topology.handle().topo, data, bytes, cpus.get(), HWLOC_MEMBIND_BIND,
                               HWLOC_MEMBIND_MIGRATE) != 0 &&
        errno != ENOSYS && errno != EXDEV)
      throw_errno(errno, fmt::format("binding the slot ring to the NUMA node of CPUs {}",
                                     format_cpus(near_cpus)));
  };
}

PinnedArena::PinnedArena(const Topology& topology, CpuList cpus, std::string role, int first_index,
                         Priority priority)
    : topology_(topology), cpus_(std::move(cpus)), role_(std::move(role)),
      first_index_(first_index), priority_(priority),
      // No slot reserved for an outside thread: the pool is exactly its CPUs' worth of workers.
      arena_(static_cast<int>(cpus_.size()), 0), observer_(arena_, *this) {
  if (cpus_.empty()) throw InputError(fmt::format("core plan: role '{}' has no CPU", role_));
  observer_.observe(true);
}

PinnedArena::~PinnedArena() { observer_.observe(false); }

void PinnedArena::Observer::on_scheduler_entry(bool is_worker) {
  // A thread that calls execute() keeps its own name and binding; pool workers and the threads
  // started to work in the arena (start_in_arena) are pinned.
  if (!is_worker && !on_arena_thread()) return;
  const int slot = oneapi::tbb::this_task_arena::current_thread_index();
  pin_this_thread(owner_.topology_, owner_.cpus_,
                  fmt::format("kd-{}-{}", owner_.role_, owner_.first_index_ + slot));
  // Set on entry either way: a worker that left a background arena without its exit being seen
  // must not carry SCHED_IDLE into this one.
  const int want = owner_.priority_ == Priority::background ? SCHED_IDLE : SCHED_OTHER;
  if (sched_getscheduler(0) != want) set_this_thread_policy(want);
}

void PinnedArena::Observer::on_scheduler_exit(bool is_worker) {
  if ((is_worker || on_arena_thread()) && owner_.priority_ == Priority::background)
    set_this_thread_policy(SCHED_OTHER);
}

} // namespace kdflow::affinity
