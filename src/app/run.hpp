// The run that train, bench-overlap and tune-cores share. Resolve: the configuration becomes the
// run's inputs, each decided once (datasets, augmentation, the core plan, the teacher at its
// precision, the student's device). Start: one helper assembles the pipeline and the student.
#pragma once

#include "data_config.hpp"
#include "evaluation.hpp"
#include "run_inputs.hpp"
#include "run_teachers.hpp"

#include "kdflow/core/config.hpp"
#include "kdflow/gpu_student/torch_teacher.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <oneapi/tbb/task_arena.h>

#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kdflow::app {

class CpuPipeline;

// The schema every command reads its configuration with: the core's keys, with the names the
// modules' registries hold (student.arch).
const std::vector<ConfigKey>& run_schema();

// The configuration of a command: defaults, then the file, then each --set, then --cores (a plan
// file, as cores.plan, whose teacher precision comes first: --set still wins).
Config resolve_config(const std::string& file, const std::vector<std::string>& sets,
                      const std::string& cores = {});

// Under torchrun: this rank's place in the job, a process group for two ranks or more (dist.*)
// whose backend follows the student's `device`; null for one process.
std::unique_ptr<student::ProcessGroup> join_job(const Config& config, const DistEnv& dist,
                                                const student::Device& device);

// `f()`, with a failure agreed over the ranks: when any rank's throws, every rank throws (one
// process, a null group: `f()` as it is).
template <class F>
auto agreed(student::ProcessGroup* group, F&& f) -> decltype(f()) {
  if (group == nullptr) return f();
  std::optional<decltype(f())> value;
  std::exception_ptr error;
  try {
    value.emplace(f());
  } catch (...) {
    error = std::current_exception();
  }
  group->agree(error);
  return std::move(*value);
}

// load_run_inputs with the student's device (request.device, else student.device resolved for
// this local rank) and the GPUs' nearest CPUs as LibTorch and hwloc see them (gpu_localities).
RunInputs prepare_run(const Config& config, const DistEnv& dist = {},
                      const RunRequest& request = {});

// Every CUDA device with the allowed CPUs nearest it (all allowed CPUs where hwloc does not know
// the device's locality, as in a container without PCI information); empty without a GPU.
std::vector<affinity::GpuLocality> gpu_localities(const affinity::Topology& topology);

// The student's options from the run's configuration; `total_steps` is the schedule's length.
student::TrainerOptions trainer_options(const RunInputs& run, std::int64_t total_steps);

// The started parts of a run: the CPU pipeline on its ring (page-locked for the GPU where there is
// one, bound to the student's NUMA node) and the student reading that ring.
struct Assembled {
  std::unique_ptr<CpuPipeline> pipeline;
  std::unique_ptr<student::Trainer> trainer; // null when the caller asked for no student

  Assembled() = default;
  Assembled(Assembled&&) noexcept = default;
  Assembled& operator=(Assembled&& other) noexcept;
  ~Assembled();
  // The pipeline stops (its ring closes, its stages end), then the student goes, then the ring.
  void reset() noexcept;
};

enum class StudentLogits { teacher, colocated, none };
// Builds the pipeline of `slots` slots and, unless `logits` is none, a student over it: reading
// the teacher's logits from the slots, or (colocated) running `colocated` itself on each batch.
// Call on the student's (pinned) thread: torch's threads inherit its binding.
Assembled assemble(const RunInputs& run, const Sampler& sampler, std::uint32_t slots,
                   const student::TrainerOptions& options, StudentLogits logits,
                   std::vector<student::ColocatedTeacher> colocated = {});

} // namespace kdflow::app
