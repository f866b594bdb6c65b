#include "pipeline.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <ranges>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

struct Normalization {
  std::vector<float> mean, std;
};

// The datasets' own per-channel statistics (of the training split, pixels scaled to [0, 1]).
// Formats without known statistics must set data.mean and data.std.
Normalization dataset_normalization(const std::string& dataset) {
  if (dataset == "fashion-mnist") return {{0.2860f}, {0.3530f}};
  if (dataset == "mnist") return {{0.1307f}, {0.3081f}};
  if (dataset == "cifar10") return {{0.4914f, 0.4822f, 0.4465f}, {0.2470f, 0.2435f, 0.2616f}};
  if (dataset == "cifar100") return {{0.5071f, 0.4865f, 0.4409f}, {0.2673f, 0.2564f, 0.2762f}};
  // Image folders: ImageNet's statistics, what torchvision's pretrained pipelines use (computing a
  // folder's own would mean decoding all of it before the first step).
  if (dataset == "folder") return {{0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}};
  throw InputError(fmt::format("data.mean/data.std = auto: no built-in statistics for "
                               "data.dataset = {}; give them as lists",
                               dataset));
}

std::vector<float> parse_floats(const std::string& text, const std::string& key,
                                std::size_t channels, bool positive) {
  std::vector<float> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const float v = std::strtof(item.c_str(), &end);
    if (item.empty() || end == item.c_str() || *end != '\0' || (positive && !(v > 0)))
      throw InputError(fmt::format("{} = \"{}\": '{}' is not a {}number", key, text, item,
                                   positive ? "positive " : ""));
    out.push_back(v);
  }
  if (out.size() == 1 && channels > 1) out.resize(channels, out[0]);
  if (out.size() != channels)
    throw InputError(
        fmt::format("{} = \"{}\": {} values for {} channel(s)", key, text, out.size(), channels));
  return out;
}

std::string shape_text(const teacher::Shape& shape) {
  std::string out;
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

} // namespace

Config resolve_config(const std::string& file, const std::vector<std::string>& sets,
                      const std::string& cores) {
  Config config;
  if (!file.empty()) config.merge_file(file);
  if (!cores.empty()) {
    // A tune-cores plan carries the teacher precision it was measured with; --set still wins.
    std::ifstream in(cores);
    if (!in) throw InputError(fmt::format("--cores {}: cannot read the plan file", cores));
    const nlohmann::json plan = nlohmann::json::parse(in, nullptr, false);
    if (plan.is_discarded())
      throw InputError(fmt::format("--cores {}: not a JSON plan file", cores));
    if (const auto p = plan.find("teacher_precision");
        p != plan.end() && p->is_string() && (*p == "fp32" || *p == "bf16"))
      config.set("teacher.precision=" + p->get<std::string>());
  }
  for (const auto& s : sets) config.set(s);
  if (!cores.empty()) config.set("cores.plan=" + cores);
  return config;
}

student::TrainerOptions trainer_options(const RunInputs& run, std::int64_t total_steps) {
  const Config& config = run.config;
  student::TrainerOptions topt;
  topt.model = {config.get_string("student.arch"),
                config.get_double("student.width"),
                run.train.channels(),
                run.train.height(),
                run.train.width(),
                run.train.classes()};
  topt.device = config.get_string("student.device");
  const auto threads = config.get_int("train.threads");
  topt.threads =
      threads > 0 ? static_cast<int>(threads) : static_cast<int>(run.plan.student.size());
  topt.optimizer = config.get_string("train.optimizer");
  topt.lr = config.get_double("train.lr");
  topt.momentum = config.get_double("train.momentum");
  topt.weight_decay = config.get_double("train.weight_decay");
  topt.nesterov = config.get_bool("train.nesterov");
  topt.warmup_steps = config.get_int("train.warmup_steps");
  topt.total_steps = total_steps;
  topt.clip_grad_norm = config.get_double("train.clip_grad_norm");
  topt.amp = config.get_string("train.amp");
  topt.kd_alpha = config.get_double("kd.alpha");
  topt.kd_temperature = config.get_double("kd.temperature");
  topt.skip_nonfinite = config.get_string("train.on_nonfinite") == "skip";
  topt.seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  if (!run.augment.normalize)
    for (std::size_t c = 0; c < run.augment.mean.size(); ++c) {
      topt.input_scale.push_back(channel_scale(run.augment, c));
      topt.input_shift.push_back(channel_shift(run.augment, c));
    }
  return topt;
}

