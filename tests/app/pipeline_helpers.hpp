// What the CPU pipeline's tests share (pipeline_core_test.cpp runs the pipeline without LibTorch,
// under TSan too; pipeline_test.cpp beside the student's code): the CPUs this process may use, the
// roles placed on them, the shipped teacher's settings, a dataset's first samples.
#pragma once

#include "teacher_unit.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/arena_thread.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/cpu_teacher/graph.hpp"

#include <oneapi/tbb/task_arena.h>

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kdflow::app {

using affinity::CpuList;

inline CpuList allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CpuList out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

inline std::string cpu_text(const CpuList& cpus) {
  std::string s;
  for (const int c : cpus) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

// The CPUs a task run in `arena` finds itself allowed.
inline CpuList cpus_seen_in(oneapi::tbb::task_arena& arena) {
  CpuList seen;
  run_in_arena(arena, [&] { seen = affinity::current_thread_cpus(); });
  return seen;
}

// The student on the first allowed CPU and the teacher on the second; the loaders on the third,
// or beside the student where there are two (a plan shares them only on machines that small).
inline void place_roles(const CpuList& cpus, std::vector<std::string>& sets) {
  sets.push_back("cores.student_cpus=" + std::to_string(cpus.at(0)));
  sets.push_back("cores.loader_cpus=" + std::to_string(cpus.at(cpus.size() >= 3 ? 2 : 0)));
  sets.push_back("cores.teacher_cpus=" + std::to_string(cpus.at(1)));
}

// The first `n` samples of `d` (held in memory), as a dataset of their own.
inline Dataset first_samples(const Dataset& d, std::size_t n) {
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint16_t> labels;
  for (std::size_t i = 0; i < n; ++i) {
    const auto image = d.image(i);
    pixels.insert(pixels.end(), image.begin(), image.end());
    labels.push_back(static_cast<std::uint16_t>(d.label(i)));
  }
  return {std::move(pixels), std::move(labels), d.channels(), d.height(),
          d.width(),         d.classes(),       d.source()};
}

inline std::vector<double> softmax_at(std::span<const float> z, double t) {
  double top = -HUGE_VAL;
  for (const float v : z) top = std::max(top, v / t);
  std::vector<double> p(z.size());
  double sum = 0;
  for (std::size_t i = 0; i < z.size(); ++i) sum += p[i] = std::exp(z[i] / t - top);
  for (auto& v : p) v /= sum;
  return p;
}

// Values of the shipped teacher's graph (as imported: before any pass) that hold one row per
// sample, in graph order, the graph's outputs left out.
inline std::vector<std::string> per_sample_values(const std::string& model) {
  teacher::LoadOptions options;
  options.batch = 4;
  options.run_passes = false;
  const teacher::Graph g = teacher::load_onnx(model, options);
  std::vector<std::string> out;
  for (const auto& node : g.nodes)
    for (const auto& v : node.outputs)
      if (!v.empty() && !g.is_output(v) && g.shape(v).at(0) == g.batch) out.push_back(v);
  return out;
}

// The shipped teacher on one CPU (one replica: batches are taught in order), its roles placed by
// place_roles, as --set lines after `sets`.
inline std::vector<std::string> shipped_teacher_sets(std::vector<std::string> sets) {
  sets.push_back("teacher.model=" + std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx");
  sets.push_back("teacher.tune=off");
  place_roles(allowed_cpus(), sets);
  return sets;
}

} // namespace kdflow::app
