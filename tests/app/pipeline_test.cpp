// The CPU pipeline driven directly (no student): its pools moved between CPUs while batches flow,
// as kd-ctl moves them. On a machine with a CPU to spare the moves are kd-ctl's own (a loader CPU
// to the teacher, where it starts a second replica, and back); on two CPUs the loader and teacher
// pools trade CPUs. Checked: every batch arrives once, in order, with the sampler's samples and the
// teacher's logits for them; the arenas the last move built run their workers on its CPUs.
#include "pipeline.hpp"
#include "run.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"

#include <oneapi/tbb/task_arena.h>

#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace kdflow::app {
namespace {

using namespace std::chrono_literals;
using affinity::CpuList;
using affinity::PoolAssignment;

CpuList allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CpuList out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

std::string cpu_text(const CpuList& cpus) {
  std::string s;
  for (const int c : cpus) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

// The CPUs a task run in `arena` finds itself allowed.
CpuList cpus_seen_in(oneapi::tbb::task_arena& arena) {
  CpuList seen;
  run_in_arena(arena, [&] { seen = affinity::current_thread_cpus(); });
  return seen;
}

TEST(CpuPipeline, PoolsMovedWhileBatchesFlowLoseNothingAndRunOnTheirNewCpus) {
  const CpuList cpus = allowed_cpus();
  ASSERT_GE(cpus.size(), 2u);
  // The plan: student on the first CPU; on two CPUs the loaders share it, otherwise two loader
  // CPUs; one teacher CPU.
  const bool two = cpus.size() < 4;
  const CpuList loaders = two ? CpuList{cpus[0]} : CpuList{cpus[1], cpus[2]};
  const int teacher_cpu = two ? cpus[1] : cpus[3];
  const Config config = resolve_config(
      "",
      {"teacher.model=" + std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx",
       "data.batch_size=32", "data.slot_dtype=float32", "data.pad_crop=2", "data.hflip=true",
       "cores.student_cpus=" + std::to_string(cpus[0]), "cores.loader_cpus=" + cpu_text(loaders),
       "cores.teacher_cpus=" + std::to_string(teacher_cpu)});
  const RunInputs run = prepare_run(config);
  ASSERT_TRUE(run.teacher_runs);
  const Sampler sampler(run.train.size(), run.sampler);
  constexpr std::uint32_t kSlots = 4;
  constexpr std::uint64_t kBatches = 600;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  CpuPipeline pipeline(run, sampler, kSlots,
                       student::allocate_pinned_for_device(kSlots * layout.slot_bytes()));

  const PoolAssignment planned = pipeline.assignment();
  ASSERT_EQ(planned.loader, loaders);
  // The other assignment the mover alternates with.
  PoolAssignment other;
  if (two) {
    other = {CpuList{teacher_cpu}, {CpuList{cpus[0]}}}; // the pools trade CPUs
  } else {
    const auto moved = affinity::move_cpu(planned, affinity::Move::to_teacher, CpuList{cpus[0]}, 1);
    ASSERT_TRUE(moved);
    other = *moved;
    ASSERT_EQ(other.teacher.size(), 2u) << "a second replica on the moved CPU";
  }
  EXPECT_THROW(pipeline.reassign({loaders, {CpuList{teacher_cpu}, CpuList{teacher_cpu}}}),
               std::invalid_argument)
      << "more CPUs than the plan's";

  pipeline.start(0, kBatches);

  // The mover: alternates the two assignments every few milliseconds until the consumer is done.
  std::atomic<bool> consumed_all{false};
  int moves = 0;
  PoolAssignment last = planned;
  std::thread mover;
  // However the consumer ends: the ring closes (a move in progress returns false), then the mover
  // is joined.
  struct Finish {
    std::atomic<bool>& done;
    CpuPipeline& pipeline;
    std::thread& mover;
    ~Finish() {
      done.store(true);
      pipeline.stop();
      if (mover.joinable()) mover.join();
    }
  } finish{consumed_all, pipeline, mover};
  mover = std::thread([&] {
    for (int k = 0; !consumed_all.load(); ++k) {
      const PoolAssignment& to = (k % 2 == 0) ? other : planned;
      if (!pipeline.reassign(to)) break;
      ++moves;
      last = to;
      std::this_thread::sleep_for(3ms);
    }
  });

  // The consumer: each batch in order, checked against the sampler and a reference replica of the
  // same teacher (one thread, like the pipeline's).
  oneapi::tbb::task_arena one_thread(1);
  std::unique_ptr<teacher::Replica> reference;
  one_thread.execute([&] { reference = std::make_unique<teacher::Replica>(run.teacher); });
  const std::size_t classes = run.train.classes();
  std::vector<float> expected(run.sampler.batch_size * classes);
  std::vector<std::uint32_t> indices;
  std::uint64_t consumed = 0;
  double worst = 0;
  for (std::uint64_t b = 0; b < kBatches; ++b) {
    auto slot = pipeline.ring().acquire_ready(b);
    ASSERT_TRUE(slot) << "batch " << b;
    ASSERT_EQ(slot->header().batch, b);
    sampler.batch_indices(b / sampler.batches_per_epoch(), b % sampler.batches_per_epoch(),
                          indices);
    const auto ids = slot->region<std::int64_t>(pipeline.regions().loader.ids);
    for (std::size_t i = 0; i < indices.size(); ++i)
      ASSERT_EQ(ids[i], indices[i]) << "batch " << b << " sample " << i;
    const auto inputs = slot->region<float>(pipeline.regions().loader.inputs);
    float* out[] = {expected.data()};
    one_thread.execute([&] { reference->run(inputs.data(), out); });
    const auto logits = slot->region<float>(*pipeline.regions().logits);
    for (std::size_t i = 0; i < expected.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(logits[i] - expected[i])));
    pipeline.ring().release(*slot);
    ++consumed;
  }
  consumed_all.store(true);
  mover.join();
  pipeline.ring().rethrow_if_failed();

  // The stages are idle now: a task sent into each arena the last move built says where its
  // workers run (while a stage runs, its graph's own tasks always come first).
  EXPECT_EQ(pipeline.assignment(), last);
  EXPECT_EQ(cpus_seen_in(pipeline.loader_arena()), last.loader);
  ASSERT_EQ(pipeline.replicas(), last.teacher.size());
  for (std::size_t r = 0; r < last.teacher.size(); ++r)
    EXPECT_EQ(cpus_seen_in(*pipeline.teacher_arena(r)), last.teacher[r]) << "replica " << r;

  EXPECT_EQ(consumed, kBatches);
  EXPECT_LE(worst, 1e-5) << "the logits in the slots are the teacher's for the slot's images";
  EXPECT_GE(moves, 4) << "the pools moved while batches flowed";
  RecordProperty("moves", moves);
  const RingStats stats = pipeline.ring().stats();
  EXPECT_EQ(stats.stages[static_cast<int>(RingStage::loader)].acquisitions, kBatches)
      << "each batch loaded once";
  EXPECT_EQ(stats.stages[static_cast<int>(RingStage::teacher)].acquisitions, kBatches)
      << "each batch taught once";
}

} // namespace
} // namespace kdflow::app
