#include "pipeline.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/core/trace.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <fmt/format.h>
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
  if (student::cuda_device_count() > 0) {
    gpu_local = run.topology.pci_local_cpus(student::cuda_pci_bus_id(0));
    if (!gpu_local) gpu_local = run.topology.allowed_cpus();
  }
  run.plan = affinity::plan_from_config(config, run.topology, gpu_local);

  if (run.teacher_runs) {
    run.teacher_path = config.get_string("teacher.model");
    if (!std::filesystem::exists(run.teacher_path))
      throw InputError(fmt::format(
          "teacher.model = {}: no such file (from {}: the default teacher is trained by "
          "scripts/train_fmnist_teacher.py; kd.alpha = 0 trains without one)",
          run.teacher_path, std::filesystem::current_path().string()));
    teacher::TeacherOptions options;
    options.batch = static_cast<std::int64_t>(run.sampler.batch_size);
    options.precision = teacher::parse_precision(config.get_string("teacher.precision"));
    options.sample_shape =
        teacher::Shape{run.train.channels(), run.train.height(), run.train.width()};
    run.teacher = teacher::Teacher::load(run.teacher_path, options);
    const teacher::Shape out = run.teacher->output_shape(0);
    if (out.size() != 2 || out[1] != run.train.classes())
      throw InputError(fmt::format(
          "teacher {} outputs {} per sample but the dataset {} ({}) has {} classes: "
          "teacher.model and data.dataset disagree",
          run.teacher_path,
          out.size() == 2 ? fmt::format("{} logits", out[1]) : "a " + shape_text(out) + " tensor",
          format, path, run.train.classes()));
  }
  return run;
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

  // Every arena's workers come from oneTBB's one global pool: size it for all of them.
  std::size_t threads = run.plan.loader.size();
  for (const auto& cpus : run.plan.teacher) threads += cpus.size();
  parallelism_ = std::make_unique<oneapi::tbb::global_control>(
      oneapi::tbb::global_control::max_allowed_parallelism, threads + 1);
  loader_arena_ = std::make_unique<affinity::PinnedArena>(run.topology, run.plan.loader, "loader");
  if (run.teacher_runs) {
    int first_index = 0;
    for (const auto& cpus : run.plan.teacher) {
      teacher_arenas_.push_back(
          std::make_unique<affinity::PinnedArena>(run.topology, cpus, "teacher", first_index));
      first_index += static_cast<int>(cpus.size());
      // Each replica's buffers are first touched on its own cores (its NUMA node); with uint8
      // slots, so is its float32 copy of the batch's inputs.
      run_in_arena(teacher_arenas_.back()->arena(), [&] {
        replicas_.push_back(std::make_unique<teacher::Replica>(run.teacher));
        if (!run.augment.normalize)
          teacher_inputs_.emplace_back(run.sampler.batch_size * run.train.sample_bytes(), 0.f);
      });
    }
  }
}

CpuPipeline::~CpuPipeline() { stop(); }

void CpuPipeline::start(std::uint64_t first_batch, std::uint64_t batches,
                        const StartOptions& options) {
  const bool teacher = run_.teacher_runs && options.teacher;
  const SlotState after_load = teacher ? SlotState::filled : SlotState::ready;
  if (options.source == Source::loaders) {
    loaders_ = start_loaders(loader_arena_->arena(), static_cast<int>(run_.plan.loader.size()),
                             *ring_, run_.train, sampler_, run_.augment, regions_.loader,
                             first_batch, batches, after_load);
  } else {
    // The first lap loads each slot; later laps hand the same bytes on. Synthetic logits: fixed
    // normal values, what a student step costs does not depend on them.
    SlotRing& ring = *ring_;
    const std::uint32_t slots = ring.slots();
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
        });
    replay_->start();
  }
  if (!teacher) return;
  for (std::size_t k = 0; k < replicas_.size(); ++k) {
    SlotRing& ring = *ring_;
    teachers_.push_back(std::make_unique<StageGraph>(
        "teacher", teacher_arenas_[k]->arena(), 1, ring, RingStage::teacher, batches,
        [this, &ring, k](std::uint64_t b, int) {
          auto slot = ring.acquire_filled(b);
          if (!slot) return false;
          {
            trace::Span span("teacher", b);
            run_teacher(k, *slot);
          }
          ring.publish(*slot, SlotState::teaching, SlotState::ready);
          return true;
        }));
    teachers_.back()->start();
  }
}

void CpuPipeline::run_teacher(std::size_t k, const Slot& slot) {
  float* outputs[] = {slot.region<float>(*regions_.logits).data()};
  if (run_.augment.normalize) {
    replicas_[k]->run(slot.region<float>(regions_.loader.inputs).data(), outputs);
    return;
  }
  // uint8 slots: the teacher's float32 inputs, normalized as the loader would have.
  const Dataset& d = run_.train;
  std::vector<float>& input = teacher_inputs_[k];
  normalize_images(slot.region<std::uint8_t>(regions_.loader.inputs).data(), input.data(),
                   run_.sampler.batch_size, d.channels(),
                   static_cast<std::size_t>(d.height()) * d.width(), run_.augment);
  replicas_[k]->run(input.data(), outputs);
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
  run_in_arena(teacher_arenas_[0]->arena(), [&] {
    trace::Span span("teacher", b);
    run_teacher(0, *slot);
  });
  serial_teacher_ns_ += nanos(t0);
  ring_->publish(*slot, SlotState::teaching, SlotState::ready);
}

void CpuPipeline::stop() {
  ring_->close();
  for (auto& t : teachers_) t->wait();
  if (loaders_) loaders_->wait();
  if (replay_) replay_->wait();
}

std::uint64_t CpuPipeline::loader_busy_ns() const {
  return serial_loader_ns_ + (loaders_ ? loaders_->busy_ns() : 0) +
         (replay_ ? replay_->busy_ns() : 0);
}

std::uint64_t CpuPipeline::teacher_busy_ns() const {
  std::uint64_t total = serial_teacher_ns_;
  for (const auto& t : teachers_) total += t->busy_ns();
  return total;
}

} // namespace kdflow::app
