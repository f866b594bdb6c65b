// Every mode (modes.hpp) runs the same data, student, teacher and plan: a fresh pipeline and
// student per repetition, `warmup` steps, then `steps` measured steps; the median repetition is
// reported, with the ideal (the slowest stage alone) and the speedups over the two baselines.
#include "bench_overlap.hpp"

#include "all_versions.hpp"
#include "gnuplot.hpp"
#include "modes.hpp"
#include "pipeline.hpp"
#include "run.hpp"
#include "run_report.hpp"
#include "session.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/core/versions.hpp"
#include "kdflow/gpu_student/h2d.hpp"
#include "kdflow/gpu_student/torch_teacher.hpp"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string machine_text() {
  struct utsname u {};
  ::uname(&u);
  return fmt::format("{} ({} CPUs allowed), {} {}", cpu_identity(), ::sysconf(_SC_NPROCESSORS_ONLN),
                     u.sysname, u.release);
}

// A bar chart of the modes with the ideal as a line, drawn by gnuplot (Debian's gnuplot-nox).
void write_plot(const fs::path& png, const json& report) {
  std::string modes;
  for (const Mode m : kModes)
    modes += fmt::format("\"{}\" {}\n", mode_name(m),
                         report["modes"][mode_name(m)]["samples_per_s"].get<double>());
  // Bars far above the ideal (a loader alone) are cut at 2.5x the ideal, their value printed.
  const double ideal = report["ideal_samples_per_s"].get<double>();
  std::ostringstream script;
  script
      << "set terminal pngcairo size 900,520 font 'sans,11'\n"
      << "set output " << gnuplot_quoted(fs::absolute(png).string()) << "\n"
      << "set title \"kdflow bench-overlap: " << report["device"].get<std::string>() << " student; "
      << report["plan_summary"].get<std::string>() << "\" noenhanced\n"
      << "set ylabel 'samples/s (median of repetitions)'\nset grid ytics\n"
      << "ideal = " << ideal << "\ntop = 2.5 * ideal\nset yrange [0:top]\n"
      << "set style fill solid 0.8 border -1\nset boxwidth 0.7\n"
      << "set xtics noenhanced rotate by -20\nset key top right\nset xrange [-0.6:"
      << std::size(kModes) - 0.4 << "]\n"
      << "plot 'modes.dat' using 0:($2 < top ? $2 : top):xtic(1) with boxes lc rgb '#4477aa' "
         "title 'samples/s', "
      << "'' using 0:($2 < top ? $2 : 0.94 * top):(sprintf('%.0f', $2)) with labels offset 0,0.8 "
         "notitle, "
      << "ideal with lines lw 2 dt 2 lc rgb '#cc3311' title 'ideal (slowest stage alone)'\n";
  run_gnuplot(script.str(), {{"modes.dat", modes}}, "--plot " + png.string());
  if (!fs::exists(png))
    throw std::runtime_error(fmt::format("--plot {}: gnuplot wrote no file", png.string()));
}

// H2D bandwidth of the ring's slots against cudaMemcpy from pinned memory, at the run's slot size
// and at 64 MiB a copy (where both should reach the link's rate); null without a CUDA device.
json h2d_report(const RunInputs& run, std::uint32_t slots) {
  constexpr std::size_t kLargeBytes = std::size_t{64} << 20;
  constexpr double kBytesPerWindow = 2e9; // ~40 ms at the 55 GB/s of an H100 on PCIe 5
  const auto measure = [&](const SlotLayout& layout) -> json {
    const auto copies = static_cast<std::uint64_t>(
        std::clamp(kBytesPerWindow / static_cast<double>(layout.slot_bytes()), 50.0, 20000.0));
    const auto m = student::measure_h2d(layout, slots, copies);
    if (!m) return nullptr;
    return {{"bytes_per_copy", m->bytes},
            {"copies", m->copies},
            {"slots_gb_per_s", m->slots_gb_per_s},
            {"memcpy_pinned_gb_per_s", m->memcpy_gb_per_s},
            {"ratio", m->ratio()},
            {"slot_memory", m->slot_memory}};
  };
  json run_slots = measure(CpuPipeline::layout_for(run));
  if (run_slots.is_null()) return nullptr;
  const SlotLayout large({{"bytes", DType::u8, {static_cast<std::int64_t>(kLargeBytes)}}});
  return {{"run_slots", run_slots}, {"large_slots", measure(large)}};
}

