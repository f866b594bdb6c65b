// The training run. The main thread is the student (pinned as kd-student); the loader and teacher
// stages run as flow graphs in their pinned arenas (pipeline.hpp). The run folder holds the
// resolved config, metrics.jsonl, summary.json and atomic checkpoints; SIGINT/SIGTERM finish the
// step, save and exit 130 (a second signal exits at once).
#include "train.hpp"

#include "pipeline.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::atomic<int> g_signals{0};

extern "C" void on_stop_signal(int) {
  // The first signal asks for a clean stop after the step; a second one exits at once.
  if (g_signals.fetch_add(1) >= 1) ::_exit(kExitInterrupted);
}

// Installs the handlers for the run and restores the previous ones after it.
class StopSignals {
public:
  StopSignals() {
    g_signals.store(0);
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  [[nodiscard]] static bool requested() { return g_signals.load() > 0; }

private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// Keys that decide a run's trajectory: a resumed run must have the same values to continue it
// exactly. (Epochs, step limits, logging and checkpoint cadence may change.)
bool shapes_trajectory(const std::string& key) {
  static const char* const free_keys[] = {
      "train.epochs",    "train.max_steps",        "train.checkpoint_every",
      "train.log_every", "train.keep_checkpoints", "train.on_nonfinite",
      "ring.slots",      "student.device"};
  if (key.starts_with("cores.")) return false;
  return std::none_of(std::begin(free_keys), std::end(free_keys),
                      [&](const char* k) { return key == k; });
}

std::string value_text(const Config& c, const ConfigKey& key) {
  switch (key.type) {
  case ConfigType::boolean: return c.get_bool(key.name) ? "true" : "false";
  case ConfigType::integer: return std::to_string(c.get_int(key.name));
  case ConfigType::real: return fmt::format("{}", c.get_double(key.name));
  case ConfigType::string: return c.get_string(key.name);
  }
  return {};
}

json trajectory_keys(const Config& config) {
  json out = json::object();
  for (const auto& key : config_schema())
    if (shapes_trajectory(key.name)) out[key.name] = value_text(config, key);
  return out;
}

fs::path checkpoint_name(const fs::path& folder, std::int64_t step) {
  return folder / fmt::format("step-{:09d}.ckpt", step);
}

// Finished checkpoints in `folder`, oldest first (temporaries of a killed writer are skipped).
std::vector<fs::path> list_checkpoints(const fs::path& folder) {
  std::vector<fs::path> out;
  if (!fs::is_directory(folder)) return out;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.starts_with("step-") && name.ends_with(".ckpt") &&
        !is_atomic_temporary(entry.path()))
      out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::uint64_t fnv1a(const std::vector<float>& values) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(values.data());
  for (std::size_t i = 0; i < values.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string clock_text(double seconds) {
  const auto s = static_cast<long>(std::max(0.0, seconds));
  return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
}

class Progress {
public:
  explicit Progress(bool terminal) : terminal_(terminal) {}
  ~Progress() { finish(); }
  [[nodiscard]] bool terminal() const { return terminal_; }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  // The live line on a terminal, at most 4 updates a second: the caller formats it only when due().
  [[nodiscard]] bool due() {
    if (!terminal_) return false;
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(250)) return false;
    last_ = now;
    return true;
  }
  void show(const std::string& line) {
    fmt::print(stderr, "\r\033[K{}", line);
    std::fflush(stderr);
    shown_ = true;
  }
  // A permanent line (the live line is cleared first).
  void line(const std::string& text) {
    finish();
    log_info(text);
  }
  void finish() {
    if (!shown_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

private:
  bool terminal_;
  bool shown_ = false;
  Clock::time_point last_{};
};

struct Interval {
  double loss = 0, kd = 0, ce = 0;
  std::int64_t correct = 0, samples = 0, steps = 0;
  Clock::time_point start = Clock::now();
  std::uint64_t wait_ns = 0, teacher_ns = 0;
};

} // namespace

int train_command(const TrainArgs& args) {
  const auto started = Clock::now();
  const Config config = resolve_config(args.config, args.sets, args.cores);

  const fs::path out = args.out;
  const fs::path ckpt_dir = out / "checkpoints";
  // Pick the checkpoint to resume from before anything is written.
  std::optional<fs::path> resume_from;
  if (args.resume == "auto") {
    const auto found = list_checkpoints(ckpt_dir);
    if (!found.empty()) resume_from = found.back();
  } else if (!args.resume.empty()) {
    if (!fs::is_regular_file(args.resume))
      throw InputError(fmt::format("--resume {}: no such checkpoint file", args.resume));
    resume_from = fs::path(args.resume);
  } else if (!list_checkpoints(ckpt_dir).empty()) {
    throw InputError(fmt::format(
        "{} already holds checkpoints of a run: continue it with --resume auto, or choose "
        "another --out",
        ckpt_dir.string()));
  }

  RunInputs run = prepare_run(config);
  const Sampler sampler(run.train.size(), run.sampler);
  const auto per_epoch = static_cast<std::uint64_t>(sampler.batches_per_epoch());
  const auto epochs = static_cast<std::uint64_t>(config.get_int("train.epochs"));
  const std::uint64_t schedule = epochs * per_epoch;
  const auto max_steps = static_cast<std::uint64_t>(config.get_int("train.max_steps"));
  const std::uint64_t last = max_steps > 0 ? std::min(schedule, max_steps) : schedule;

  // The student thread: pinned before torch starts its own threads (they inherit the binding).
  affinity::pin_this_thread(run.topology, run.plan.student, "kd-student");

  const student::TrainerOptions topt = trainer_options(run, static_cast<std::int64_t>(schedule));

  // The ring's memory: pinned for the GPU where there is one, bound to the student's NUMA node.
  const SlotLayout layout = CpuPipeline::layout_for(run);
  const auto slots = static_cast<std::uint32_t>(config.get_int("ring.slots"));
  CpuPipeline pipeline(
      run, sampler, slots,
      student::allocate_pinned_for_device(
          slots * layout.slot_bytes(), affinity::bind_to_numa_of(run.topology, run.plan.student)));
  student::StepRegions step_regions{pipeline.regions().loader.inputs,
                                    pipeline.regions().loader.labels, pipeline.regions().logits};
  student::Trainer trainer(topt, pipeline.ring(), step_regions);

  // Resume: a bad checkpoint fails here, before anything in the run folder changes.
  std::uint64_t next_batch = 0;
  double best_accuracy = 0, test_accuracy = 0;
  std::optional<double> teacher_accuracy;
  json evaluations = json::array();
  double previous_wall_s = 0;
  if (resume_from) {
    json state;
    try {
      state = json::parse(trainer.load(*resume_from));
      const json written = state.value("config", json::object());
      const json expected = trajectory_keys(config);
      for (const auto& [key, value] : expected.items()) {
        const std::string was = written.value(key, std::string("<absent>"));
        if (was != value)
          throw InputError(fmt::format(
              "checkpoint {} was written with {} = {}; this run has {} (resume with the same "
              "settings, or start a new --out)",
              resume_from->string(), key, was, value.get<std::string>()));
      }
      next_batch = state.at("next_batch").get<std::uint64_t>();
      best_accuracy = state.value("best_test_accuracy", 0.0);
      test_accuracy = state.value("test_accuracy", 0.0);
      evaluations = state.value("evaluations", json::array());
      previous_wall_s = state.value("wall_s", 0.0);
      if (const auto t = state.value("teacher_test_accuracy", json()); t.is_number())
        teacher_accuracy = t.get<double>();
    } catch (const json::exception& e) {
      throw InputError(fmt::format("checkpoint {}: its run state is unreadable ({})",
                                   resume_from->string(), e.what()));
    }
    if (next_batch > last)
      throw InputError(fmt::format("checkpoint {} is at batch {}, past this run's end ({}): raise "
                                   "train.epochs or train.max_steps to continue it",
                                   resume_from->string(), next_batch, last));
    log_info(fmt::format("resuming from {}: step {}, batch {} of {}", resume_from->string(),
                         trainer.steps_done(), next_batch, last));
  }

  fs::create_directories(ckpt_dir);
  write_file_atomic(out / "config.toml", config.to_toml());
  std::ofstream metrics(out / "metrics.jsonl", resume_from ? std::ios::app : std::ios::trunc);
  if (!metrics) throw InputError(fmt::format("cannot write {}", (out / "metrics.jsonl").string()));
  std::mutex metrics_mutex; // the student's lines and kd-ctl's moves
  const auto write_metrics = [&](const json& line) {
    std::lock_guard lock(metrics_mutex);
    metrics << line.dump() << '\n' << std::flush;
  };
  // kd-ctl writes metrics: on every way out, it stops (with the pipeline) before they close.
  struct StopFirst {
    CpuPipeline& pipeline;
    ~StopFirst() { pipeline.stop(); }
  } stop_first{pipeline};

  AugmentConfig eval = run.augment;
  eval.augment = false;
  const std::vector<float> test_images = normalized_images(run.test, eval);
  std::vector<std::int64_t> test_labels(run.test.size());
  for (std::size_t i = 0; i < run.test.size(); ++i) test_labels[i] = run.test.label(i);
  if (run.teacher_runs && !teacher_accuracy) {
    teacher_accuracy = teacher_test_accuracy(run, test_images, *pipeline.teacher_arena(0));
    log_info(fmt::format("teacher {}: test accuracy {:.4f} ({} precision, {} replica(s))",
                         run.teacher_path, *teacher_accuracy,
                         config.get_string("teacher.precision"), pipeline.replicas()));
  }
  log_info(fmt::format("student {} ({} parameters) on {}, {}; {} steps of batch {} ({} per epoch)",
                       topt.model.arch, trainer.parameters(), trainer.device(), trainer.precision(),
                       last, run.sampler.batch_size, per_epoch));

  const std::int64_t keep = config.get_int("train.keep_checkpoints");
  const auto every = static_cast<std::uint64_t>(config.get_int("train.checkpoint_every"));
  const auto log_every = static_cast<std::uint64_t>(config.get_int("train.log_every"));
  auto run_state = [&](std::uint64_t next) {
    return json{
        {"next_batch", next},
        {"config", trajectory_keys(config)},
        {"best_test_accuracy", best_accuracy},
        {"test_accuracy", test_accuracy},
        {"teacher_test_accuracy", teacher_accuracy ? json(*teacher_accuracy) : json(nullptr)},
        {"evaluations", evaluations},
        {"wall_s", previous_wall_s + std::chrono::duration<double>(Clock::now() - started).count()}}
        .dump();
  };
  double eval_s = 0, save_s = 0; // time outside the steps, for the steady-state rate
  auto save = [&](std::uint64_t next) {
    const auto t0 = Clock::now();
    const fs::path path = checkpoint_name(ckpt_dir, trainer.steps_done());
    trainer.save(path, run_state(next));
    auto all = list_checkpoints(ckpt_dir);
    for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i)
      fs::remove(all[i]);
    save_s += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto evaluate = [&](double epoch) {
    const auto t0 = Clock::now();
    test_accuracy = trainer.evaluate(test_images, test_labels);
    best_accuracy = std::max(best_accuracy, test_accuracy);
    evaluations.push_back(
        {{"epoch", epoch}, {"step", trainer.steps_done()}, {"test_accuracy", test_accuracy}});
    eval_s += std::chrono::duration<double>(Clock::now() - t0).count();
  };

  // The pipeline runs from the resume point to the end.
  StopSignals signals;
  Progress progress(::isatty(STDERR_FILENO) == 1);
  const auto loop_start = Clock::now();
  const std::uint64_t begin = next_batch;
  pipeline.start(begin, last - begin);
  std::optional<std::string> elastic_off = "cores.elastic = false";
  if (config.get_bool("cores.elastic")) {
    ElasticSettings elastic;
    elastic.policy.margin = config.get_double("cores.elastic_margin");
    elastic.window_s = config.get_double("cores.elastic_window_s");
    elastic.on_move = write_metrics;
    elastic_off = pipeline.start_elastic(std::move(elastic));
    if (elastic_off) log_info(fmt::format("kd-ctl off: {}", *elastic_off));
  }
  Interval interval;
  std::uint64_t samples = 0;
  bool interrupted = false;
  const RingStats ring_before = pipeline.ring().stats();
  std::uint64_t last_wait_ns = ring_before.stages[2].wait_ns;
  std::uint64_t last_teacher_ns = 0;
  for (std::uint64_t b = begin; b < last; ++b) {
    const auto stats = trainer.step(b - begin);
    if (!stats) break;
    samples += stats->samples;
    interval.loss += stats->loss * stats->samples;
    interval.kd += stats->kd_loss * stats->samples;
    interval.ce += stats->ce_loss * stats->samples;
    interval.correct += stats->correct;
    interval.samples += stats->samples;
    ++interval.steps;
    const std::uint64_t epoch = b / per_epoch;
    const bool epoch_end = (b + 1) % per_epoch == 0;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - loop_start).count();
    const double rate = static_cast<double>(samples) / std::max(1e-9, elapsed);
    const RingStats ring = pipeline.ring().stats();
    if ((b + 1) % log_every == 0 || epoch_end || b + 1 == last) {
      const double span = std::chrono::duration<double>(now - interval.start).count();
      const std::uint64_t wait_ns = ring.stages[2].wait_ns, teacher_ns = pipeline.teacher_busy_ns();
      const double replicas = static_cast<double>(std::max<std::size_t>(1, pipeline.replicas()));
      const double n = static_cast<double>(std::max<std::int64_t>(1, interval.samples));
      const json line = {
          {"step", trainer.steps_done()},
          {"epoch", epoch},
          {"loss", interval.loss / n},
          {"kd_loss", interval.kd / n},
          {"ce_loss", interval.ce / n},
          {"train_accuracy", static_cast<double>(interval.correct) / n},
          {"lr", stats->lr},
          {"samples_per_s", static_cast<double>(interval.samples) / std::max(1e-9, span)},
          {"student_wait_ms", static_cast<double>(wait_ns - last_wait_ns) / 1e6},
          {"teacher_busy", run.teacher_runs ? static_cast<double>(teacher_ns - last_teacher_ns) /
                                                  (span * 1e9 * replicas)
                                            : 0.0},
          {"ring_ready", ring.occupancy[static_cast<int>(SlotState::ready)]},
          {"skipped_steps", trainer.skipped_steps()}};
      write_metrics(line);
      if (!progress.terminal())
        log_info(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.4f} {:.0f} samples/s",
                             trainer.steps_done(), last, epoch + 1, line["loss"].get<double>(),
                             stats->lr, line["samples_per_s"].get<double>()));
      last_wait_ns = wait_ns;
      last_teacher_ns = teacher_ns;
      interval = Interval{};
    }
    if (progress.due())
      progress.show(fmt::format(
          "epoch {}/{} step {}/{} loss {:.4f} acc {:.1f}% {:.0f} samples/s ETA {} ring {}/{}",
          epoch + 1, epochs, b + 1, last, stats->loss,
          100.0 * static_cast<double>(stats->correct) / std::max<std::uint32_t>(1, stats->samples),
          rate,
          clock_text(static_cast<double>(last - b - 1) *
                     (elapsed / static_cast<double>(b + 1 - begin))),
          ring.occupancy[static_cast<int>(SlotState::ready)], slots));
    if (epoch_end) {
      evaluate(static_cast<double>(epoch + 1));
      progress.line(fmt::format(
          "epoch {}/{}: test accuracy {:.4f}{} ({:.0f} samples/s)", epoch + 1, epochs,
          test_accuracy,
          teacher_accuracy ? fmt::format(" (teacher {:.4f})", *teacher_accuracy) : std::string(),
          rate));
    }
    if (StopSignals::requested()) {
      interrupted = true;
      save(b + 1);
      break;
    }
    if (epoch_end || (every > 0 && trainer.steps_done() % static_cast<std::int64_t>(every) == 0) ||
        b + 1 == last)
      save(b + 1);
  }
  pipeline.stop();
  trainer.drain();
  progress.finish();
  pipeline.ring().rethrow_if_failed();
  const bool finished_epoch = last % per_epoch == 0;
  if (!interrupted && !finished_epoch)
    evaluate(static_cast<double>(last) / static_cast<double>(per_epoch));

