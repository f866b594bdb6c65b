// The start-up every pipeline command shares (session.hpp).
#include "session.hpp"

#include "pipeline.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

namespace kdflow::app {

Session::Session(const std::string& config_file, const std::vector<std::string>& sets,
                 const std::string& cores)
    : config_(resolve_config(config_file, sets, cores)), dist_(dist_env().value_or(DistEnv{})),
      device_(student::resolve_device(config_.get_string("student.device"), dist_.local_rank,
                                      dist_.local_world)),
      group_(join_job(config_, dist_, device_)) {}

std::uint32_t Session::slots() const { return CpuPipeline::slots_for(*run_); }

void Session::prepare(const RunRequest& request, const std::function<void()>& then) {
  run_.emplace(agreed([&] {
    RunRequest resolved = request;
    resolved.device = device_;
    RunInputs run = prepare_run(config_, dist_, resolved);
    if (then) then();
    return run;
  }));
  sampler_.emplace(run_->train.size(), run_->sampler);
  const affinity::CpuList cpus = student_cpus(*run_);
  affinity::pin_this_thread(run_->topology, cpus, "kd-student");
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  if (cpus.size() > run_->plan.student.size() &&
      (wait == nullptr || (std::string(wait) != "PASSIVE" && std::string(wait) != "passive")))
    log_warn(fmt::format("train.threads = {}: the student's threads share the teachers' CPUs, "
                         "where LibTorch's OpenMP threads spinning at their barriers take the "
                         "teachers' time; run with OMP_WAIT_POLICY=PASSIVE (read when the process "
                         "starts)",
                         run_->config.get_int("train.threads")));
}

} // namespace kdflow::app