std::vector<affinity::GpuLocality> gpu_localities(const affinity::Topology& topology) {
  std::vector<affinity::GpuLocality> out;
  for (int d = 0; d < student::cuda_device_count(); ++d) {
    const std::string bus = student::cuda_pci_bus_id(d);
    out.push_back({fmt::format("cuda:{} {}", d, bus),
                   topology.pci_local_cpus(bus).value_or(topology.allowed_cpus())});
  }
  return out;
}

RunInputs prepare_run(const Config& config) {
  const std::string format = config.get_string("data.dataset");
  const std::string path = config.get_string("data.path");
  const ImageGeometry geometry{static_cast<int>(config.get_int("data.image_size")),
                               static_cast<int>(config.get_int("data.resize"))};
  RunInputs run{config,
                Dataset::load(format, path, Split::train, geometry),
                Dataset::load(format, path, Split::test, geometry),
                {},
                {},
                affinity::Topology::load(),
                {},
                config.get_double("kd.alpha") > 0,
                nullptr,
                {}};
  if (run.train.class_names() != run.test.class_names())
    throw InputError(fmt::format("{} and {} have different class folders: labels would disagree",
                                 run.train.source(), run.test.source()));
  const auto channels = static_cast<std::size_t>(run.train.channels());
  const std::string mean = config.get_string("data.mean"), std_dev = config.get_string("data.std");
  run.augment.mean = mean == "auto" ? dataset_normalization(format).mean
                                    : parse_floats(mean, "data.mean", channels, false);
  run.augment.std = std_dev == "auto" ? dataset_normalization(format).std
                                      : parse_floats(std_dev, "data.std", channels, true);
  run.augment.normalize = config.get_string("data.slot_dtype") == "float32";
  run.augment.pad_crop = static_cast<int>(config.get_int("data.pad_crop"));
  run.augment.hflip = config.get_bool("data.hflip");
  run.sampler.batch_size = static_cast<std::size_t>(config.get_int("data.batch_size"));
  run.sampler.seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  run.sampler.drop_last = config.get_bool("data.drop_last");
  if (run.train.size() < run.sampler.batch_size && run.sampler.drop_last)
    throw InputError(fmt::format("data.batch_size = {}: larger than the training set of {} ({})",
                                 run.sampler.batch_size, run.train.size(), run.train.source()));

  std::optional<affinity::CpuList> gpu_local;
  if (const auto gpus = gpu_localities(run.topology); !gpus.empty())
    gpu_local = gpus.front().local_cpus; // the student's device, cuda:0
  run.plan = affinity::plan_from_config(config, run.topology, gpu_local);

  if (run.teacher_runs) {
    run.teacher_path = config.get_string("teacher.model");
    if (!std::filesystem::exists(run.teacher_path))
      throw InputError(fmt::format(
          "teacher.model = {}: no such file (from {}: the default teacher is trained by "
          "scripts/train_fmnist_teacher.py; kd.alpha = 0 trains without one)",
          run.teacher_path, std::filesystem::current_path().string()));
    run.teacher =
        load_run_teacher(run, teacher::parse_precision(config.get_string("teacher.precision")));
  }
  return run;
}

std::shared_ptr<const teacher::Teacher> load_run_teacher(const RunInputs& run,
                                                         teacher::Precision precision) {
  teacher::TeacherOptions options;
  options.batch = static_cast<std::int64_t>(run.sampler.batch_size);
  options.precision = precision;
  options.sample_shape =
      teacher::Shape{run.train.channels(), run.train.height(), run.train.width()};
  auto loaded = teacher::Teacher::load(run.teacher_path, options);
  const teacher::Shape out = loaded->output_shape(0);
  if (out.size() != 2 || out[1] != run.train.classes())
    throw InputError(fmt::format(
        "teacher {} outputs {} per sample but the dataset {} ({}) has {} classes: "
        "teacher.model and data.dataset disagree",
        run.teacher_path,
        out.size() == 2 ? fmt::format("{} logits", out[1]) : "a " + shape_text(out) + " tensor",
        run.config.get_string("data.dataset"), run.config.get_string("data.path"),
        run.train.classes()));
  return loaded;
}

