// The training run, as its phases: open the session (resolve, join, prepare), start (with resume),
// the step loop (evaluations and checkpoints inside it), finish. The main thread is the student
// (pinned as kd-student); the loader and teacher stages run as flow graphs in their pinned arenas
// (pipeline.hpp). The run folder (run_folder.hpp) holds the resolved config, metrics.jsonl,
// summary.json and atomic checkpoints; SIGINT/SIGTERM finish the step, save and exit 130
// (stop_signals.hpp).
#include "train.hpp"

#include "evaluation.hpp"
#include "export.hpp"
#include "kd_ctl.hpp"
#include "pipeline.hpp"
#include "run.hpp"
#include "run_cache.hpp"
#include "run_folder.hpp"
#include "run_report.hpp"
#include "run_state.hpp"
#include "session.hpp"
#include "stop_signals.hpp"
#include "train_log.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/fault_hooks.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/watchdog.hpp"
#include "kdflow/gpu_student/trainer.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::vector<std::byte> text_bytes(const std::string& text) {
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return {p, p + text.size()};
}

// One training run. The constructor opens it (the session, the run folder's checks, the
// checkpoint to resume); train_command calls the phases in order. Under torchrun every rank runs
// it: each trains on its shard of every batch, the gradients averaged over the ranks; rank 0
// alone writes the run folder.
class TrainRun {
public:
  explicit TrainRun(const TrainArgs& args);
  ~TrainRun();
  TrainRun(const TrainRun&) = delete;
  TrainRun& operator=(const TrainRun&) = delete;

  // The pipeline and the student assembled, the checkpoint restored (a bad one fails here, before
  // anything in the run folder changes), the folder's files opened, the teachers' own test
  // accuracy measured.
  void start();
  // From the resume point to the end (or a stop signal): steps, metrics lines, evaluations at
  // epoch ends, checkpoints.
  void step_loop();
  // The last evaluation, the export, summary.json; Interrupted (exit 130) after a signal.
  int finish();

private:
  void restore_checkpoint();
  // Sums over the ranks, in place (one process: nothing to do).
  void job_sum(std::span<double> values, const std::string& what);
  void start_kd_ctl();
  // The pipeline started from the resume point, the watchdog and kd-ctl with it.
  void start_steps(std::uint64_t begin);
  // The student's step on the run's batch `batch` (ring batch `ring_batch`); what it throws
  // names the student and the batch.
  std::optional<student::StepStats> student_step(std::uint64_t batch, std::uint64_t ring_batch);
  // Checkpoint, cache file and the loaders' move after batch `b`; false at a stop.
  bool after_batch(std::uint64_t b, const student::StepStats& stats);
  // `last`: the final evaluation, which one process leaves at a stop signal (the run's last
  // checkpoint is saved by then).
  void evaluate(double epoch, bool last = false);
  void save(std::uint64_t next_batch);
  void save_teacher_cache();
  [[nodiscard]] double wall_s() const {
    return state_.wall_s + std::chrono::duration<double>(Clock::now() - started_).count();
  }
  [[nodiscard]] const RunInputs& run() const { return session_.run(); }
  [[nodiscard]] student::Trainer& trainer() { return *parts_.trainer; }
  [[nodiscard]] CpuPipeline& pipeline() { return *parts_.pipeline; }

  const Clock::time_point started_ = Clock::now();
  Session session_;
  const Config& config_;
  const bool writer_; // rank 0 writes the run folder
  RunFolder folder_;
  const std::optional<fs::path> resume_from_;           // rank 0's decision
  std::uint64_t per_epoch_ = 0, epochs_ = 0, last_ = 0; // last: the run's end (epochs, max_steps)
  const std::string export_format_; // train.export resolved: onnx, torchscript or off
  student::TrainerOptions options_;
  Assembled parts_;
  std::unique_ptr<RunCache> cache_;
  std::unique_ptr<KdCtl> kd_ctl_; // after folder_: it writes metrics lines until it stops
  // While the steps run; it outlives the pipeline's stop in ~TrainRun (a stage that ignores the
  // failed ring still ends the process).
  std::unique_ptr<StallWatchdog> watchdog_;
  std::optional<std::string> elastic_off_ = "cores.elastic = false";

  RunState state_;
  RunMeasures measures_;           // this rank's loop; loop_s at finish
  Clock::time_point loop_start_{}; // the step loop's start: its clock runs to the last evaluation
  std::optional<TrainLog> log_;    // while the steps run
  bool interrupted_ = false;
};