// One bench-overlap run: the session and the measuring setup, then each group of modes, the
// report and its outputs.
class OverlapBench {
public:
  explicit OverlapBench(const OverlapArgs& args);
  // Every mode of kModes; overlapped-cached with kd.cache; each of several teachers alone; one
  // rank alone under torchrun.
  void measure_all();
  // The report (rank 0's figures at the top; the job's under torchrun). Null on the other ranks.
  [[nodiscard]] json report();
  void print(const json& report) const;
  void write(const json& report);

private:
  // The median of `--repeats` repetitions of `mode`, and every repetition's rate.
  std::pair<Rep, std::vector<double>> measure(const Setup& on, Mode mode);
  void record(Mode mode, const Rep& med, const std::vector<double>& rates);
  void measure_cached();
  void measure_teachers_alone();
  [[nodiscard]] double rate(Mode m) const {
    return modes_[mode_name(m)]["samples_per_s"].get<double>();
  }
  [[nodiscard]] json setup_json() const;

  const OverlapArgs& args_;
  Session session_;
  std::uint64_t warmup_ = 0, steps_ = 0;
  std::optional<Setup> setup_;
  trace::Recorder recorder_;
  json modes_ = json::object();
  std::string device_;
  json cache_report_ = nullptr, teachers_alone_ = nullptr;
  std::vector<double> each_alone_;
  std::optional<double> one_rank_;
  double ideal_ = 0, ceiling_ = 0;
  std::string bottleneck_, plan_summary_;
};

OverlapBench::OverlapBench(const OverlapArgs& args)
    : args_(args), session_(args.config, args.sets, args.cores) {
  // Under torchrun every rank measures every mode on its share (the student's modes averaging
  // gradients over the ranks); rank 0 reports each rank's figures and the job's.
  const Config& config = session_.config();
  if (!(config.get_double("kd.alpha") > 0))
    throw InputError("kd.alpha = 0: bench-overlap measures distillation, which needs a teacher "
                     "(set kd.alpha > 0)");
  if (args.steps < 1 || args.repeats < 1 || args.warmup < 0 || !(args.min_seconds >= 0))
    throw InputError(
        "--steps and --repeats must be at least 1, --warmup and --min-seconds at least 0");
  // Refuse unwritable outputs before minutes of measuring.
  session_.agreed([&] {
    for (const std::string& f : {args.json, args.trace, args.plot})
      if (session_.writer() && !f.empty() && !fs::is_directory(fs::absolute(f).parent_path()))
        throw InputError(fmt::format("{}: its folder does not exist", f));
    if (session_.writer() && !args.plot.empty() && !gnuplot_installed())
      throw InputError(fmt::format("--plot {}: gnuplot is not installed here (scripts/setup.sh "
                                   "installs gnuplot-nox); leave --plot out to measure without it",
                                   args.plot));
    return 0;
  });
  session_.prepare({.cache = true}); // the cache for overlapped-cached
  const RunInputs& run = session_.run();
  // At least a lap of the ring before measuring: the replay modes load each slot once there.
  warmup_ = std::max<std::uint64_t>(static_cast<std::uint64_t>(args.warmup), session_.slots());
  steps_ = static_cast<std::uint64_t>(args.steps);
  if (warmup_ + steps_ > session_.sampler().batches_per_epoch() * 1000)
    throw InputError("--steps: more steps than the sampler has batches for");
  setup_.emplace(Setup{run,
                       session_.sampler(),
                       session_.slots(),
                       warmup_,
                       steps_,
                       args.min_seconds,
                       trainer_options(run, static_cast<std::int64_t>(warmup_ + steps_)),
                       {},
                       {}});
  setup_->options.group = session_.group();
  for (std::size_t t = 0; t < run.teachers.size(); ++t)
    setup_->colocated.push_back(
        {std::make_shared<const student::TorchTeacher>(run.teachers[t].model->graph(), run.device,
                                                       run.teachers[t].model->precision()),
         run.teachers[t].input, run.mix ? std::exp(run.mix->log_weights()[t]) : 1.0});
}