void run_in_arena(oneapi::tbb::task_arena& arena, const std::function<void()>& fn) {
  std::atomic<bool> done{false};
  std::exception_ptr error;
  arena.enqueue([&] {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    done.store(true, std::memory_order_release);
    done.notify_all();
  });
  while (!done.load(std::memory_order_acquire)) done.wait(false, std::memory_order_acquire);
  if (error) std::rethrow_exception(error);
}

double teacher_test_accuracy(const RunInputs& run, std::span<const float> images,
                             oneapi::tbb::task_arena& arena) {
  const std::int64_t batch = run.teacher->batch();
  const std::size_t sample = run.test.sample_bytes();
  const auto classes = static_cast<std::size_t>(run.test.classes());
  std::size_t correct = 0;
  run_in_arena(arena, [&] {
    teacher::Replica replica(run.teacher);
    std::vector<float> input(static_cast<std::size_t>(batch) * sample, 0.f);
    std::vector<float> logits(static_cast<std::size_t>(batch) * classes);
    float* outputs[] = {logits.data()};
    for (std::size_t i = 0; i < run.test.size(); i += static_cast<std::size_t>(batch)) {
      const std::size_t n =
          std::min<std::size_t>(static_cast<std::size_t>(batch), run.test.size() - i);
      std::copy_n(images.data() + i * sample, n * sample, input.data());
      std::fill(input.begin() + static_cast<std::ptrdiff_t>(n * sample), input.end(), 0.f);
      replica.run(input.data(), outputs);
      for (std::size_t k = 0; k < n; ++k) {
        const float* row = logits.data() + k * classes;
        const auto best = std::max_element(row, row + classes) - row;
        correct += best == run.test.label(i + k);
      }
    }
  });
  return static_cast<double>(correct) / static_cast<double>(run.test.size());
}

SlotLayout CpuPipeline::layout_for(const RunInputs& run) {
  std::vector<RegionSpec> extra;
  if (run.teacher_runs) {
    const teacher::Shape out = run.teacher->output_shape(0);
    extra.push_back({"logits", DType::f32, {out[0], out[1]}});
  }
  return loader_layout(run.train, run.sampler.batch_size, run.augment.normalize, std::move(extra));
}

CpuPipeline::CpuPipeline(const RunInputs& run, const Sampler& sampler, std::uint32_t slots,
                         HostMemory memory)
    : run_(run), sampler_(sampler) {
  SlotLayout layout = layout_for(run);
  regions_.loader = {layout.index_of("inputs"), layout.index_of("labels"), layout.index_of("ids")};
  if (run.teacher_runs) regions_.logits = layout.index_of("logits");
  ring_ = std::make_unique<SlotRing>(std::move(layout), slots, std::move(memory));

  // Every arena's workers come from oneTBB's one global pool: size it for all of them (kd-ctl's
  // moves keep the sum).
  const std::size_t threads = run.plan.loader.size() + affinity::cpu_count(run.plan.teacher);
  parallelism_ = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, threads + 1);
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run.topology, run.plan.loader, "loader");
  assignment_.loader = run.plan.loader;
  if (run.teacher_runs) {
    int first_index = 0;
    for (const auto& cpus : run.plan.teacher) {
      teachers_.push_back(make_teacher(cpus, first_index));
      first_index += static_cast<int>(cpus.size());
    }
    assignment_.teacher = run.plan.teacher;
  }
  replica_count_.store(teachers_.size());
}

CpuPipeline::~CpuPipeline() { stop(); }