TrainRun::TrainRun(const TrainArgs& args)
    : session_(args.config, args.sets, args.cores), config_(session_.config()),
      writer_(session_.writer()), folder_(args.out, args.config), resume_from_(session_.agreed([&] {
        return writer_ ? folder_.checkpoint_to_resume(args.resume) : std::optional<fs::path>();
      })),
      export_format_(export_format(config_, config_.get_string("train.export"), "train.export")) {
  if (args.on_metrics) folder_.set_metrics_listener(args.on_metrics);
  session_.prepare({.cache = true}, [] { StopSignals::check("start-up"); });
  per_epoch_ = session_.sampler().batches_per_epoch();
  epochs_ = static_cast<std::uint64_t>(config_.get_int("train.epochs"));
  const auto max_steps = static_cast<std::uint64_t>(config_.get_int("train.max_steps"));
  last_ = max_steps > 0 ? std::min(epochs_ * per_epoch_, max_steps) : epochs_ * per_epoch_;
}

TrainRun::~TrainRun() {
  // kd-ctl may be in a move, which waits for the stages to drain: stop the pipeline first.
  if (parts_.pipeline) parts_.pipeline->stop();
}

void TrainRun::start() {
  options_ = trainer_options(run(), static_cast<std::int64_t>(epochs_ * per_epoch_));
  options_.group = session_.group();
  parts_ = assemble(run(), session_.sampler(), session_.slots(), options_, StudentLogits::teacher);
  cache_ = std::make_unique<RunCache>(run(), pipeline(), per_epoch_);
  restore_checkpoint();
  session_.agreed([] {
    StopSignals::check("start-up");
    return 0;
  });
  // Temporaries of a writer killed mid-write (SIGKILL, a second signal) go.
  if (writer_) folder_.open(config_.to_toml(), resume_from_.has_value());
  bool measured_teacher = false; // now, rather than read from the checkpoint
  if (run().teacher_runs() && !state_.teacher_test_accuracy) {
    const TeacherAccuracy measured = measure_teachers(
        run(), pipeline().assignment().loader, pipeline().teacher(0).unit(0).arena(),
        pipeline().replicas(),
        [&](std::span<double> hits) { job_sum(hits, "the teacher's evaluation"); });
    state_.teacher_test_accuracy = measured.target;
    state_.teachers = measured.teachers;
    measured_teacher = true;
  }
  if (writer_ && config_.get_bool("train.tensorboard"))
    folder_.open_events(
        trainer().steps_done(),
        {{"config", "```toml\n" + config_.to_toml() + "```"},
         {"cores", "```\n" + affinity::format_plan(run().plan, run().topology) + "```"}});
  if (writer_ && measured_teacher)
    folder_.write_metrics({{"event", "eval"},
                           {"step", trainer().steps_done()},
                           {"wall_s", wall_s()},
                           {"teacher_test_accuracy", *state_.teacher_test_accuracy}});
  const DistEnv& dist = session_.dist();
  const std::string job =
      session_.group()
          ? fmt::format(", rank {} of {} ({}; global batch {})", dist.rank, dist.world,
                        session_.group()->backend(), run().sampler.batch_size * dist.world)
          : std::string();
  const double flops = trainer().flops_per_sample();
  const std::string stem = options_.model.arch == "torchscript"
                               ? std::string()
                               : fmt::format(", {} stem", student::resolve_stem(options_.model));
  const std::string cost =
      flops > 0 ? fmt::format(", {:.3g} GFLOPs per sample", flops / 1e9) : std::string();
  log_info(fmt::format("student {} ({} parameters{}{}) on {}, {}; {} steps of batch {} ({} per "
                       "epoch){}",
                       options_.model.arch, trainer().parameters(), stem, cost, trainer().device(),
                       trainer().precision(), last_, run().sampler.batch_size, per_epoch_, job));
}

void TrainRun::job_sum(std::span<double> values, const std::string& what) {
  if (session_.group()) session_.group()->sum(values, what);
}

void TrainRun::restore_checkpoint() {
  std::vector<std::byte> payload;
  std::string from = resume_from_ ? resume_from_->string() : std::string();
  session_.agreed([&] {
    if (writer_ && resume_from_) payload = read_checked_file(*resume_from_, "checkpoint");
    return 0;
  });
  // Several ranks: rank 0 reads the checkpoint it chose and sends it (no shared folder needed).
  if (student::ProcessGroup* group = session_.group()) {
    payload = group->broadcast(std::move(payload), "sending rank 0's checkpoint");
    const std::vector<std::byte> name = group->broadcast(text_bytes(from), "sending its name");
    from.assign(reinterpret_cast<const char*>(name.data()), name.size());
  }
  if (payload.empty()) return;
  state_ =
      RunState::read(trainer().load(payload, from), from, config_, session_.dist().world, last_);
  log_info(fmt::format("resuming from {}: step {}, batch {} of {}", from, trainer().steps_done(),
                       state_.next_batch, last_));
}

