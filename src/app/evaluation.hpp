// Evaluation's inputs (the test split as evaluation sees it, a chunk at a time, on pinned
// threads) and the teachers' own test accuracy.
#pragma once

#include "run_inputs.hpp"

#include "kdflow/affinity/plan.hpp"

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdflow::app {

// Evaluations read the test split this many samples at a time (their memory: one chunk).
inline constexpr std::size_t kEvalChunk = 1024;

// Samples [first, first + count) of the test split as evaluation sees them (normalized, no
// augmentation; an image folder's decoded now), into `out`: one thread per CPU of `cpus`
// (kd-eval-N, pinned; the loaders' CPUs, idle while the student evaluates). Throws what a sample
// threw (an InputError naming an image that does not decode).
void evaluation_images(const RunInputs& run, const affinity::CpuList& cpus, std::size_t first,
                       std::size_t count, std::vector<float>& out);

// How many of the test split's samples [first, first + count) the teacher classifies right
// (`images`: normalized_images of those samples), on `arena`'s cores. With several teachers: what
// their mix (the target) gets right, then what each teacher does alone.
std::vector<std::size_t> teacher_test_hits(const RunInputs& run, std::span<const float> images,
                                           std::size_t first, std::size_t count,
                                           oneapi::tbb::task_arena& arena);

// This rank's part [first, last) of `n` items (the whole with one process).
std::pair<std::size_t, std::size_t> rank_part(std::size_t n, const DistEnv& dist);

// This rank's part of the test split, at most kEvalChunk samples at a time: their images as
// evaluation sees them (decoded on `cpus`, idle meanwhile), labels and first index. Memory for one
// chunk, whatever the split.
void for_test_chunks(const RunInputs& run, const affinity::CpuList& cpus,
                     const std::function<void(std::span<const float>, std::span<const std::int64_t>,
                                              std::size_t)>& fn);

// The teachers' own test accuracy, measured once at a run's start: the target's (their mix, with
// several) and, with several, each one alone (`teachers`: model, precision, weight, accuracy).
struct TeacherAccuracy {
  double target = 0;
  nlohmann::json teachers = nullptr;
};
// On `arena`'s cores (a teacher replica's), this rank's part of the split decoded on `cpus`;
// `job_sum` adds the ranks' counts in place (the job's accuracy). Logs a line per teacher
// (`replicas`: the pipeline's, for the line).
TeacherAccuracy measure_teachers(const RunInputs& run, const affinity::CpuList& cpus,
                                 oneapi::tbb::task_arena& arena, std::size_t replicas,
                                 const std::function<void(std::span<double>)>& job_sum);

} // namespace kdflow::app