std::pair<Rep, std::vector<double>> OverlapBench::measure(const Setup& on, Mode mode) {
  std::vector<Rep> reps;
  for (int r = 0; r < args_.repeats; ++r) {
    if (session_.writer())
      log_info(fmt::format("{}: repetition {}/{} ({} + {} steps, at least {} s)", mode_name(mode),
                           r + 1, args_.repeats, warmup_, steps_, args_.min_seconds));
    reps.push_back(run_rep(on, mode));
  }
  std::vector<double> rates;
  for (const Rep& rep : reps) rates.push_back(rep.rate());
  std::sort(reps.begin(), reps.end(),
            [](const Rep& a, const Rep& b) { return a.rate() < b.rate(); });
  return {reps[reps.size() / 2], rates};
}

void OverlapBench::record(Mode mode, const Rep& med, const std::vector<double>& rates) {
  if (!med.device.empty()) device_ = med.device;
  const RunInputs& run = session_.run();
  const double s = med.seconds;
  const double replicas = static_cast<double>(run.plan.teacher.size());
  const double loaders = static_cast<double>(run.plan.loader.size());
  modes_[mode_name(mode)] = {
      {"samples_per_s", med.rate()},
      {"repetitions_samples_per_s", rates},
      {"step_ms", 1e3 * s / static_cast<double>(med.steps)},
      {"seconds", s},
      {"steps", med.steps},
      // The student's device idle: the window less its steps (its waits for a batch left out;
      // in serial-cpu the load and the CPU teacher run outside the steps).
      {"student_idle_fraction",
       student_runs(mode) ? json(std::clamp(1.0 - med.student_busy_s / s, 0.0, 1.0)) : json()},
      {"loader_busy_fraction", med.loader_work_s / (s * loaders)},
      {"teacher_busy_fraction", med.teacher_work_s / (s * replicas)},
      {"wait_s",
       {{"student", med.student_wait_s},
        {"loader", med.loader_wait_s},
        {"teacher", med.teacher_wait_s}}},
      {"busy_s",
       {{"student", med.student_busy_s},
        {"loader", med.loader_work_s},
        {"teacher", med.teacher_work_s}}},
      {"ring_ready_mean", med.ring_ready},
      {"student_threads", med.student_threads > 0 ? json(med.student_threads) : json()},
      {"student_cpus", med.student_cpus.empty() ? json() : json(med.student_cpus)}};
}

void OverlapBench::measure_all() {
  if (session_.writer() && !args_.trace.empty()) trace::set_active(&recorder_);
  for (const Mode mode : kModes) {
    recorder_.begin_section(mode_name(mode));
    const auto [med, rates] = measure(*setup_, mode);
    record(mode, med, rates);
  }
  measure_cached();
  measure_teachers_alone();
  trace::set_active(nullptr);
  // Several ranks: the scaling reference, one rank training alone (no all-reduce) on its share
  // while the others wait.
  if (student::ProcessGroup* group = session_.group()) {
    if (session_.writer()) {
      Setup alone = *setup_;
      alone.options.group = nullptr;
      one_rank_ = measure(alone, Mode::overlapped).first.rate();
    }
    (void)group->all_gather("", "waiting for rank 0's one-rank measurement");
  }
}

