// Evaluation's inputs and the teachers' own test accuracy (evaluation.hpp): the test split
// normalized on pinned threads, a chunk at a time, and the teachers (and their mix) scored on it.
#include "evaluation.hpp"

#include "pipeline.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/cpu_teacher/engine.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>

#include <fmt/format.h>

namespace kdflow::app {

void evaluation_images(const RunInputs& run, const affinity::CpuList& cpus, std::size_t first,
                       std::size_t count, std::vector<float>& out) {
  AugmentConfig eval = run.augment;
  eval.augment = false;
  out.resize(count * run.test.sample_bytes());
  const std::size_t workers =
      std::clamp<std::size_t>(cpus.size(), 1, std::max<std::size_t>(count, 1));
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < workers; ++k)
    threads.emplace_back([&, k] {
      try {
        affinity::pin_this_thread(run.topology, {cpus[k % cpus.size()]},
                                  fmt::format("kd-eval-{}", k));
        SampleScratch scratch;
        normalize_samples(run.test, eval, first, count, k, workers, out.data(), scratch);
      } catch (...) {
        errors[k] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::vector<std::size_t> teacher_test_hits(const RunInputs& run, std::span<const float> images,
                                           std::size_t first, std::size_t count,
                                           oneapi::tbb::task_arena& arena) {
  const auto batch = static_cast<std::size_t>(run.teachers.front().model->batch());
  const std::size_t sample = run.test.sample_bytes();
  const auto classes = static_cast<std::size_t>(run.test.classes());
  const std::size_t teachers = run.teachers.size();
  std::vector<std::size_t> correct(teachers > 1 ? teachers + 1 : 1, 0);
  run_in_arena(arena, [&] {
    std::vector<std::unique_ptr<teacher::Replica>> replicas;
    std::vector<teacher::OutputBuffers> outputs;
    std::vector<std::vector<float>> inputs(teachers);
    std::vector<const float*> logits;
    for (std::size_t t = 0; t < teachers; ++t) {
      const RunTeacher& teacher = run.teachers[t];
      replicas.push_back(std::make_unique<teacher::Replica>(teacher.model));
      outputs.emplace_back(*teacher.model); // the first is the logits scored
      inputs[t].assign(batch * teacher.input.to().numel(), 0.f);
    }
    for (const auto& o : outputs) logits.push_back(o.data.front().data());
    std::vector<float> mixed(run.mix ? batch * classes : 0), scratch;
    const auto count_hits = [&](const float* rows, std::size_t i, std::size_t n, std::size_t& to) {
      for (std::size_t k = 0; k < n; ++k) {
        const float* row = rows + k * classes;
        const auto best = std::max_element(row, row + classes) - row;
        to += best == run.test.label(i + k);
      }
    };
    for (std::size_t i = first; i < first + count; i += batch) {
      const std::size_t n = std::min(batch, first + count - i);
      for (std::size_t t = 0; t < teachers; ++t) {
        const ImageAdapter& adapt = run.teachers[t].input;
        const std::size_t own = adapt.to().numel();
        adapt.run(images.data() + (i - first) * sample, n, inputs[t].data(), scratch);
        std::fill(inputs[t].begin() + static_cast<std::ptrdiff_t>(n * own), inputs[t].end(), 0.f);
        replicas[t]->run(inputs[t].data(), outputs[t].pointers);
        if (teachers > 1) count_hits(logits[t], i, n, correct[1 + t]);
      }
      if (run.mix) (*run.mix)(logits, n, classes, mixed.data());
      count_hits(run.mix ? mixed.data() : logits[0], i, n, correct[0]);
    }
  });
  return correct;
}

std::pair<std::size_t, std::size_t> rank_part(std::size_t n, const DistEnv& dist) {
  const auto r = static_cast<std::size_t>(dist.rank), w = static_cast<std::size_t>(dist.world);
  return {n * r / w, n * (r + 1) / w};
}

void for_test_chunks(const RunInputs& run, const affinity::CpuList& cpus,
                     const std::function<void(std::span<const float>, std::span<const std::int64_t>,
                                              std::size_t)>& fn) {
  const auto [first, last] = rank_part(run.test.size(), run.dist);
  std::vector<std::int64_t> labels;
  std::vector<float> images;
  for (std::size_t i = first; i < last; i += kEvalChunk) {
    const std::size_t n = std::min(kEvalChunk, last - i);
    evaluation_images(run, cpus, i, n, images);
    labels.resize(n);
    for (std::size_t k = 0; k < n; ++k) labels[k] = run.test.label(i + k);
    fn(images, labels, i);
  }
}

TeacherAccuracy measure_teachers(const RunInputs& run, const affinity::CpuList& cpus,
                                 oneapi::tbb::task_arena& arena, std::size_t replicas,
                                 const std::function<void(std::span<double>)>& job_sum) {
  const std::vector<RunTeacher>& teachers = run.teachers;
  // The target's hits (the teachers' mix, with several), then each teacher's.
  std::vector<double> hits(teachers.size() > 1 ? teachers.size() + 1 : 1, 0.0);
  for_test_chunks(
      run, cpus,
      [&](std::span<const float> images, std::span<const std::int64_t> labels, std::size_t first) {
        const auto got = teacher_test_hits(run, images, first, labels.size(), arena);
        for (std::size_t k = 0; k < hits.size(); ++k) hits[k] += static_cast<double>(got[k]);
      });
  job_sum(hits);
  const auto test = static_cast<double>(run.test.size());
  TeacherAccuracy out;
  out.target = hits[0] / test;
  if (teachers.size() == 1) {
    log_info(fmt::format("teacher {}: test accuracy {:.4f} ({} precision, {} replica(s))",
                         teachers[0].spec.path, out.target,
                         teacher::precision_name(teachers[0].spec.precision), replicas));
    return out;
  }
  out.teachers = nlohmann::json::array();
  for (std::size_t t = 0; t < teachers.size(); ++t) {
    const std::string& model = teachers[t].spec.path;
    const double weight = std::exp(run.mix->log_weights()[t]);
    out.teachers.push_back({{"model", model},
                            {"precision", teacher::precision_name(teachers[t].model->precision())},
                            {"weight", weight},
                            {"test_accuracy", hits[1 + t] / test}});
    log_info(fmt::format("teacher {} ({}): test accuracy {:.4f} alone, weight {:.3g}", t, model,
                         hits[1 + t] / test, weight));
  }
  log_info(fmt::format("the {} teachers' mix at kd.temperature {:g} (the target): test "
                       "accuracy {:.4f}; {} replica(s) in all",
                       teachers.size(), run.mix->temperature(), out.target, replicas));
  return out;
}

} // namespace kdflow::app
