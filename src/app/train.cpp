// The training run, as its phases: resolve, start (with resume), the step loop (evaluations and
// checkpoints inside it), finish. The main thread is the student (pinned as kd-student); the
// loader and teacher stages run as flow graphs in their pinned arenas (pipeline.hpp). The run
// folder holds the resolved config, metrics.jsonl, summary.json and atomic checkpoints;
// SIGINT/SIGTERM finish the step, save and exit 130 (a second signal exits at once).
#include "train.hpp"

#include "export.hpp"
#include "kd_ctl.hpp"
#include "pipeline.hpp"
#include "run.hpp"
#include "run_folder.hpp"
#include "run_report.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/digest.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/watchdog.hpp"
#include "kdflow/gpu_student/process_group.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::atomic<int> g_signals{0};

extern "C" void on_stop_signal(int) {
  // The first signal asks for a clean stop after the step; a second one exits at once (a write in
  // progress leaves its temporary, which the next start sweeps away).
  if (g_signals.fetch_add(1) >= 1) {
    static const char message[] = "kdflow: a second signal: exiting now, without a checkpoint\n";
    [[maybe_unused]] const auto n = ::write(STDERR_FILENO, message, sizeof(message) - 1);
    ::_exit(kExitInterrupted);
  }
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
  // Interrupted when a stop was asked for before `phase` ends.
  static void check(const std::string& phase) {
    if (requested())
      throw Interrupted(fmt::format("interrupted during {}: nothing was saved or changed", phase));
  }

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
      "ring.slots",      "student.device",         "train.export",
      "dist.backend",    "dist.timeout_s",         "pipeline.stall_timeout_s"};
  if (key.starts_with("cores.")) return false;
  return std::none_of(std::begin(free_keys), std::end(free_keys),
                      [&](const char* k) { return key == k; });
}

json trajectory_keys(const Config& config) {
  json out = json::object();
  for (const auto& key : config.schema())
    if (shapes_trajectory(key.name)) out[key.name] = config.text(key.name);
  return out;
}

// The trained state's digest (parameters, buffers, optimizer): equal digests, equal runs.
std::uint64_t digest_of(const std::vector<float>& state) {
  return fnv1a(std::as_bytes(std::span(state.data(), state.size())));
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
  double loss = 0, kd = 0, ce = 0, feature = 0;
  std::int64_t correct = 0, samples = 0, steps = 0;
  Clock::time_point start = Clock::now();
  std::uint64_t wait_ns = 0, teacher_ns = 0;
};

std::string host_name() {
  std::array<char, 256> name{};
  if (::gethostname(name.data(), name.size() - 1) != 0) return "unknown";
  return name.data();
}

std::vector<std::byte> text_bytes(const std::string& text) {
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return {p, p + text.size()};
}

// One training run. The constructor resolves it; train_command calls the phases in order. Under
// torchrun every rank runs it: each trains on its shard of every batch, the gradients averaged
// over the ranks; rank 0 alone writes the run folder.
class TrainRun {
public:
  explicit TrainRun(const TrainArgs& args);
  ~TrainRun();
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  // The student thread pinned, the pipeline and the student assembled, the checkpoint restored (a
  // bad one fails here, before anything in the run folder changes), the folder's files opened,
  // the teacher's own test accuracy measured.
  void start();
  // From the resume point to the end (or a stop signal): steps, metrics lines, evaluations at
  // epoch ends, checkpoints.
  void step_loop();
  // The last evaluation, summary.json; Interrupted (exit 130) after a signal.
  int finish();

private:
  void restore_checkpoint();
  void resume(std::span<const std::byte> checkpoint, const std::string& name);
  // Sums over the ranks, in place (one process: nothing to do).
  void job_sum(std::span<double> values, const std::string& what);
  // This rank's part of the test split, at most kEvalChunk samples at a time: their normalized
  // images (no augmentation; decoded on the loaders' CPUs, idle meanwhile), labels and first
  // index. Memory for one chunk, whatever the split.
  void for_test_chunks(const std::function<void(std::span<const float>,
                                                std::span<const std::int64_t>, std::size_t)>& fn);
  // This rank's part [first, last) of `n` items (the whole with one process).
  [[nodiscard]] std::pair<std::size_t, std::size_t> shard(std::size_t n) const;
  void start_kd_ctl();
  // kd.cache: whether it holds every sample this rank is dealt an epoch, so that the loaders may
  // take the teacher's CPUs too (CpuPipeline::share_teacher_cpus).
  [[nodiscard]] bool cache_holds_an_epoch() const;
  // Starts that move on its own thread (it waits for the loaders to drain, which needs the
  // student to go on) from `batch`, the next the student takes; joined by step_loop.
  void share_cached_teacher_cpus(std::uint64_t batch);
  // The student's step on the run's batch `batch` (ring batch `ring_batch`); what it throws
  // names the student and the batch.
  std::optional<student::StepStats> student_step(std::uint64_t batch, std::uint64_t ring_batch);
  // `last`: the final evaluation, which one process leaves at a stop signal (the run's last
  // checkpoint is saved by then).
  void evaluate(double epoch, bool last = false);
  void save(std::uint64_t next_batch);
  // kd.cache = disk: writes the teacher's outputs kept so far to run.cache_file when some were
  // added since they were read or last written (at epoch ends and the run's last step). A write
  // that fails is a warning: the run goes on, the previous file whole.
  void save_teacher_cache();
  [[nodiscard]] std::string run_state(std::uint64_t next_batch) const;
  void write_metrics(const json& line);
  // The teacher replicas' working time so far: their bodies' time less their waits on the ring
  // for a loaded slot (as bench-overlap and kd-ctl count it).
  [[nodiscard]] std::uint64_t teacher_work_ns();
  // summary.json's teacher_cache: what kd.cache kept and served (null without a cache).
  [[nodiscard]] json cache_summary();
  [[nodiscard]] double wall_s() const {
    return previous_wall_s_ + std::chrono::duration<double>(Clock::now() - started_).count();
  }