void OverlapBench::measure_cached() {
  // kd.cache: the overlapped pipeline as a run's later epochs have it, the teacher stage reading
  // what was kept of its first (each rank its own shard's: the sampler's fixed shards).
  const RunInputs& run = session_.run();
  if (!run.cache) return;
  const std::string mode = session_.config().get_string("kd.cache");
  log_info(fmt::format("kd.cache = {}: the {} first epoch, kept ({} of {} samples held)", mode,
                       run.teachers.size() > 1 ? "teachers'" : "teacher's", run.cache->stored(),
                       run.cache->samples()));
  const CacheFill fill = fill_teacher_cache(*setup_);
  if (!run.cache_file.empty() && fill.samples_added > 0) {
    try {
      run.cache->save(run.cache_file, run.cache_key);
    } catch (const std::exception& e) {
      log_warn(fmt::format("kd.cache = disk: {}: not kept for later runs", e.what()));
    }
  }
  recorder_.begin_section(mode_name(Mode::overlapped_cached));
  const auto [med, rates] = measure(*setup_, Mode::overlapped_cached);
  record(Mode::overlapped_cached, med, rates);
  cache_report_ = {
      {"mode", mode},
      {"top_k", run.cache->full() ? 0 : run.cache->kept()},
      {"samples", run.cache->samples()},
      {"samples_kept", run.cache->stored()},
      {"fill_s", fill.seconds},
      {"fill_teacher_batches", fill.batches},
      {"speedup_vs_overlapped", rate(Mode::overlapped_cached) / rate(Mode::overlapped)}};
}

void OverlapBench::measure_teachers_alone() {
  // Several teachers: each one's stage alone, on its own replicas (teacher-alone runs them all).
  const RunInputs& run = session_.run();
  if (run.teachers.size() < 2) return;
  teachers_alone_ = json::array();
  for (std::size_t t = 0; t < run.teachers.size(); ++t) {
    Setup one = *setup_;
    one.only_teacher = t;
    recorder_.begin_section(fmt::format("teacher-alone[{}]", t));
    const auto [med, rates] = measure(one, Mode::teacher_alone);
    each_alone_.push_back(med.rate());
    teachers_alone_.push_back(
        {{"teacher", t},
         {"model", run.teachers[t].spec.path},
         {"precision", teacher::precision_name(run.teachers[t].model->precision())},
         {"replicas",
          std::count(run.plan.teacher_of.begin(), run.plan.teacher_of.end(), static_cast<int>(t))},
         {"samples_per_s", med.rate()},
         {"repetitions_samples_per_s", rates}});
  }
}

json OverlapBench::setup_json() const {
  const Config& config = session_.config();
  const RunInputs& run = session_.run();
  return {{"dataset", config.get_string("data.dataset")},
          {"batch", run.sampler.batch_size},
          {"teacher", run.teachers.front().spec.path},
          {"teacher_precision", teacher::precision_name(run.teachers.front().spec.precision)},
          {"student", config.get_string("student.arch")},
          {"student_width", config.get_double("student.width")},
          {"ring_slots", session_.slots()},
          {"warmup_steps", warmup_},
          {"steps", steps_},
          {"repetitions", args_.repeats}};
}