void TrainRun::save(std::uint64_t next_batch) {
  if (!writer_) return; // every rank holds the same state: rank 0's checkpoint is the job's
  const auto t0 = Clock::now();
  state_.next_batch = next_batch; // where the run is
  folder_.save_checkpoint(
      trainer().steps_done(),
      [&](const fs::path& file) {
        trainer().save(file, state_.text(config_, session_.dist().world, wall_s()));
      },
      static_cast<std::size_t>(config_.get_int("train.keep_checkpoints")));
  measures_.save_s += std::chrono::duration<double>(Clock::now() - t0).count();
}

void TrainRun::save_teacher_cache() {
  if (run().cache_file.empty()) return; // kd.cache = disk only
  const auto t0 = Clock::now();
  cache_->save();
  measures_.save_s += std::chrono::duration<double>(Clock::now() - t0).count();
}

void TrainRun::evaluate(double epoch, bool last) {
  const auto t0 = Clock::now();
  // Each rank its part of the test split, a chunk at a time; the hits summed over the ranks.
  std::array<double, 1> hits{0};
  for_test_chunks(
      run(), pipeline().assignment().loader,
      [&](std::span<const float> images, std::span<const std::int64_t> labels, std::size_t) {
        if (last && !session_.group() && StopSignals::requested())
          throw Interrupted(fmt::format("interrupted during the final evaluation, after step {}: "
                                        "its checkpoint is saved in {}",
                                        trainer().steps_done(), folder_.checkpoints().string()));
        hits[0] += static_cast<double>(trainer().correct(images, labels));
      });
  job_sum(hits, "the student's evaluation");
  state_.test_accuracy = hits[0] / static_cast<double>(std::max<std::size_t>(1, run().test.size()));
  state_.best_test_accuracy = std::max(state_.best_test_accuracy, state_.test_accuracy);
  state_.evaluations.push_back({{"epoch", epoch},
                                {"step", trainer().steps_done()},
                                {"test_accuracy", state_.test_accuracy}});
  if (writer_)
    folder_.write_metrics({{"event", "eval"},
                           {"step", trainer().steps_done()},
                           {"wall_s", wall_s()},
                           {"epoch", epoch},
                           {"test_accuracy", state_.test_accuracy}});
  measures_.eval_s += std::chrono::duration<double>(Clock::now() - t0).count();
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
  // On kd-ctl's thread: a failed write (a full disk) is said, not thrown where nothing catches it;
  // the student's next line meets the same failure and stops the run.
  elastic.on_move = [this](const json& record) {
    if (!writer_) return;
    try {
      folder_.write_metrics(record);
    } catch (const std::exception& e) {
      log_warn(fmt::format("kd-ctl's move was not recorded: {}", e.what()));
    }
  };
  kd_ctl_ = std::make_unique<KdCtl>(pipeline(), std::move(elastic));
}

void TrainRun::start_steps(std::uint64_t begin) {
  // A cache that holds an epoch already (read from its file): the loaders start on the teacher's
  // CPUs too.
  const bool share = cache_->holds_an_epoch();
  pipeline().start(begin, last_ - begin, {.cache = true, .share_teacher_cpus = share});
  if (share && pipeline().shared()) cache_->shared_at_start(begin);
  if (const double limit = config_.get_double("pipeline.stall_timeout_s"); limit > 0)
    watchdog_ = std::make_unique<StallWatchdog>(
        pipeline().ring(), begin, limit, "pipeline.stall_timeout_s",
        [this] { affinity::pin_this_thread(run().topology, run().plan.student, "kd-watchdog"); });
  start_kd_ctl();
}