  const Clock::time_point started_ = Clock::now();
  const Config config_;
  const DistEnv dist_;                           // one rank without torchrun
  std::unique_ptr<student::ProcessGroup> group_; // two ranks or more
  const bool writer_;                            // rank 0 writes the run folder
  RunFolder folder_;
  const std::optional<fs::path> resume_from_; // rank 0's decision
  RunInputs run_;
  const Sampler sampler_;
  const std::uint64_t per_epoch_, epochs_, last_; // last: the run's end (epochs or max_steps)
  const std::uint32_t slots_;
  const std::string export_format_; // train.export resolved: onnx, torchscript or off
  student::TrainerOptions options_;
  Assembled parts_;
  // The assembled parts, once start() built them.
  [[nodiscard]] student::Trainer& trainer() { return *parts_.trainer; }
  [[nodiscard]] CpuPipeline& pipeline() { return *parts_.pipeline; }

  std::unique_ptr<KdCtl> kd_ctl_; // after folder_: it writes metrics lines until it stops
  // While the steps run; it outlives the pipeline's stop in ~TrainRun (a stage that ignores the
  // failed ring still ends the process).
  std::unique_ptr<StallWatchdog> watchdog_;
  std::optional<std::string> elastic_off_ = "cores.elastic = false";

  std::uint64_t next_batch_ = 0;
  double best_accuracy_ = 0, test_accuracy_ = 0;
  std::optional<double> teacher_accuracy_;
  json teachers_ = nullptr; // several teachers: each one's model, weight and test accuracy alone
  json evaluations_ = json::array();
  double previous_wall_s_ = 0;
  double eval_s_ = 0, save_s_ = 0; // time outside the steps, for the steady-state rate
  std::size_t cache_saved_ = 0;    // kd.cache = disk: samples in the file as read or last written
  std::size_t cache_read_ = 0;     // kd.cache = disk: samples read from the file at start
  std::optional<std::uint64_t> shared_from_; // the batch from which the loaders shared the
                                             // teacher's CPUs (kd.cache)
  std::thread sharing_;                      // share_cached_teacher_cpus' move
  Clock::time_point loop_start_{}; // the step loop's start: its clock runs to the last evaluation
  std::uint64_t samples_ = 0;      // the job's
  std::uint64_t rank_samples_ = 0; // this rank's
  std::uint64_t stall_ns_ = 0;
  bool interrupted_ = false;
};

TrainRun::TrainRun(const TrainArgs& args)
    : config_(resolve_config(args.config, args.sets, args.cores)),
      dist_(dist_env().value_or(DistEnv{})), group_(join_job(config_, dist_)),
      writer_(dist_.rank == 0), folder_(args.out, args.config),
      resume_from_(agreed(group_.get(),
                          [&] {
                            return writer_ ? folder_.checkpoint_to_resume(args.resume)
                                           : std::optional<fs::path>();
                          })),
      run_(agreed(group_.get(),
                  [&] {
                    RunInputs run = prepare_run(config_, dist_, {.cache = true});
                    StopSignals::check("start-up");
                    return run;
                  })),
      sampler_(run_.train.size(), run_.sampler), per_epoch_(sampler_.batches_per_epoch()),
      epochs_(static_cast<std::uint64_t>(config_.get_int("train.epochs"))), last_([&] {
        const auto max_steps = static_cast<std::uint64_t>(config_.get_int("train.max_steps"));
        return max_steps > 0 ? std::min(epochs_ * per_epoch_, max_steps) : epochs_ * per_epoch_;
      }()),
      slots_(static_cast<std::uint32_t>(config_.get_int("ring.slots"))),
      export_format_(export_format(config_, config_.get_string("train.export"), "train.export")) {}

