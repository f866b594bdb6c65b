// A training run's figures and lines (run_report.hpp).
#include "run_report.hpp"

#include <algorithm>
#include <array>

#include <unistd.h>

namespace kdflow::app {
namespace {

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

} // namespace

nlohmann::json rank_line(const DistEnv& dist, const std::string& device, const RunFigures& figures,
                         const affinity::Plan& plan, const std::string& state_digest) {
  return {{"rank", dist.rank},
          {"local_rank", dist.local_rank},
          {"node", dist.node},
          {"host", host_name()},
          {"device", device},
          {"samples_per_s", figures.rank_samples_per_s},
          {"student_stall_fraction", figures.stall_fraction},
          {"teacher_busy_fraction", figures.teacher_busy_fraction},
          {"plan", affinity::to_json(plan)},
          {"state_digest", state_digest}};
}

void MetricsInterval::add(const student::StepStats& step) {
  loss += step.loss * step.samples;
  kd += step.kd_loss * step.samples;
  ce += step.ce_loss * step.samples;
  feature += step.feature_loss * step.samples;
  correct += step.correct;
  samples += step.samples;
  ++steps;
}

double MetricsInterval::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

nlohmann::json MetricsInterval::line() const {
  const double n = static_cast<double>(std::max<std::int64_t>(1, samples));
  return {{"loss", loss / n},
          {"kd_loss", kd / n},
          {"ce_loss", ce / n},
          {"feature_loss", feature / n},
          {"train_accuracy", static_cast<double>(correct) / n},
          {"samples_per_s", static_cast<double>(samples) / std::max(1e-9, seconds())}};
}

} // namespace kdflow::app
