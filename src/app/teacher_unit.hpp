// One replica of one of the run's teachers: its pinned arena, its oneDNN replica (buffers first
// touched on its own cores), its float32 input where the slot's images are not it as they are
// (uint8 slots, or teacher.input_size/mean/std), buffers for the graph's outputs no slot region
// holds and, once started, its stage graph. The pipeline's bodies hold a pointer to it: moves add
// and remove units while others run.
#pragma once

#include "run_inputs.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/slot_ring.hpp"
#include "kdflow/core/stage_graph.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace kdflow::app {

// The slot's regions the pipeline's stages read and write.
struct SlotRegions {
  LoaderRegions loader;
  std::optional<std::size_t> logits; // the teacher's output region (several: their mix, the target)
  // Each teacher's features' regions, in its order ([teacher]'s: teacher.features first).
  std::vector<std::vector<std::size_t>> features;
  std::vector<std::size_t> teacher_logits; // each teacher's own logits (one: `logits` itself)
};

class TeacherUnit {
public:
  // Replica of teacher `teacher` on `cpus`, its workers numbered from `first_index`
  // (kd-teacher-N); its buffers are made on those cores.
  TeacherUnit(const RunInputs& run, std::size_t teacher, const affinity::CpuList& cpus,
              int first_index);
  ~TeacherUnit(); // the graph first: it waits for its bodies, which use the rest
  TeacherUnit(const TeacherUnit&) = delete;
  TeacherUnit& operator=(const TeacherUnit&) = delete;

  [[nodiscard]] std::size_t teacher() const { return teacher_; }
  [[nodiscard]] oneapi::tbb::task_arena& arena() { return arena_->arena(); }
  [[nodiscard]] const affinity::CpuList& cpus() const { return arena_->cpus(); }
  // The forward pass on `slot`'s images (`rows` of them): the logits into `logits`, the teacher's
  // features into its slot regions. On the unit's arena.
  void forward(const Slot& slot, const SlotRegions& regions, std::size_t rows, float* logits);
  // The forward pass on a batch of its own (`inputs`, the teacher's input shape), into `outputs`.
  void forward(const float* inputs, std::span<float* const> outputs);

  std::unique_ptr<StageGraph> graph; // once started

private:
  const RunInputs& run_;
  const std::size_t teacher_;
  std::unique_ptr<affinity::PinnedArena> arena_;
  std::unique_ptr<teacher::Replica> replica_;
  std::vector<float> inputs_, scratch_; // scratch: the adapter's box reduction
  // The graph's outputs past the first, which no slot region holds; and every output's pointer
  // for the replica (the slot's regions are set per batch).
  std::vector<std::vector<float>> other_outputs_;
  std::vector<float*> outputs_;
};

} // namespace kdflow::app