TrainRun::~TrainRun() {
  // kd-ctl may be in a move, which waits for the stages to drain: stop the pipeline first.
  if (parts_.pipeline) parts_.pipeline->stop();
}

void TrainRun::start() {
  // The student thread: pinned before torch starts its own threads (they inherit the binding).
  affinity::pin_this_thread(run_.topology, run_.plan.student, "kd-student");
  options_ = trainer_options(run_, static_cast<std::int64_t>(epochs_ * per_epoch_));
  options_.group = group_.get();
  parts_ = assemble(run_, sampler_, slots_, options_, StudentLogits::teacher);
  restore_checkpoint();
  if (run_.cache) cache_saved_ = cache_read_ = run_.cache->stored(); // read from kd.cache's file
  agreed(group_.get(), [] {
    StopSignals::check("start-up");
    return 0;
  });

  // Temporaries of a writer killed mid-write (SIGKILL, a second signal) go.
  if (writer_) folder_.open(config_.to_toml(), resume_from_.has_value());

  const std::vector<RunTeacher>& teachers = run_.teachers;
  if (run_.teacher_runs() && !teacher_accuracy_) {
    // The target's hits (the teachers' mix, with several), then each teacher's.
    std::vector<double> hits(teachers.size() > 1 ? teachers.size() + 1 : 1, 0.0);
    for_test_chunks([&](std::span<const float> images, std::span<const std::int64_t> labels,
                        std::size_t first) {
      const auto got =
          teacher_test_hits(run_, images, first, labels.size(), *pipeline().teacher_arena(0));
      for (std::size_t k = 0; k < hits.size(); ++k) hits[k] += static_cast<double>(got[k]);
    });
    job_sum(hits, "the teacher's evaluation");
    const auto test = static_cast<double>(run_.test.size());
    teacher_accuracy_ = hits[0] / test;
    if (teachers.size() == 1) {
      log_info(fmt::format("teacher {}: test accuracy {:.4f} ({} precision, {} replica(s))",
                           teachers[0].spec.path, *teacher_accuracy_,
                           teacher::precision_name(teachers[0].spec.precision),
                           pipeline().replicas()));
    } else {
      teachers_ = json::array();
      for (std::size_t t = 0; t < teachers.size(); ++t) {
        const std::string& model = teachers[t].spec.path;
        const double weight = std::exp(run_.mix->log_weights()[t]);
        teachers_.push_back({{"model", model},
                             {"precision", teacher::precision_name(teachers[t].model->precision())},
                             {"weight", weight},
                             {"test_accuracy", hits[1 + t] / test}});
        log_info(fmt::format("teacher {} ({}): test accuracy {:.4f} alone, weight {:.3g}", t, model,
                             hits[1 + t] / test, weight));
      }
      log_info(fmt::format("the {} teachers' mix at kd.temperature {:g} (the target): test "
                           "accuracy {:.4f}; {} replica(s) in all",
                           teachers.size(), run_.mix->temperature(), *teacher_accuracy_,
                           pipeline().replicas()));
    }
  }
  const std::string job =
      group_ ? fmt::format(", rank {} of {} ({}; global batch {})", dist_.rank, dist_.world,
                           group_->backend(), run_.sampler.batch_size * dist_.world)
             : std::string();
  log_info(
      fmt::format("student {} ({} parameters) on {}, {}; {} steps of batch {} ({} per epoch){}",
                  options_.model.arch, trainer().parameters(), trainer().device(),
                  trainer().precision(), last_, run_.sampler.batch_size, per_epoch_, job));
}

void TrainRun::job_sum(std::span<double> values, const std::string& what) {
  if (group_) group_->sum(values, what);
}

void TrainRun::for_test_chunks(
    const std::function<void(std::span<const float>, std::span<const std::int64_t>, std::size_t)>&
        fn) {
  const auto [first, last] = shard(run_.test.size());
  std::vector<std::int64_t> labels;
  std::vector<float> images;
  for (std::size_t i = first; i < last; i += kEvalChunk) {
    const std::size_t n = std::min(kEvalChunk, last - i);
    evaluation_images(run_, pipeline().assignment().loader, i, n, images);
    labels.resize(n);
    for (std::size_t k = 0; k < n; ++k) labels[k] = run_.test.label(i + k);
    fn(images, labels, i);
  }
}

std::pair<std::size_t, std::size_t> TrainRun::shard(std::size_t n) const {
  const auto r = static_cast<std::size_t>(dist_.rank), w = static_cast<std::size_t>(dist_.world);
  return {n * r / w, n * (r + 1) / w};
}