std::unique_ptr<CpuPipeline::TeacherUnit> CpuPipeline::make_teacher(const affinity::CpuList& cpus,
                                                                    int first_index) {
  auto unit = std::make_unique<TeacherUnit>();
  unit->arena =
      std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "teacher", first_index);
  // The replica's buffers are first touched on its own cores (its NUMA node); with uint8 slots, so
  // is its float32 copy of the batch's inputs.
  run_in_arena(unit->arena->arena(), [&] {
    unit->replica = std::make_unique<teacher::Replica>(run_.teacher);
    if (!run_.augment.normalize)
      unit->inputs.assign(run_.sampler.batch_size * run_.train.sample_bytes(), 0.f);
  });
  return unit;
}

void CpuPipeline::start_teacher(TeacherUnit& unit) {
  SlotRing& ring = *ring_;
  unit.graph = std::make_unique<StageGraph>(
      "teacher", unit.arena->arena(), 1, ring, RingStage::teacher, end_,
      [this, &ring, u = &unit](std::uint64_t b, int) {
        auto slot = ring.acquire_filled(b);
        if (!slot) return false;
        {
          trace::Span span("teacher", b);
          run_teacher(*u, *slot);
        }
        ring.publish(*slot, SlotState::teaching, SlotState::ready);
        return true;
      },
      &teacher_totals_);
  unit.graph->start();
}

void CpuPipeline::start_loader_graph() {
  loaders_ = start_loaders(loader_arena_->arena(), static_cast<int>(loader_arena_->cpus().size()),
                           *ring_, run_.train, sampler_, run_.augment, regions_.loader,
                           first_batch_, end_, after_load_, &loader_totals_);
}

void CpuPipeline::start(std::uint64_t first_batch, std::uint64_t batches,
                        const StartOptions& options) {
  std::lock_guard lock(structure_mutex_);
  const bool teacher = run_.teacher_runs && options.teacher;
  first_batch_ = first_batch;
  end_ = batches;
  after_load_ = teacher ? SlotState::filled : SlotState::ready;
  if (options.source == Source::loaders) {
    loaders_run_ = true;
    start_loader_graph();
  } else {
    // The first lap loads each slot; later laps hand the same bytes on. Synthetic logits: fixed
    // normal values, what a student step costs does not depend on them.
    SlotRing& ring = *ring_;
    const std::uint32_t slots = ring.slots();
    const SlotState after_load = after_load_;
    replay_ = std::make_unique<StageGraph>(
        "replay", loader_arena_->arena(), 1, ring, RingStage::loader, batches,
        [this, &ring, slots, first_batch, after_load, teacher](std::uint64_t b, int) {
          auto slot = ring.acquire_free(b);
          if (!slot) return false;
          if (b < slots) {
            trace::Span span("load", b);
            fill_batch(run_.train, sampler_, run_.augment, first_batch + b, *slot, regions_.loader,
                       serial_scratch_);
            if (regions_.logits && !teacher) {
              std::mt19937 rng(static_cast<std::uint32_t>(b));
              std::normal_distribution<float> normal(0.f, 2.f);
              for (float& v : slot->region<float>(*regions_.logits)) v = normal(rng);
            }
          }
          ring.publish(*slot, SlotState::filling, after_load);
          return true;
        },
        &loader_totals_);
    replay_->start();
  }
  if (!teacher) return;
  for (auto& unit : teachers_) start_teacher(*unit);
}

void CpuPipeline::run_teacher(TeacherUnit& unit, const Slot& slot) {
  float* outputs[] = {slot.region<float>(*regions_.logits).data()};
  if (run_.augment.normalize) {
    unit.replica->run(slot.region<float>(regions_.loader.inputs).data(), outputs);
    return;
  }
  // uint8 slots: the teacher's float32 inputs, normalized as the loader would have.
  const Dataset& d = run_.train;
  normalize_images(slot.region<std::uint8_t>(regions_.loader.inputs).data(), unit.inputs.data(),
                   run_.sampler.batch_size, d.channels(),
                   static_cast<std::size_t>(d.height()) * d.width(), run_.augment);
  unit.replica->run(unit.inputs.data(), outputs);
}