  const double loop_s = std::chrono::duration<double>(Clock::now() - loop_start).count();
  const RingStats ring = pipeline.ring().stats();
  const double stall_ns =
      static_cast<double>(ring.stages[2].wait_ns - ring_before.stages[2].wait_ns);
  json summary = {
      {"test_accuracy", test_accuracy},
      {"best_test_accuracy", best_accuracy},
      {"teacher_test_accuracy", teacher_accuracy ? json(*teacher_accuracy) : json(nullptr)},
      {"epochs", static_cast<double>(trainer.steps_done()) / static_cast<double>(per_epoch)},
      {"steps", trainer.steps_done()},
      {"wall_s", previous_wall_s + std::chrono::duration<double>(Clock::now() - started).count()},
      {"train_loop_s", loop_s},
      {"evaluation_s", eval_s},
      {"checkpoint_s", save_s},
      // Training throughput: the steps' time, evaluations and checkpoint writes left out.
      {"samples_per_s", static_cast<double>(samples) / std::max(1e-9, loop_s - eval_s - save_s)},
      {"student_stall_fraction", stall_ns / std::max(1.0, (loop_s - eval_s - save_s) * 1e9)},
      {"teacher_busy_fraction", run.teacher_runs
                                    ? static_cast<double>(pipeline.teacher_busy_ns()) /
                                          (loop_s * 1e9 * static_cast<double>(pipeline.replicas()))
                                    : 0.0},
      {"device", trainer.device()},
      {"precision", trainer.precision()},
      {"student",
       {{"arch", topt.model.arch},
        {"width", topt.model.width},
        {"parameters", trainer.parameters()}}},
      {"teacher", run.teacher_runs ? json(run.teacher_path) : json(nullptr)},
      {"plan", affinity::to_json(run.plan)},
      {"elastic", elastic_off ? json{{"active", false}, {"reason", *elastic_off}}
                              : json{{"active", true}, {"kd_ctl", pipeline.elastic_summary()}}},
      {"ring",
       {{"slots", slots},
        {"slot_bytes", layout.slot_bytes()},
        {"memory", memory_kind_name(pipeline.ring().memory_kind())}}},
      {"skipped_steps", trainer.skipped_steps()},
      {"interrupted", interrupted},
      {"evaluations", evaluations},
      {"state_digest", fmt::format("{:016x}", fnv1a(trainer.state_vector()))}};
  write_file_atomic(out / "summary.json", summary.dump(2) + "\n");
  if (interrupted)
    throw Interrupted(fmt::format("interrupted at step {}: checkpoint saved in {}; continue with "
                                  "--resume auto --out {}",
                                  trainer.steps_done(), ckpt_dir.string(), out.string()));
  log_info(fmt::format("done: {} steps, test accuracy {:.4f} (best {:.4f}), {:.0f} samples/s; "
                       "run folder {}",
                       trainer.steps_done(), test_accuracy, best_accuracy,
                       summary["samples_per_s"].get<double>(), out.string()));
  return kExitOk;
}

} // namespace kdflow::app
