// What every command that runs the pipeline opens first, in one order: the configuration resolved,
// this process's place in the job (torchrun: a process group for two ranks or more), the command's
// own checks agreed by every rank, the run's inputs prepared (a failure on any rank fails every
// rank), the sampler and the ring's size, and the student's thread pinned before LibTorch starts
// its threads. train, bench-overlap and tune-cores open one and keep their own loops.
#pragma once

#include "run.hpp"

#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/gpu_student/process_group.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kdflow::app {

class Session {
public:
  // Resolves the configuration (resolve_config: the file, each --set, the --cores plan) and joins
  // the job torchrun describes, if any.
  Session(const std::string& config_file, const std::vector<std::string>& sets,
          const std::string& cores = {});
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // `f()` with its failure agreed by every rank (one process: `f()`).
  template <class F>
  auto agreed(F&& f) -> decltype(f()) {
    return app::agreed(group_.get(), std::forward<F>(f));
  }
  // The run's inputs (prepare_run with `request`), agreed; `then` runs on every rank right after,
  // inside the same agreement (a stop signal's check). Then the sampler and the student's thread
  // pinned (kd-student, the plan's student CPUs).
  void prepare(const RunRequest& request, const std::function<void()>& then = {});

  [[nodiscard]] const Config& config() const { return config_; }
  [[nodiscard]] const DistEnv& dist() const { return dist_; }
  [[nodiscard]] student::ProcessGroup* group() const { return group_.get(); }
  [[nodiscard]] bool writer() const { return dist_.rank == 0; } // rank 0 writes the outputs
  // After prepare():
  [[nodiscard]] RunInputs& run() { return *run_; }
  [[nodiscard]] const RunInputs& run() const { return *run_; }
  [[nodiscard]] const Sampler& sampler() const { return *sampler_; }
  // The ring's slots for the run's plan as it is now (CpuPipeline::slots_for: ring.slots, or sized
  // for the plan; tune-cores changes the plan between candidates).
  [[nodiscard]] std::uint32_t slots() const;

private:
  const Config config_;
  const DistEnv dist_;
  const student::Device device_; // student.device, resolved once for the group and the run
  std::unique_ptr<student::ProcessGroup> group_;
  std::optional<RunInputs> run_;
  std::optional<Sampler> sampler_;
};

} // namespace kdflow::app