json OverlapBench::report() {
  const RunInputs& run = session_.run();
  const DistEnv& dist = session_.dist();
  // The slowest stage alone; each of several teachers is a stage too (teacher-alone runs them all
  // at once, so it is at most the slowest of them).
  const double slowest_teacher = std::min(
      rate(Mode::teacher_alone),
      each_alone_.empty() ? INFINITY : *std::min_element(each_alone_.begin(), each_alone_.end()));
  ideal_ = std::min({rate(Mode::student_alone), slowest_teacher, rate(Mode::loader_alone)});
  // The contention ceiling: the slowest stage alone, the student measured beside the busy
  // teacher replicas. Efficiency against it is what the pipeline itself loses.
  ceiling_ = std::min({rate(Mode::student_contended), slowest_teacher, rate(Mode::loader_alone)});
  bottleneck_ =
      ideal_ == rate(Mode::student_alone)   ? "student"
      : ideal_ == rate(Mode::teacher_alone) ? "teacher"
      : ideal_ == slowest_teacher
          ? fmt::format("teacher {}", std::min_element(each_alone_.begin(), each_alone_.end()) -
                                          each_alone_.begin())
          : "loader";
  json versions = json::object();
  for (const auto& [name, text] : all_versions()) versions[name] = text;
  plan_summary_ =
      fmt::format("student {} | loader {} | teacher {}", affinity::format_cpus(run.plan.student),
                  affinity::format_cpus(run.plan.loader),
                  run.plan.teacher.empty() ? "-" : affinity::format_cpus(run.plan.teacher[0]));
  const double overlapped = rate(Mode::overlapped);
  json report = {
      {"modes", modes_},
      {"ideal_samples_per_s", ideal_},
      {"bottleneck", bottleneck_},
      {"efficiency", overlapped / ideal_},
      {"contention_ceiling_samples_per_s", ceiling_},
      {"efficiency_vs_contention_ceiling", overlapped / ceiling_},
      {"student_contention_slowdown", rate(Mode::student_alone) / rate(Mode::student_contended)},
      {"speedup_vs_serial_cpu", overlapped / rate(Mode::serial_cpu)},
      {"speedup_vs_colocated", overlapped / rate(Mode::colocated)},
      {"speedup_vs_loop", overlapped / rate(Mode::loop)},
      {"student_idle_fraction", modes_["overlapped"]["student_idle_fraction"]},
      {"teacher_cache", cache_report_},
      {"teachers_alone", teachers_alone_},
      {"device", device_},
      {"plan", affinity::to_json(run.plan)},
      {"plan_summary", plan_summary_},
      {"versions", versions},
      {"machine", machine_text()},
      {"setup", setup_json()},
      {"h2d", h2d_report(run, session_.slots())},
      {"world_size", dist.world}};
  student::ProcessGroup* group = session_.group();
  if (!group) return report;
  // Each rank's modes, plan and device; the job's rate is the ranks' sum.
  const json mine = {
      {"rank", dist.rank},
      {"node", dist.node},
      {"local_rank", dist.local_rank},
      {"modes", modes_},
      {"device", device_},
      {"plan", report["plan"]},
      {"efficiency", report["efficiency"]},
      {"efficiency_vs_contention_ceiling", report["efficiency_vs_contention_ceiling"]}};
  const json ranks = all_ranks(group, mine);
  if (!session_.writer()) return nullptr;
  json job = json::object();
  for (const Mode m : kModes) {
    double sum = 0;
    for (const auto& r : ranks) sum += r["modes"][mode_name(m)]["samples_per_s"].get<double>();
    job[mode_name(m)] = {{"samples_per_s", sum}};
  }
  const double world = dist.world;
  report["ranks"] = ranks;
  report["job"] = {{"modes", job},
                   {"one_rank_overlapped_samples_per_s", *one_rank_},
                   // The job against `world` ranks that each trained as one rank alone does.
                   {"scaling_efficiency",
                    job["overlapped"]["samples_per_s"].get<double>() / (world * *one_rank_)}};
  return report;
}

