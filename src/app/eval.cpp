// kdflow eval (eval.hpp): the test split normalized as the run's data, a chunk at a time, the model
// run in batches of data.batch_size, top-1 and top-5 counted from its logits, images/s over the
// model's time alone.
#include "eval.hpp"

#include "pipeline.hpp"
#include "run.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/gpu_student/students.hpp"

#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace {

using Clock = std::chrono::steady_clock;

// Whether `label` is among the `k` largest of `row` (ties counted against it).
bool in_top(std::span<const float> row, std::int64_t label, std::size_t k) {
  const float mine = row[static_cast<std::size_t>(label)];
  std::size_t above = 0;
  for (std::size_t c = 0; c < row.size(); ++c)
    above += row[c] > mine || (row[c] == mine && c < static_cast<std::size_t>(label));
  return above < k;
}

} // namespace

int eval_command(const EvalArgs& args) {
  namespace fs = std::filesystem;
  const std::string ext = fs::path(args.model).extension().string();
  if (ext != ".onnx" && ext != ".pt")
    throw InputError(fmt::format("--model {}: want an ONNX model (.onnx) or a TorchScript "
                                 "module (.pt)",
                                 args.model));
  check_input_file(args.model, "--model");
  const bool onnx = ext == ".onnx";
  const Config config = resolve_config(args.config, args.sets);
  // The data and the plan; an ONNX model is loaded alone as a teacher is, with [teacher]'s input
  // (teacher.input_size, mean, std) and precision, and scored on its logits (no features).
  RunRequest request{.teachers = std::vector<TeacherSpec>{}};
  if (onnx) {
    TeacherSpec spec = configured_teacher(config);
    spec.path = args.model;
    request.teachers->push_back(std::move(spec));
  }
  const RunInputs run = prepare_run(config, {}, request);
  const std::size_t count = run.test.size(), sample = run.test.sample_bytes();
  const auto classes = static_cast<std::size_t>(run.test.classes());
  const std::size_t batch = run.sampler.batch_size;
  // The split a chunk at a time (decoded on the loader CPUs): memory for one chunk's images and
  // logits, whatever the split's size.
  std::vector<float> images, logits;
  std::size_t top1 = 0, top5 = 0;
  const auto score = [&](std::size_t first) {
    for (std::size_t k = 0; k < logits.size() / classes; ++k) {
      const std::span<const float> row(logits.data() + k * classes, classes);
      top1 += in_top(row, run.test.label(first + k), 1);
      top5 += in_top(row, run.test.label(first + k), 5);
    }
  };
  double seconds = 0;
  std::string runner;
  if (onnx) {
    // The teacher's CPUs of the run's plan, as one replica.
    affinity::CpuList cpus;
    for (const auto& r : run.plan.teacher) cpus.insert(cpus.end(), r.begin(), r.end());
    affinity::PinnedArena arena(run.topology, cpus, "eval");
    runner = fmt::format("kdflow's oneDNN engine, {} thread(s), {}", cpus.size(),
                         teacher::precision_name(run.teachers.front().spec.precision));
    run_in_arena(arena.arena(), [&] {
      const RunTeacher& model = run.teachers.front();
      teacher::Replica replica(model.model);
      const ImageAdapter& adapt = model.input;
      std::vector<float> input(batch * adapt.to().numel(), 0.f), scratch;
      teacher::OutputBuffers outputs(*model.model); // the first is the logits scored
      const std::vector<float>& out = outputs.data.front();
      for (std::size_t first = 0; first < count; first += kEvalChunk) {
        const std::size_t chunk = std::min(kEvalChunk, count - first);
        evaluation_images(run, run.plan.loader, first, chunk, images);
        logits.resize(chunk * classes);
        for (std::size_t i = 0; i < chunk; i += batch) {
          const std::size_t n = std::min(batch, chunk - i);
          adapt.run(images.data() + i * sample, n, input.data(), scratch);
          const auto t0 = Clock::now();
          replica.run(input.data(), outputs.pointers);
          seconds += std::chrono::duration<double>(Clock::now() - t0).count();
          std::copy_n(out.begin(), n * classes,
                      logits.begin() + static_cast<std::ptrdiff_t>(i * classes));
        }
        score(first);
      }
    });
  } else {
    runner = fmt::format("LibTorch on {}", run.device.is_cuda() ? "cuda" : "cpu");
    student::StudentSpec spec{
        "torchscript",      1.0,       run.test.channels(), run.test.height(), run.test.width(),
        run.test.classes(), args.model};
    student::ScriptRunner model(args.model, spec, run.device);
    for (std::size_t first = 0; first < count; first += kEvalChunk) {
      const std::size_t chunk = std::min(kEvalChunk, count - first);
      evaluation_images(run, run.plan.loader, first, chunk, images);
      double chunk_s = 0;
      logits = model.run(images, static_cast<std::int64_t>(batch), &chunk_s);
      seconds += chunk_s;
      if (logits.size() != chunk * classes)
        throw InputError(fmt::format("--model {}: {} logits for {} images of {} classes",
                                     args.model, logits.size(), chunk, classes));
      score(first);
    }
  }
  const double n = static_cast<double>(count);
  nlohmann::json result = {{"model", args.model},
                           {"format", onnx ? "onnx" : "torchscript"},
                           {"data", run.test.source()},
                           {"samples", count},
                           {"top1", static_cast<double>(top1) / n},
                           {"top5", classes > 5 ? nlohmann::json(static_cast<double>(top5) / n)
                                                : nlohmann::json(nullptr)},
                           {"images_per_s", n / std::max(seconds, 1e-9)},
                           {"batch", batch},
                           {"runner", runner}};
  fmt::print("{}: top-1 {:.4f}{} on {} test images ({}), {:.0f} images/s ({})\n", args.model,
             result["top1"].get<double>(),
             classes > 5 ? fmt::format(", top-5 {:.4f}", result["top5"].get<double>()) : "", count,
             run.test.source(), result["images_per_s"].get<double>(), runner);
  if (!args.json.empty()) write_file_atomic(args.json, result.dump(2) + "\n");
  return kExitOk;
}

} // namespace kdflow::app