void TrainRun::restore_checkpoint() {
  if (!group_) {
    if (resume_from_)
      resume(read_checked_file(*resume_from_, "checkpoint"), resume_from_->string());
    return;
  }
  // Rank 0 reads the checkpoint it chose and sends it: the other ranks need no shared folder.
  std::vector<std::byte> payload;
  agreed(group_.get(), [&] {
    if (writer_ && resume_from_) payload = read_checked_file(*resume_from_, "checkpoint");
    return 0;
  });
  payload = group_->broadcast(std::move(payload), "sending rank 0's checkpoint");
  const std::vector<std::byte> name = group_->broadcast(
      text_bytes(resume_from_ ? resume_from_->string() : std::string()), "sending its name");
  if (!payload.empty())
    resume(payload, std::string(reinterpret_cast<const char*>(name.data()), name.size()));
}

void TrainRun::resume(std::span<const std::byte> checkpoint, const std::string& from) {
  try {
    const json state = json::parse(trainer().load(checkpoint, from));
    const int world = state.value("world_size", 1);
    if (world != dist_.world)
      throw InputError(fmt::format(
          "checkpoint {} was written by a job of {} rank(s); this job has {} (each rank trains "
          "on its shard of every batch: resume with {} rank(s), or start a new --out)",
          from, world, dist_.world, world));
    const json written = state.value("config", json::object());
    const json expected = trajectory_keys(config_);
    for (const auto& [key, value] : expected.items()) {
      const std::string was = written.value(key, std::string("<absent>"));
      if (was != value)
        throw InputError(fmt::format(
            "checkpoint {} was written with {} = {}; this run has {} (resume with the same "
            "settings, or start a new --out)",
            from, key, was, value.get<std::string>()));
    }
    next_batch_ = state.at("next_batch").get<std::uint64_t>();
    best_accuracy_ = state.value("best_test_accuracy", 0.0);
    test_accuracy_ = state.value("test_accuracy", 0.0);
    evaluations_ = state.value("evaluations", json::array());
    previous_wall_s_ = state.value("wall_s", 0.0);
    if (const auto t = state.value("teacher_test_accuracy", json()); t.is_number())
      teacher_accuracy_ = t.get<double>();
    teachers_ = state.value("teachers", json());
  } catch (const json::exception& e) {
    throw InputError(
        fmt::format("checkpoint {}: its run state is unreadable ({})", from, e.what()));
  }
  if (next_batch_ > last_)
    throw InputError(fmt::format("checkpoint {} is at batch {}, past this run's end ({}): raise "
                                 "train.epochs or train.max_steps to continue it",
                                 from, next_batch_, last_));
  log_info(fmt::format("resuming from {}: step {}, batch {} of {}", from, trainer().steps_done(),
                       next_batch_, last_));
}

void TrainRun::write_metrics(const json& line) {
  if (writer_) folder_.write_metrics(line);
}

std::string TrainRun::run_state(std::uint64_t next_batch) const {
  return json{
      {"next_batch", next_batch},
      {"config", trajectory_keys(config_)},
      {"best_test_accuracy", best_accuracy_},
      {"test_accuracy", test_accuracy_},
      {"teacher_test_accuracy", teacher_accuracy_ ? json(*teacher_accuracy_) : json(nullptr)},
      {"teachers", teachers_},
      {"evaluations", evaluations_},
      {"world_size", dist_.world},
      {"wall_s", wall_s()}}
      .dump();
}