void OverlapBench::print(const json& report) const {
  fmt::print("\n{:<18} {:>10} {:>8} {:>9} {:>8} {:>8} {:>8} {:>6}\n", "mode", "samples/s",
             "step ms", "vs ideal", "st.idle", "loader", "teacher", "ready");
  std::vector<Mode> shown(std::begin(kModes), std::end(kModes));
  if (session_.run().cache) shown.push_back(Mode::overlapped_cached);
  for (const Mode m : shown) {
    const json& r = modes_[mode_name(m)];
    const json& idle = r["student_idle_fraction"];
    fmt::print("{:<18} {:>10.1f} {:>8.2f} {:>9.3f} {:>8} {:>7.0f}% {:>7.0f}% {:>6.2f}\n",
               mode_name(m), r["samples_per_s"].get<double>(), r["step_ms"].get<double>(),
               r["samples_per_s"].get<double>() / ideal_,
               idle.is_null() ? std::string("-") : fmt::format("{:.1f}%", 100 * idle.get<double>()),
               100 * r["loader_busy_fraction"].get<double>(),
               100 * r["teacher_busy_fraction"].get<double>(), r["ring_ready_mean"].get<double>());
  }
  fmt::print("\nideal {:.1f} samples/s (slowest stage alone: {}); overlapped efficiency {:.3f}; "
             "speedup {:.2f}x over the loop, {:.2f}x over serial-cpu, {:.2f}x over colocated; "
             "student device {}; plan {}\n",
             ideal_, bottleneck_, report["efficiency"].get<double>(),
             report["speedup_vs_loop"].get<double>(), report["speedup_vs_serial_cpu"].get<double>(),
             report["speedup_vs_colocated"].get<double>(), device_, plan_summary_);
  fmt::print("contention ceiling {:.1f} samples/s (the student {:.2f}x slower beside the busy "
             "teacher); overlapped efficiency against it {:.3f}\n",
             ceiling_, report["student_contention_slowdown"].get<double>(),
             report["efficiency_vs_contention_ceiling"].get<double>());
  for (const json& t : teachers_alone_.is_null() ? json::array() : teachers_alone_)
    fmt::print("teacher-alone[{}] {:>10.1f} samples/s ({}, {} replica(s))\n",
               t["teacher"].get<std::size_t>(), t["samples_per_s"].get<double>(),
               t["model"].get<std::string>(), t["replicas"].get<std::ptrdiff_t>());
  if (!cache_report_.is_null())
    fmt::print("kd.cache = {}: overlapped-cached {:.2f}x overlapped (the {} first epoch took "
               "{:.1f} s, {} batches)\n",
               cache_report_["mode"].get<std::string>(),
               cache_report_["speedup_vs_overlapped"].get<double>(),
               session_.run().teachers.size() > 1 ? "teachers'" : "teacher's",
               cache_report_["fill_s"].get<double>(),
               cache_report_["fill_teacher_batches"].get<std::uint64_t>());
  if (report.contains("job"))
    fmt::print("{} ranks (rank 0's figures above): job overlapped {:.1f} samples/s, one rank "
               "alone {:.1f}; scaling efficiency {:.3f}\n",
               session_.dist().world,
               report["job"]["modes"]["overlapped"]["samples_per_s"].get<double>(), *one_rank_,
               report["job"]["scaling_efficiency"].get<double>());
  if (const json& h = report["h2d"]; !h.is_null())
    for (const char* which : {"run_slots", "large_slots"})
      fmt::print(
          "H2D {} ({} B a copy): slots {:.2f} GB/s, pinned cudaMemcpy {:.2f} GB/s ({:.2f})\n",
          which, h[which]["bytes_per_copy"].get<std::size_t>(),
          h[which]["slots_gb_per_s"].get<double>(),
          h[which]["memcpy_pinned_gb_per_s"].get<double>(), h[which]["ratio"].get<double>());
}

void OverlapBench::write(const json& report) {
  if (!args_.json.empty()) write_file_atomic(args_.json, report.dump(2) + "\n");
  if (!args_.trace.empty()) {
    recorder_.write(args_.trace);
    log_info(fmt::format("trace: {} spans in {} (open it in ui.perfetto.dev)", recorder_.size(),
                         args_.trace));
  }
  if (!args_.plot.empty()) write_plot(args_.plot, report);
}

} // namespace

int bench_overlap_command(const OverlapArgs& args) {
  OverlapBench bench(args);
  bench.measure_all();
  const json report = bench.report();
  if (report.is_null()) return kExitOk; // not rank 0: rank 0 reports
  bench.print(report);
  bench.write(report);
  return kExitOk;
}

} // namespace kdflow::app
