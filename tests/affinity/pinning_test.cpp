// Live pinning: a small real pipeline (loader arena -> teacher replica arenas -> student thread,
// through a slot ring) runs on this machine's plan, and /proc/self/task/*/{comm,status} must show
// every kd-* thread bound to exactly its role's CPUs.
#include "kdflow/affinity/pinning.hpp"
#include "kdflow/affinity/plan.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/slot_ring.hpp"

#include <gtest/gtest.h>

#include <oneapi/tbb/global_control.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <latch>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace kdflow::affinity {
namespace {

std::string read_line_with(const std::filesystem::path& file, const std::string& prefix) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) {
      line = line.substr(prefix.size());
      return line.substr(line.find_first_not_of(" \t"));
    }
  return {};
}

// thread name -> Cpus_allowed_list, for every thread of this process.
std::map<std::string, std::string> thread_bindings() {
  std::map<std::string, std::string> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string comm;
    std::getline(std::ifstream(task.path() / "comm"), comm);
    out[comm] = read_line_with(task.path() / "status", "Cpus_allowed_list:");
  }
  return out;
}

// The scheduling policy of the worker that runs a task enqueued in `arena`.
int policy_in(PinnedArena& arena) {
  std::promise<int> policy;
  arena.arena().enqueue([&] { policy.set_value(sched_getscheduler(0)); });
  return policy.get_future().get();
}

// A background arena's workers run at SCHED_IDLE inside it and at the normal policy anywhere
// else: with one oneTBB worker for both arenas, the same thread moves between them each round.
TEST(LivePinning, BackgroundArenaWorkersYieldInsideItAndOnlyThere) {
  const Topology topo = Topology::load();
  const CpuList cpus = {current_thread_cpus().front()};
  oneapi::tbb::global_control one_worker(oneapi::tbb::global_control::max_allowed_parallelism, 2);
  PinnedArena background(topo, cpus, "teacher", 0, Priority::background);
  PinnedArena normal(topo, cpus, "loader");
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(policy_in(background), SCHED_IDLE) << round;
    EXPECT_EQ(policy_in(normal), SCHED_OTHER) << round;
  }
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER); // the calling thread is never changed
}

// A thread started into an arena (start_in_arena: a stage's driver, run_in_arena) is pinned and
// named as the arena's workers are, at its priority; the calling thread is left as it was, and
// run_in_arena rethrows what its function throws.
TEST(LivePinning, AThreadStartedIntoAnArenaIsOneOfItsThreads) {
  const Topology topo = Topology::load();
  const CpuList mine = current_thread_cpus();
  const CpuList cpus = {mine.back()};
  PinnedArena background(topo, cpus, "teacher", 3, Priority::background);
  CpuList seen;
  std::string name;
  int policy = -1;
  bool marked = false;
  run_in_arena(background.arena(), [&] {
    seen = current_thread_cpus();
    char buf[16] = {};
    pthread_getname_np(pthread_self(), buf, sizeof(buf));
    name = buf;
    policy = sched_getscheduler(0);
    marked = on_arena_thread();
  });
  EXPECT_EQ(seen, cpus);
  EXPECT_EQ(name, "kd-teacher-3");
  EXPECT_EQ(policy, SCHED_IDLE);
  EXPECT_TRUE(marked);
  EXPECT_FALSE(on_arena_thread());
  EXPECT_EQ(current_thread_cpus(), mine);
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  EXPECT_THROW(run_in_arena(background.arena(), [] { throw std::runtime_error("in the arena"); }),
               std::runtime_error);
}