void TrainRun::save(std::uint64_t next_batch) {
  if (!writer_) return; // every rank holds the same state: rank 0's checkpoint is the job's
  const auto t0 = Clock::now();
  folder_.save_checkpoint(
      trainer().steps_done(),
      [&](const fs::path& file) { trainer().save(file, run_state(next_batch)); },
      static_cast<std::size_t>(config_.get_int("train.keep_checkpoints")));
  save_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void TrainRun::save_teacher_cache() {
  // Every rank keeps its own file (its shard's outputs; prepare_teacher_cache names it).
  if (run_.cache_file.empty()) return;
  const TeacherOutputCache& cache = *run_.cache;
  const std::size_t kept = cache.stored();
  if (kept == cache_saved_) return;
  const auto t0 = Clock::now();
  try {
    cache.save(run_.cache_file, run_.cache_key);
    cache_saved_ = kept;
    log_info(
        fmt::format("kd.cache = disk: the teacher's outputs for {} of {} samples written to {}",
                    kept, cache.samples(), run_.cache_file.string()));
  } catch (const std::exception& e) {
    log_warn(fmt::format("kd.cache = disk: {}: the run goes on, the outputs not kept for later "
                         "runs",
                         e.what()));
  }
  save_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

void TrainRun::evaluate(double epoch, bool last) {
  const auto t0 = Clock::now();
  // Each rank its part of the test split, a chunk at a time; the hits summed over the ranks.
  std::array<double, 1> hits{0};
  for_test_chunks(
      [&](std::span<const float> images, std::span<const std::int64_t> labels, std::size_t) {
        if (last && !group_ && StopSignals::requested())
          throw Interrupted(fmt::format("interrupted during the final evaluation, after step {}: "
                                        "its checkpoint is saved in {}",
                                        trainer().steps_done(), folder_.checkpoints().string()));
        hits[0] += static_cast<double>(trainer().correct(images, labels));
      });
  job_sum(hits, "the student's evaluation");
  test_accuracy_ = hits[0] / static_cast<double>(std::max<std::size_t>(1, run_.test.size()));
  best_accuracy_ = std::max(best_accuracy_, test_accuracy_);
  evaluations_.push_back(
      {{"epoch", epoch}, {"step", trainer().steps_done()}, {"test_accuracy", test_accuracy_}});
  eval_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
}

std::optional<student::StepStats> TrainRun::student_step(std::uint64_t batch,
                                                         std::uint64_t ring_batch) {
  try {
    fault::at(fault::Site::student, batch, pipeline().ring());
    return trainer().step(ring_batch, StopSignals::requested());
  } catch (const StageError&) {
    throw; // a stage before the student failed (or stalled): it is named already
  } catch (const InputError&) {
    throw;
  } catch (const Interrupted&) {
    throw;
  } catch (const student::RankLost&) {
    throw; // names the lost ranks
  } catch (const std::exception& e) {
    std::throw_with_nested(StageError("student", batch, e.what()));
  }
}

void TrainRun::start_kd_ctl() {
  if (!config_.get_bool("cores.elastic")) return;
  elastic_off_ = KdCtl::why_not(pipeline());
  if (elastic_off_) {
    log_info(fmt::format("kd-ctl off: {}", *elastic_off_));
    return;
  }
  ElasticSettings elastic;
  elastic.policy.margin = config_.get_double("cores.elastic_margin");
  elastic.window_s = config_.get_double("cores.elastic_window_s");
  elastic.on_move = [this](const json& record) { write_metrics(record); };
  kd_ctl_ = std::make_unique<KdCtl>(pipeline(), std::move(elastic));
}

bool TrainRun::cache_holds_an_epoch() const {
  const TeacherOutputCache* cache = run_.cache.get();
  if (cache == nullptr) return false;
  const std::size_t dealt =
      std::min<std::size_t>(per_epoch_ * run_.sampler.batch_size,
                            run_.train.size() / static_cast<std::size_t>(dist_.world));
  return cache->stored() >= dealt;
}

void TrainRun::share_cached_teacher_cpus(std::uint64_t batch) {
  if (sharing_.joinable() || pipeline().shared() || !cache_holds_an_epoch()) return;
  sharing_ = std::thread([this, batch] {
    try {
      affinity::pin_this_thread(run_.topology, run_.plan.student, "kd-share");
      if (!pipeline().share_teacher_cpus()) return;
    } catch (...) {
      // The loaders may be gone: the run ends with the failure, which the student then reports.
      pipeline().ring().fail("loader", std::current_exception());
      return;
    }
    shared_from_ = batch; // read after the join
    log_info(fmt::format("kd.cache holds every sample: the loaders run on the teacher's CPUs too "
                         "from about batch {} (loaders {}; the teacher copies what is kept){}",
                         batch, affinity::format_cpus(pipeline().assignment().loader),
                         kd_ctl_ ? "; kd-ctl moves no more" : ""));
  });
}

void TrainRun::step_loop() {
  const auto every = static_cast<std::uint64_t>(config_.get_int("train.checkpoint_every"));
  const auto log_every = static_cast<std::uint64_t>(config_.get_int("train.log_every"));
  // The pipeline runs from the resume point to the end.
  Progress progress(writer_ && ::isatty(STDERR_FILENO) == 1);
  loop_start_ = Clock::now();
  const std::uint64_t begin = next_batch_;
  // A cache that holds an epoch already (read from its file): the loaders start on the teacher's
  // CPUs too.
  const bool share = cache_holds_an_epoch();
  pipeline().start(begin, last_ - begin, {.cache = true, .share_teacher_cpus = share});
  // A sharing move in progress ends once the ring is closed, however the loop ends.
  struct JoinSharing {
    TrainRun& run;
    ~JoinSharing() {
      if (!run.sharing_.joinable()) return;
      run.pipeline().ring().close();
      run.sharing_.join();
    }
  } join_sharing{*this};
  if (share && pipeline().shared()) {
    shared_from_ = begin;
    log_info(fmt::format("kd.cache holds every sample: the loaders run on the teacher's CPUs too "
                         "(loaders {}; the teacher copies what is kept)",
                         affinity::format_cpus(pipeline().assignment().loader)));
  }
  if (const double limit = config_.get_double("pipeline.stall_timeout_s"); limit > 0)
    watchdog_ = std::make_unique<StallWatchdog>(
        pipeline().ring(), begin, limit, "pipeline.stall_timeout_s",
        [this] { affinity::pin_this_thread(run_.topology, run_.plan.student, "kd-watchdog"); });
  start_kd_ctl();
  Interval interval;
  const RingStats ring_before = pipeline().ring().stats();
  std::uint64_t last_wait_ns = ring_before.stages[2].wait_ns;
  std::uint64_t last_teacher_ns = 0;
  for (std::uint64_t b = begin; b < last_; ++b) {
    if (watchdog_) watchdog_->expect(b);
    const auto stats = student_step(b, b - begin);
    if (watchdog_) watchdog_->idle();
    if (!stats) break;
    samples_ += stats->samples;
    rank_samples_ += stats->rank_samples;
    interval.loss += stats->loss * stats->samples;
    interval.kd += stats->kd_loss * stats->samples;
    interval.ce += stats->ce_loss * stats->samples;
    interval.feature += stats->feature_loss * stats->samples;
    interval.correct += stats->correct;
    interval.samples += stats->samples;
    ++interval.steps;
    const std::uint64_t epoch = b / per_epoch_;
    const bool epoch_end = (b + 1) % per_epoch_ == 0;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - loop_start_).count();
    const double rate = static_cast<double>(samples_) / std::max(1e-9, elapsed);
    const RingStats ring = pipeline().ring().stats();
    if ((b + 1) % log_every == 0 || epoch_end || b + 1 == last_) {
      const double span = std::chrono::duration<double>(now - interval.start).count();
      const std::uint64_t wait_ns = ring.stages[2].wait_ns, teacher_ns = teacher_work_ns();
      const double replicas = static_cast<double>(std::max<std::size_t>(1, pipeline().replicas()));
      const double n = static_cast<double>(std::max<std::int64_t>(1, interval.samples));
      const json line = {
          {"step", trainer().steps_done()},
          {"epoch", epoch},
          {"loss", interval.loss / n},
          {"kd_loss", interval.kd / n},
          {"ce_loss", interval.ce / n},
          {"feature_loss", interval.feature / n}, // kd.features' weighted sum (0 without)
          {"train_accuracy", static_cast<double>(interval.correct) / n},
          {"lr", stats->lr},
          {"samples_per_s", static_cast<double>(interval.samples) / std::max(1e-9, span)},
          {"student_wait_ms", static_cast<double>(wait_ns - last_wait_ns) / 1e6},
          {"teacher_busy", run_.teacher_runs() ? static_cast<double>(teacher_ns - last_teacher_ns) /
                                                     (span * 1e9 * replicas)
                                               : 0.0},
          {"ring_ready", ring.occupancy[static_cast<int>(SlotState::ready)]},
          {"skipped_steps", trainer().skipped_steps()},
          // Teacher batches read from kd.cache so far (null without a cache).
          {"teacher_cached_batches",
           pipeline().cache() ? json(pipeline().cached_batches()) : json(nullptr)}};
      write_metrics(line);
      if (writer_ && !progress.terminal())
        log_info(fmt::format("step {}/{} epoch {} loss {:.4f} lr {:.4f} {:.0f} samples/s",
                             trainer().steps_done(), last_, epoch + 1, line["loss"].get<double>(),
                             stats->lr, line["samples_per_s"].get<double>()));
      last_wait_ns = wait_ns;
      last_teacher_ns = teacher_ns;
      interval = Interval{};
    }
    if (progress.due())
      progress.show(fmt::format(
          "epoch {}/{} step {}/{} loss {:.4f} acc {:.1f}% {:.0f} samples/s ETA {} ring {}/{}",
          epoch + 1, epochs_, b + 1, last_, stats->loss,
          100.0 * static_cast<double>(stats->correct) / std::max<std::uint32_t>(1, stats->samples),
          rate,
          clock_text(static_cast<double>(last_ - b - 1) *
                     (elapsed / static_cast<double>(b + 1 - begin))),
          ring.occupancy[static_cast<int>(SlotState::ready)], slots_));
    if (epoch_end) {
      evaluate(static_cast<double>(epoch + 1));
      if (writer_)
        progress.line(fmt::format("epoch {}/{}: test accuracy {:.4f}{} ({:.0f} samples/s)",
                                  epoch + 1, epochs_, test_accuracy_,
                                  teacher_accuracy_
                                      ? fmt::format(" (teacher {:.4f})", *teacher_accuracy_)
                                      : std::string(),
                                  rate));
    }
    if (stats->stop) { // asked of this process, or (several ranks) of any rank
      interrupted_ = true;
      save(b + 1);
      save_teacher_cache();
      break;
    }
    if (epoch_end ||
        (every > 0 && trainer().steps_done() % static_cast<std::int64_t>(every) == 0) ||
        b + 1 == last_)
      save(b + 1);
    if (epoch_end || b + 1 == last_) save_teacher_cache();
    if (epoch_end) share_cached_teacher_cpus(b + 1);
    // An interval's samples/s is the steps': an evaluation or a checkpoint just after its start
    // is left out.
    if (interval.steps == 0) interval.start = Clock::now();
  }
  pipeline().stop();
  if (sharing_.joinable()) sharing_.join(); // the closed ring ends a move in progress
  trainer().drain();
  progress.finish();
  pipeline().ring().rethrow_if_failed();
  stall_ns_ = pipeline().ring().stats().stages[2].wait_ns - ring_before.stages[2].wait_ns;
}
std::uint64_t TrainRun::teacher_work_ns() {
  const std::uint64_t busy = pipeline().teacher_totals().busy_ns.load();
  const std::uint64_t wait =
      pipeline().ring().stats().stages[static_cast<int>(RingStage::teacher)].wait_ns;
  return busy > wait ? busy - wait : 0;
}

json TrainRun::cache_summary() {
  const TeacherOutputCache* cache = run_.teacher_runs() ? pipeline().cache() : nullptr;
  if (!cache) return nullptr;
  return {
      {"mode", config_.get_string("kd.cache")},
      {"file", run_.cache_file.empty() ? json(nullptr) : json(run_.cache_file.string())},
      {"samples_read_from_file", cache_read_},
      {"top_k", cache->full() ? 0 : cache->kept()},
      {"samples", cache->samples()},
      {"samples_kept", cache->stored()},
      {"bytes", cache->bytes()},
      {"batches_from_cache", pipeline().cached_batches()},
      {"loaders_on_teacher_cpus_from_batch", shared_from_ ? json(*shared_from_) : json(nullptr)},
      {"loader_cpus", pipeline().assignment().loader}};
}

int TrainRun::finish() {
  // A stop asked for after the last step (agreed by the ranks): its checkpoint is saved; the
  // final evaluation and the export are left out.
  std::array<double, 1> stop{StopSignals::requested() ? 1.0 : 0.0};
  job_sum(stop, "agreeing on a stop");
  interrupted_ = interrupted_ || stop[0] > 0;
  const bool finished_epoch = last_ % per_epoch_ == 0;
  if (!interrupted_ && !finished_epoch)
    evaluate(static_cast<double>(last_) / static_cast<double>(per_epoch_), true);
  // The loop's time includes every evaluation and save (the last evaluation too), which the rate
  // below leaves out.
  const RunMeasures measured{std::chrono::duration<double>(Clock::now() - loop_start_).count(),
                             eval_s_,
                             save_s_,
                             samples_,
                             rank_samples_,
                             stall_ns_,
                             run_.teacher_runs() ? teacher_work_ns() : 0,
                             run_.teacher_runs() ? pipeline().replicas() : 0};
  const RunFigures figures = figures_of(measured);
  // The trained student, in the form people deploy, checked against the student.
  json exported = nullptr;
  std::optional<ExportCheck> check;
  if (writer_ && !interrupted_ && export_format_ != "off") {
    const fs::path file = folder_.export_file(export_format_);
    AugmentConfig eval = run_.augment;
    eval.augment = false;
    const std::size_t n = std::min(kExportCheckSamples, run_.test.size());
    check = export_student(trainer(), options_, export_format_, file,
                           normalized_images(run_.test, eval, 0, n));
    exported = {
        {"file", file.filename().string()}, {"format", export_format_}, {"check", to_json(*check)}};
    log_info(fmt::format("student exported: {} ({}), checked on {} test images with {}: max "
                         "normalized error {:.2e}, top-1 agreement {:.4f}",
                         file.string(), export_format_, check->samples, check->runner,
                         check->max_normalized_error, check->top1_agreement));
  }
  // Every rank's own figures, in rank 0's summary.
  const std::string state_digest = fmt::format("{:016x}", digest_of(trainer().state_vector()));
  const json mine = {{"rank", dist_.rank},
                     {"local_rank", dist_.local_rank},
                     {"node", dist_.node},
                     {"host", host_name()},
                     {"device", trainer().device()},
                     {"samples_per_s", figures.rank_samples_per_s},
                     {"student_stall_fraction", figures.stall_fraction},
                     {"teacher_busy_fraction", figures.teacher_busy_fraction},
                     {"plan", affinity::to_json(run_.plan)},
                     {"state_digest", state_digest}};
  json ranks = json::array({mine});
  if (group_) {
    ranks = json::array();
    for (const auto& text : group_->all_gather(mine.dump(), "gathering the ranks' figures"))
      ranks.push_back(json::parse(text));
  }
  if (!writer_) {
    if (interrupted_)
      throw Interrupted(fmt::format("rank {} interrupted at step {}: rank 0 saved the checkpoint",
                                    dist_.rank, trainer().steps_done()));
    return kExitOk;
  }
  json summary = {
      {"test_accuracy", test_accuracy_},
      {"best_test_accuracy", best_accuracy_},
      {"teacher_test_accuracy", teacher_accuracy_ ? json(*teacher_accuracy_) : json(nullptr)},
      {"epochs", static_cast<double>(trainer().steps_done()) / static_cast<double>(per_epoch_)},
      {"steps", trainer().steps_done()},
      {"wall_s", wall_s()},
      {"train_loop_s", measured.loop_s},
      {"evaluation_s", measured.eval_s},
      {"checkpoint_s", measured.save_s},
      // Training throughput: the steps' time, evaluations and checkpoint writes left out.
      {"samples_per_s", figures.samples_per_s},
      {"student_stall_fraction", figures.stall_fraction},
      {"teacher_busy_fraction", figures.teacher_busy_fraction},
      {"device", trainer().device()},
      {"precision", trainer().precision()},
      {"student",
       {{"arch", options_.model.arch},
        {"path", options_.model.path.empty() ? json(nullptr) : json(options_.model.path)},
        {"width", options_.model.width},
        {"parameters", trainer().parameters()}}},
      {"export", exported},
      {"teacher", run_.teacher_runs() ? json(run_.teachers.front().spec.path) : json(nullptr)},
      // Several teachers: each alone (teacher_test_accuracy is their mixture's, the target).
      {"teachers", teachers_},
      {"teacher_cache", cache_summary()},
      {"plan", affinity::to_json(run_.plan)},
      {"elastic", elastic_off_ ? json{{"active", false}, {"reason", *elastic_off_}}
                               : json{{"active", true}, {"kd_ctl", kd_ctl_->summary()}}},
      {"ring",
       {{"slots", slots_},
        {"slot_bytes", pipeline().ring().layout().slot_bytes()},
        {"memory", memory_kind_name(pipeline().ring().memory_kind())}}},
      {"skipped_steps", trainer().skipped_steps()},
      {"interrupted", interrupted_},
      {"evaluations", evaluations_},
      {"world_size", dist_.world},
      {"batch_size", run_.sampler.batch_size},
      {"global_batch_size", run_.sampler.batch_size * static_cast<std::size_t>(dist_.world)},
      {"dist",
       group_
           ? json{{"backend", group_->backend()},
                  {"timeout_s", group_->options().timeout_s},
                  {"bucket_mb", group_->options().bucket_mb},
                  {"buckets", trainer().bucket_stats()->buckets},
                  {"buckets_launched_in_backward", trainer().bucket_stats()->launched_in_backward},
                  {"buckets_launched_after_backward",
                   trainer().bucket_stats()->launched_after_backward},
                  {"batchnorm", "each rank's batch statistics; running statistics rank 0's "
                                "(broadcast after every step)"}}
           : json(nullptr)},
      {"ranks", ranks},
      {"state_digest", state_digest}};
  folder_.write_summary(summary);
  if (check && !check->ok)
    throw std::runtime_error(fmt::format(
        "the exported student does not give the student's logits (max normalized error {:.2e}, "
        "top-1 agreement {:.4f} on {} test images); see summary.json",
        check->max_normalized_error, check->top1_agreement, check->samples));
  if (interrupted_)
    throw Interrupted(fmt::format("interrupted at step {}: checkpoint saved in {}; continue with "
                                  "--resume auto --out {}",
                                  trainer().steps_done(), folder_.checkpoints().string(),
                                  folder_.path().string()));
  log_info(fmt::format("done: {} steps, test accuracy {:.4f} (best {:.4f}), {:.0f} samples/s; "
                       "run folder {}",
                       trainer().steps_done(), test_accuracy_, best_accuracy_,
                       summary["samples_per_s"].get<double>(), folder_.path().string()));
  return kExitOk;
}

} // namespace

int train_command(const TrainArgs& args) {
  // SIGINT/SIGTERM from the start: in start-up they end the run (exit 130, nothing written), in
  // the steps they stop it after a checkpoint, after the last step they skip what is left.
  StopSignals signals;
  TrainRun run(args); // resolve
  run.start();
  run.step_loop();
  return run.finish();
}

} // namespace kdflow::app
