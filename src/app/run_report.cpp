// A training run's figures and lines (run_report.hpp).
#include "run_report.hpp"

#include "int8_report.hpp"

#include <algorithm>
#include <array>

#include <unistd.h>

namespace kdflow::app {
using nlohmann::json;

namespace {

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

// Each int8 teacher's calibration and check (Teacher::int8_check), by teacher file; null when
// none runs in int8.
json int8_checks(const RunInputs& run) {
  json out = json::array();
  for (const auto& t : run.teachers)
    if (json report = int8_report(*t.model, t.spec.path); !report.is_null()) {
      report["model"] = t.spec.path;
      out.push_back(std::move(report));
    }
  return out.empty() ? json(nullptr) : out;
}

// Each teacher's plan as loaded: its batch, how it runs it (whole, or in passes of fewer samples,
// one at a time on all its threads or as many at once as threads, each on one) and what the tuner
// measured for it (ms per batch; null untuned), by teacher file.
json teacher_plans(const RunInputs& run) {
  json out = json::array();
  for (const auto& t : run.teachers) {
    const teacher::TuneReport& r = t.model->tune_report();
    const bool tuned = r.mode == teacher::Tune::automatic;
    out.push_back({{"model", t.spec.path},
                   {"batch", t.model->batch()},
                   {"samples_per_pass", t.model->graph().batch},
                   {"passes_at_once", r.passes_at_once},
                   {"tune", teacher::tune_name(r.mode)},
                   {"from_cache", r.from_cache},
                   {"tuned_ms", tuned ? json(r.tuned_ms) : json(nullptr)}});
  }
  return out.empty() ? json(nullptr) : out;
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

json run_summary(const SummaryParts& p) {
  const RunFigures figures = figures_of(p.measured);
  const DistEnv& dist = p.run.dist;
  const student::ProcessGroup* group = p.group;
  const student::Trainer& trainer = p.trainer;
  const auto& teacher = p.state.teacher_test_accuracy;
  return {
      {"test_accuracy", p.state.test_accuracy},
      {"best_test_accuracy", p.state.best_test_accuracy},
      {"teacher_test_accuracy", teacher ? json(*teacher) : json(nullptr)},
      {"epochs", static_cast<double>(trainer.steps_done()) / static_cast<double>(p.per_epoch)},
      {"steps", trainer.steps_done()},
      {"wall_s", p.wall_s},
      {"train_loop_s", p.measured.loop_s},
      {"evaluation_s", p.measured.eval_s},
      {"checkpoint_s", p.measured.save_s},
      // Training throughput: the steps' time, evaluations and checkpoint writes left out.
      {"samples_per_s", figures.samples_per_s},
      {"student_stall_fraction", figures.stall_fraction},
      {"teacher_busy_fraction", figures.teacher_busy_fraction},
      {"device", trainer.device()},
      {"precision", trainer.precision()},
      {"student",
       {{"arch", p.options.model.arch},
        {"path", p.options.model.path.empty() ? json(nullptr) : json(p.options.model.path)},
        {"width", p.options.model.width},
        {"parameters", trainer.parameters()}}},
      {"export", p.exported},
      {"teacher", p.run.teacher_runs() ? json(p.run.teachers.front().spec.path) : json(nullptr)},
      // teacher.precision = int8: each int8 teacher's check against fp32 on a batch of training
      // images its calibration did not see.
      {"teacher_int8", int8_checks(p.run)},
      // How each teacher's plan runs its batch (teacher.tune = auto times the ways to).
      {"teacher_plans", teacher_plans(p.run)},
      // Several teachers: each alone (teacher_test_accuracy is their mixture's, the target).
      {"teachers", p.state.teachers},
      {"teacher_cache", p.cache},
      {"plan", affinity::to_json(p.run.plan)},
      {"elastic", p.elastic},
      {"ring",
       {{"slots", p.slots},
        {"slot_bytes", p.ring.layout().slot_bytes()},
        {"memory", memory_kind_name(p.ring.memory_kind())}}},
      {"skipped_steps", trainer.skipped_steps()},
      {"interrupted", p.interrupted},
      {"evaluations", p.state.evaluations},
      {"world_size", dist.world},
      {"batch_size", p.run.sampler.batch_size},
      {"global_batch_size", p.run.sampler.batch_size * static_cast<std::size_t>(dist.world)},
      {"dist",
       group ? json{{"backend", group->backend()},
                    {"timeout_s", group->options().timeout_s},
                    {"bucket_mb", group->options().bucket_mb},
                    {"buckets", trainer.bucket_stats()->buckets},
                    {"buckets_launched_in_backward", trainer.bucket_stats()->launched_in_backward},
                    {"buckets_launched_after_backward",
                     trainer.bucket_stats()->launched_after_backward},
                    {"batchnorm", "each rank's batch statistics; running statistics "
                                  "rank 0's (broadcast after every step)"}}
             : json(nullptr)},
      {"ranks", p.ranks},
      {"state_digest", p.state_digest}};
}

json all_ranks(student::ProcessGroup* group, const json& mine) {
  if (group == nullptr) return json::array({mine});
  json ranks = json::array();
  for (const auto& text : group->all_gather(mine.dump(), "gathering the ranks' figures"))
    ranks.push_back(json::parse(text));
  return ranks;
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
