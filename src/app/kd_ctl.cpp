// kd-ctl's loop (kd_ctl.hpp): every window, each stage's rate and work from the pipeline's totals
// and the ring's waits; the policy decides a move; the pipeline makes it.
#include "kd_ctl.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>
#include <chrono>
#include <ranges>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::app {
namespace {

// The widest replica of the plan: kd-ctl's replicas grow up to it.
int replica_width(const affinity::Plan& plan) {
  std::size_t width = 1;
  for (const auto& r : plan.teacher) width = std::max(width, r.size());
  return static_cast<int>(width);
}

struct Snapshot {
  std::chrono::steady_clock::time_point time;
  RingStats ring;
  std::uint64_t loader_busy_ns, loader_batches, teacher_busy_ns, teacher_batches;
};

affinity::StageWindow stage_window(std::uint64_t busy0, std::uint64_t busy1, std::uint64_t batches0,
                                   std::uint64_t batches1, const RingStats::Stage& ring0,
                                   const RingStats::Stage& ring1, int cores, int bodies) {
  return {batches1 - batches0, stage_work_s(busy1 - busy0, ring1.wait_ns - ring0.wait_ns), cores,
          bodies};
}

} // namespace

std::optional<std::string> KdCtl::why_not(CpuPipeline& pipeline) {
  const RunInputs& run = pipeline.run();
  if (!run.teacher_runs() || !pipeline.loaders_run() || pipeline.replicas() == 0)
    return std::string("no teacher runs beside the loaders");
  if (run.teachers.size() > 1)
    return fmt::format("{} teachers: kd-ctl moves CPUs between the loaders and one teacher's "
                       "replicas (tune-cores shares the cores among several)",
                       run.teachers.size());
  const affinity::PoolAssignment now = pipeline.assignment();
  const int width = replica_width(run.plan);
  if (!affinity::move_cpu(now, affinity::Move::to_teacher, run.plan.student, width) &&
      !affinity::move_cpu(now, affinity::Move::to_loader, run.plan.student, width))
    return fmt::format("no CPU can move between the loaders ({}) and the teacher ({}): each pool "
                       "keeps one and the student's stays with it",
                       affinity::format_cpus(now.loader),
                       affinity::format_cpus(run.plan.teacher.front()));
  return std::nullopt;
}

KdCtl::KdCtl(CpuPipeline& pipeline, ElasticSettings settings)
    : pipeline_(pipeline), settings_(std::move(settings)), thread_([this] { control(); }) {}

KdCtl::~KdCtl() {
  {
    std::lock_guard lock(wake_mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

nlohmann::json KdCtl::summary() const {
  const affinity::PoolAssignment now = pipeline_.assignment();
  std::lock_guard lock(record_mutex_);
  return {
      {"windows", windows_}, {"moves", moves_}, {"loader", now.loader}, {"teacher", now.teacher}};
}

void KdCtl::control() {
  const RunInputs& run = pipeline_.run();
  const ElasticSettings& settings = settings_;
  affinity::pin_this_thread(run.topology, run.plan.student, "kd-ctl");
  affinity::ElasticPolicy policy(settings.policy);
  const int width = replica_width(run.plan);
  const auto started = std::chrono::steady_clock::now();
  const auto snapshot = [this] {
    const StageTotals &l = pipeline_.loader_totals(), &t = pipeline_.teacher_totals();
    return Snapshot{std::chrono::steady_clock::now(),
                    pipeline_.ring().stats(),
                    l.busy_ns.load(),
                    l.batches.load(),
                    t.busy_ns.load(),
                    t.batches.load()};
  };
  const auto window = std::chrono::duration<double>(settings.window_s);
  Snapshot before = snapshot();
  for (;;) {
    {
      std::unique_lock lock(wake_mutex_);
      if (wake_.wait_for(lock, window, [this] { return stop_; })) return;
    }
    const Snapshot after = snapshot();
    const affinity::PoolAssignment now = pipeline_.assignment();
    const auto teacher_cores = static_cast<int>(affinity::cpu_count(now.teacher));
    const auto loader_cores = static_cast<int>(now.loader.size());
    constexpr int L = static_cast<int>(RingStage::loader), T = static_cast<int>(RingStage::teacher),
                  S = static_cast<int>(RingStage::student);
    affinity::ElasticWindow w;
    w.seconds = std::chrono::duration<double>(after.time - before.time).count();
    w.student_wait_s =
        static_cast<double>(after.ring.stages[S].wait_ns - before.ring.stages[S].wait_ns) / 1e9;
    w.loader = stage_window(before.loader_busy_ns, after.loader_busy_ns, before.loader_batches,
                            after.loader_batches, before.ring.stages[L], after.ring.stages[L],
                            loader_cores, loader_cores);
    w.teacher = stage_window(before.teacher_busy_ns, after.teacher_busy_ns, before.teacher_batches,
                             after.teacher_batches, before.ring.stages[T], after.ring.stages[T],
                             teacher_cores, static_cast<int>(now.teacher.size()));
    before = after;
    const auto to_teacher =
        affinity::move_cpu(now, affinity::Move::to_teacher, run.plan.student, width);
    const auto to_loader =
        affinity::move_cpu(now, affinity::Move::to_loader, run.plan.student, width);
    const affinity::ElasticDecision d =
        policy.observe(w, to_teacher.has_value(), to_loader.has_value());
    {
      std::lock_guard lock(record_mutex_);
      ++windows_;
    }
    if (d.move == affinity::Move::none) continue;
    const affinity::PoolAssignment& next =
        d.move == affinity::Move::to_teacher ? *to_teacher : *to_loader;
    const auto t0 = std::chrono::steady_clock::now();
    if (!pipeline_.reassign(next)) return;
    policy.moved();
    const nlohmann::json record = {
        {"event", "elastic"},
        {"time_s", std::chrono::duration<double>(t0 - started).count()},
        {"batch", pipeline_.first_batch() + after.ring.stages[S].acquisitions},
        {"move", affinity::move_name(d.move)},
        {"reason", d.reason},
        {"student_wait", w.student_wait_s / std::max(1e-9, w.seconds)},
        {"loader_batches_per_s", d.loader_rate},
        {"teacher_batches_per_s", d.teacher_rate},
        {"predicted_batches_per_s", d.predicted_rate},
        {"from", {{"loader", now.loader}, {"teacher", now.teacher}}},
        {"to", {{"loader", next.loader}, {"teacher", next.teacher}}},
        {"move_ms",
         std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()}};
    {
      std::lock_guard lock(record_mutex_);
      moves_.push_back(record);
    }
    log_info(fmt::format(
        "kd-ctl: {} (loaders {}, teacher {}): {}", affinity::move_name(d.move),
        affinity::format_cpus(next.loader),
        fmt::join(next.teacher | std::views::transform(affinity::format_cpus), " | "), d.reason));
    if (settings.on_move) settings.on_move(record);
    before = snapshot(); // the move's own time is not measured
  }
}

} // namespace kdflow::app