TEST(LivePinning, EveryKdThreadIsBoundToItsRole) {
  const Topology topo = Topology::load();
  const Plan plan = plan_auto(topo, PlanRequest{});
  const std::size_t workers = plan.loader.size() + cpu_count(plan.teacher);
  // One worker per planned CPU, plus the external thread TBB counts (docs/DESIGN.md: arenas get
  // their own).
  oneapi::tbb::global_control workers_limit(oneapi::tbb::global_control::max_allowed_parallelism,
                                            workers + 1);

  SlotLayout layout({{"inputs", DType::u8, {64}}});
  SlotRing ring(layout, 4,
                allocate_locked(4 * layout.slot_bytes(), bind_to_numa_of(topo, plan.student)));

  PinnedArena loaders(topo, plan.loader, "loader");
  std::vector<std::unique_ptr<PinnedArena>> replicas;
  int first = 0;
  for (const auto& cpus : plan.teacher) {
    replicas.push_back(std::make_unique<PinnedArena>(topo, cpus, "teacher", first));
    first += static_cast<int>(cpus.size());
  }

  constexpr std::uint64_t kBatches = 400;
  std::latch finished(static_cast<std::ptrdiff_t>(workers));
  for (std::size_t i = 0; i < plan.loader.size(); ++i)
    loaders.arena().enqueue([&] {
      for (std::uint64_t b; (b = ring.take_ticket(RingStage::loader)) < kBatches;) {
        auto s = ring.acquire_free(b);
        if (!s) break;
        s->region<std::uint8_t>(0)[0] = static_cast<std::uint8_t>(b);
        ring.publish(*s, SlotState::filling, SlotState::filled);
      }
      finished.count_down();
    });
  for (auto& replica : replicas)
    for (std::size_t i = 0; i < replica->cpus().size(); ++i)
      replica->arena().enqueue([&] {
        for (std::uint64_t b; (b = ring.take_ticket(RingStage::teacher)) < kBatches;) {
          auto s = ring.acquire_filled(b);
          if (!s) break;
          ring.publish(*s, SlotState::teaching, SlotState::ready);
        }
        finished.count_down();
      });

  std::map<std::string, std::string> seen;
  std::thread student([&] {
    pin_this_thread(topo, plan.student, "kd-student");
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      auto s = ring.acquire_ready(b);
      ASSERT_TRUE(s);
      EXPECT_EQ(s->region<std::uint8_t>(0)[0], static_cast<std::uint8_t>(b));
      // Mid-run, while every stage is busy or parked on the ring, read the bindings.
      if (b == kBatches / 2) seen = thread_bindings();
      ring.release(*s);
    }
  });
  student.join();
  finished.wait();

  const auto expect_bound = [&](const std::string& name, const CpuList& cpus) {
    ASSERT_TRUE(seen.count(name)) << "no thread named " << name;
    EXPECT_EQ(seen[name], format_cpus(cpus)) << name;
  };
  expect_bound("kd-student", plan.student);
  int kd_threads = 0;
  for (const auto& [name, cpus] : seen) {
    if (name.rfind("kd-", 0) != 0) continue;
    ++kd_threads;
    if (name.rfind("kd-loader-", 0) == 0) {
      EXPECT_EQ(cpus, format_cpus(plan.loader)) << name;
    }
    if (name.rfind("kd-teacher-", 0) == 0) {
      const int n = std::stoi(name.substr(11));
      int base = 0;
      for (const auto& r : plan.teacher) {
        if (n < base + static_cast<int>(r.size())) {
          EXPECT_EQ(cpus, format_cpus(r)) << name;
          break;
        }
        base += static_cast<int>(r.size());
      }
    }
  }
  EXPECT_TRUE(std::any_of(seen.begin(), seen.end(),
                          [](const auto& kv) { return kv.first.rfind("kd-loader-", 0) == 0; }));
  EXPECT_TRUE(std::any_of(seen.begin(), seen.end(),
                          [](const auto& kv) { return kv.first.rfind("kd-teacher-", 0) == 0; }));
  EXPECT_GE(kd_threads, 3);
  // The student thread's own binding is undone by nothing: it ran on its role's CPUs throughout.
  EXPECT_EQ(ring.stats().stages[2].acquisitions, kBatches);
}

TEST(Pinning, PinThisThreadBindsAndNames) {
  const Topology topo = Topology::load();
  const CpuList one = {topo.allowed_cpus().back()};
  std::thread t([&] {
    pin_this_thread(topo, one, "kd-ctl");
    EXPECT_EQ(current_thread_cpus(), one);
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    EXPECT_STREQ(name, "kd-ctl");
  });
  t.join();
}

} // namespace
} // namespace kdflow::affinity