void CpuPipeline::produce_serially(std::uint64_t b) {
  using Clock = std::chrono::steady_clock;
  const auto nanos = [](Clock::time_point t0) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  };
  const bool teacher = run_.teacher_runs;
  auto slot = ring_->acquire_free(b);
  if (!slot) return;
  auto t0 = Clock::now();
  run_in_arena(loader_arena_->arena(), [&] {
    trace::Span span("load", b);
    fill_batch(run_.train, sampler_, run_.augment, b, *slot, regions_.loader, serial_scratch_);
  });
  serial_loader_ns_ += nanos(t0);
  ring_->publish(*slot, SlotState::filling, teacher ? SlotState::filled : SlotState::ready);
  if (!teacher) return;
  slot = ring_->acquire_filled(b);
  if (!slot) return;
  t0 = Clock::now();
  TeacherUnit& unit = *teachers_[0];
  run_in_arena(unit.arena->arena(), [&] {
    trace::Span span("teacher", b);
    run_teacher(unit, *slot);
  });
  serial_teacher_ns_ += nanos(t0);
  ring_->publish(*slot, SlotState::teaching, SlotState::ready);
}

void CpuPipeline::stop() {
  ring_->close();
  {
    std::lock_guard lock(control_mutex_);
    control_stop_ = true;
  }
  control_wake_.notify_all();
  // A move in progress ends: the closed ring releases every body it waits for.
  if (controller_.joinable()) controller_.join();
  std::lock_guard lock(structure_mutex_);
  stopped_ = true;
  for (auto& unit : teachers_)
    if (unit->graph) unit->graph->wait();
  if (loaders_) loaders_->wait();
  if (replay_) replay_->wait();
}

std::uint64_t CpuPipeline::loader_busy_ns() const {
  return serial_loader_ns_ + loader_totals_.busy_ns.load(std::memory_order_relaxed);
}

std::uint64_t CpuPipeline::teacher_busy_ns() const {
  return serial_teacher_ns_ + teacher_totals_.busy_ns.load(std::memory_order_relaxed);
}

affinity::PoolAssignment CpuPipeline::assignment() const {
  std::lock_guard lock(record_mutex_);
  return assignment_;
}

nlohmann::json CpuPipeline::elastic_summary() const {
  std::lock_guard lock(record_mutex_);
  return {{"windows", windows_},
          {"moves", moves_},
          {"loader", assignment_.loader},
          {"teacher", assignment_.teacher}};
}

namespace {

// The widest replica of the plan: kd-ctl's replicas grow up to it.
int replica_width(const affinity::Plan& plan) {
  std::size_t width = 1;
  for (const auto& r : plan.teacher) width = std::max(width, r.size());
  return static_cast<int>(width);
}

} // namespace

std::optional<std::string> CpuPipeline::start_elastic(ElasticSettings settings) {
  if (!run_.teacher_runs || !loaders_run_ || teachers_.empty())
    return std::string("no teacher runs beside the loaders");
  const affinity::PoolAssignment now = assignment();
  const int width = replica_width(run_.plan);
  if (!affinity::move_cpu(now, affinity::Move::to_teacher, run_.plan.student, width) &&
      !affinity::move_cpu(now, affinity::Move::to_loader, run_.plan.student, width))
    return fmt::format("no CPU can move between the loaders ({}) and the teacher ({}): each pool "
                       "keeps one and the student's stays with it",
                       affinity::format_cpus(now.loader),
                       affinity::format_cpus(run_.plan.teacher.front()));
  controller_ = std::thread([this, s = std::move(settings)]() mutable { control(std::move(s)); });
  return std::nullopt;
}

namespace {

struct Snapshot {
  std::chrono::steady_clock::time_point time;
  RingStats ring;
  std::uint64_t loader_busy_ns, loader_batches, teacher_busy_ns, teacher_batches;
};

affinity::StageWindow stage_window(std::uint64_t busy0, std::uint64_t busy1, std::uint64_t batches0,
                                   std::uint64_t batches1, const RingStats::Stage& ring0,
                                   const RingStats::Stage& ring1, int cores, int bodies) {
  // A body's time includes its wait for the slot; the ring counts those waits apart.
  const double busy = static_cast<double>(busy1 - busy0);
  const double waited = static_cast<double>(ring1.wait_ns - ring0.wait_ns);
  return {batches1 - batches0, std::max(0.0, busy - waited) / 1e9, cores, bodies};
}

} // namespace