void TrainRun::step_loop() {
  // The pipeline runs from the resume point to the end.
  loop_start_ = Clock::now();
  const std::uint64_t begin = state_.next_batch;
  start_steps(begin);
  log_.emplace(pipeline(), trainer(), writer_ ? &folder_ : nullptr,
               TrainLog::Extent{per_epoch_, epochs_, last_, session_.slots(),
                                static_cast<std::uint64_t>(config_.get_int("train.log_every"))},
               [this] { return wall_s(); });
  log_->start(begin, loop_start_);
  for (std::uint64_t b = begin; b < last_; ++b) {
    if (watchdog_) watchdog_->expect(b);
    const auto stats = student_step(b, b - begin);
    if (watchdog_) watchdog_->idle();
    if (!stats) break;
    measures_.samples += stats->samples;
    measures_.rank_samples += stats->rank_samples;
    log_->step(b, *stats, measures_.samples);
    if ((b + 1) % per_epoch_ == 0) {
      evaluate(static_cast<double>(b / per_epoch_ + 1));
      log_->epoch(b, state_.test_accuracy, state_.teacher_test_accuracy);
    }
    if (!after_batch(b, *stats)) break;
  }
  pipeline().stop();
  cache_->join(); // the closed ring ends a move in progress
  trainer().drain();
  log_->finish();
  pipeline().ring().rethrow_if_failed();
  measures_.stall_ns = log_->student_wait_ns();
}

bool TrainRun::after_batch(std::uint64_t b, const student::StepStats& stats) {
  const bool epoch_end = (b + 1) % per_epoch_ == 0;
  if (stats.stop) { // asked of this process, or (several ranks) of any rank
    interrupted_ = true;
    save(b + 1);
    save_teacher_cache();
    return false;
  }
  const auto every = static_cast<std::uint64_t>(config_.get_int("train.checkpoint_every"));
  if (epoch_end || (every > 0 && trainer().steps_done() % static_cast<std::int64_t>(every) == 0) ||
      b + 1 == last_)
    save(b + 1);
  if (epoch_end || b + 1 == last_) save_teacher_cache();
  if (epoch_end) cache_->share_when_full(b + 1, kd_ctl_ != nullptr);
  log_->restart_empty_interval();
  return true;
}

int TrainRun::finish() {
  // A stop asked for after the last step (agreed by the ranks): its checkpoint is saved; the
  // final evaluation and the export are left out.
  std::array<double, 1> stop{StopSignals::requested() ? 1.0 : 0.0};
  job_sum(stop, "agreeing on a stop");
  interrupted_ = interrupted_ || stop[0] > 0;
  if (!interrupted_ && last_ % per_epoch_ != 0)
    evaluate(static_cast<double>(last_) / static_cast<double>(per_epoch_), true);
  // The loop's time includes every evaluation and save (the last evaluation too), which the rate
  // leaves out.
  RunMeasures measured = measures_;
  measured.loop_s = std::chrono::duration<double>(Clock::now() - loop_start_).count();
  measured.teacher_work_ns = run().teacher_runs() ? log_->teacher_work_ns() : 0;
  measured.replicas = run().teacher_runs() ? pipeline().replicas() : 0;
  std::optional<ExportCheck> check;
  json exported = nullptr;
  if (writer_ && !interrupted_ && export_format_ != "off") {
    check = export_run_student(trainer(), options_, export_format_,
                               folder_.export_file(export_format_), run());
    exported = {{"file", folder_.export_file(export_format_).filename().string()},
                {"format", export_format_},
                {"check", to_json(*check)}};
  }
  // Every rank's own figures, in rank 0's summary.
  // The trained state's digest (parameters, buffers, optimizer): equal digests, equal runs.
  const std::vector<float> state = trainer().state_vector();
  const std::string state_digest =
      fmt::format("{:016x}", fnv1a(std::as_bytes(std::span(state.data(), state.size()))));
  const json mine = rank_line(session_.dist(), trainer().device(), figures_of(measured), run().plan,
                              state_digest);
  const json ranks = all_ranks(session_.group(), mine);
  if (!writer_) {
    if (interrupted_)
      throw Interrupted(fmt::format("rank {} interrupted at step {}: rank 0 saved the checkpoint",
                                    session_.dist().rank, trainer().steps_done()));
    return kExitOk;
  }
  const json written = run_summary(
      {state_, measured, trainer(), options_, run(), pipeline().ring(), session_.slots(),
       per_epoch_, wall_s(), interrupted_, session_.group(), exported, cache_->summary(),
       elastic_off_ ? json{{"active", false}, {"reason", *elastic_off_}}
                    : json{{"active", true}, {"kd_ctl", kd_ctl_->summary()}},
       ranks, state_digest});
  folder_.write_summary(written);
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
                       trainer().steps_done(), state_.test_accuracy, state_.best_test_accuracy,
                       written["samples_per_s"].get<double>(), folder_.path().string()));
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