void CpuPipeline::control(ElasticSettings settings) {
  affinity::pin_this_thread(run_.topology, run_.plan.student, "kd-ctl");
  affinity::ElasticPolicy policy(settings.policy);
  const int width = replica_width(run_.plan);
  const auto started = std::chrono::steady_clock::now();
  const auto snapshot = [this] {
    return Snapshot{std::chrono::steady_clock::now(), ring_->stats(),
                    loader_totals_.busy_ns.load(),    loader_totals_.batches.load(),
                    teacher_totals_.busy_ns.load(),   teacher_totals_.batches.load()};
  };
  const auto window = std::chrono::duration<double>(settings.window_s);
  Snapshot before = snapshot();
  for (;;) {
    {
      std::unique_lock lock(control_mutex_);
      if (control_wake_.wait_for(lock, window, [this] { return control_stop_; })) return;
    }
    const Snapshot after = snapshot();
    const affinity::PoolAssignment now = assignment();
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
        affinity::move_cpu(now, affinity::Move::to_teacher, run_.plan.student, width);
    const auto to_loader =
        affinity::move_cpu(now, affinity::Move::to_loader, run_.plan.student, width);
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
    if (!reassign(next)) return;
    policy.moved();
    const nlohmann::json record = {
        {"event", "elastic"},
        {"time_s", std::chrono::duration<double>(t0 - started).count()},
        {"batch", first_batch_ + after.ring.stages[S].acquisitions},
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

bool CpuPipeline::reassign(const affinity::PoolAssignment& to) {
  if (to.loader.empty() || to.teacher.empty() ||
      std::ranges::any_of(to.teacher, [](const affinity::CpuList& r) { return r.empty(); }) ||
      to.loader.size() + affinity::cpu_count(to.teacher) >
          run_.plan.loader.size() + affinity::cpu_count(run_.plan.teacher))
    throw std::invalid_argument("reassign: each pool needs a CPU, and all of them no more than the "
                                "plan's loader and teacher CPUs");
  std::lock_guard lock(structure_mutex_);
  if (!run_.teacher_runs || !loaders_run_)
    throw std::invalid_argument("reassign: the loaders and the teacher are not running");
  if (stopped_ || ring_->closed()) return false;
  const affinity::PoolAssignment from = assignment();
  const bool ok = to.loader.size() < from.loader.size()
                      ? rebuild_loaders(to.loader) && rebuild_teachers(to.teacher)
                      : rebuild_teachers(to.teacher) && rebuild_loaders(to.loader);
  if (!ok) return false;
  std::lock_guard record(record_mutex_);
  assignment_ = to;
  return true;
}

bool CpuPipeline::rebuild_loaders(const affinity::CpuList& cpus) {
  if (cpus == loader_arena_->cpus()) return true;
  loaders_->request_stop();
  loaders_->wait();
  if (ring_->closed()) return false;
  loaders_.reset();
  loader_arena_.reset(); // its workers return to oneTBB's pool; the new arena's are re-pinned
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run_.topology, cpus, "loader");
  start_loader_graph();
  return true;
}

bool CpuPipeline::rebuild_teachers(const std::vector<affinity::CpuList>& replicas) {
  int first_index = 0;
  for (std::size_t k = 0; k < std::max(replicas.size(), teachers_.size()); ++k) {
    const bool keep =
        k < replicas.size() && k < teachers_.size() && teachers_[k]->arena->cpus() == replicas[k];
    if (!keep && k < teachers_.size()) {
      teachers_[k]->graph->request_stop();
      teachers_[k]->graph->wait();
      if (ring_->closed()) return false;
    }
    if (k < replicas.size()) {
      if (!keep) {
        auto unit = make_teacher(replicas[k], first_index);
        start_teacher(*unit);
        if (k < teachers_.size())
          teachers_[k] = std::move(unit);
        else
          teachers_.push_back(std::move(unit));
      }
      first_index += static_cast<int>(replicas[k].size());
    }
  }
  teachers_.resize(replicas.size());
  replica_count_.store(teachers_.size(), std::memory_order_relaxed);
  return true;
}

} // namespace kdflow::app
