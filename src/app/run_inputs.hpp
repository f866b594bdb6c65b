// A run's inputs, each decided once from its configuration (run.hpp resolves them): the data,
// augmentation and sampler, the core plan, the teacher at its precision, the student's device.
// What the CPU pipeline reads; it holds no student (device.hpp is a torch-free value type).
#pragma once

#include "kdflow/affinity/plan.hpp"
#include "kdflow/affinity/topology.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/dataset.hpp"
#include "kdflow/core/dist_env.hpp"
#include "kdflow/core/image_adapter.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/teacher_cache.hpp"
#include "kdflow/core/teacher_mix.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/gpu_student/device.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace kdflow::app {

// Where one of the run's teachers comes from: [teacher], or a teacher.others row (the second and
// later [[teacher]] blocks), with the key its values are named by in messages.
struct TeacherSpec {
  std::string key; // "teacher" or "teacher.others[k]"
  std::string path;
  teacher::Precision precision{};
  double weight = 1;
  std::string input_size = "auto", mean = "auto", std = "auto";
  std::vector<std::string> features; // the values it computes beside its logits (its features,
                                     // then the kd.features values read from it)
};

// One of the run's teachers, loaded: where it comes from (its key, file, precision, weight, input
// and features), the model at the run's batch and how it reads the slot's images. Teacher k of a
// run is `RunInputs::teachers[k]`, whichever block named it.
struct RunTeacher {
  TeacherSpec spec;
  std::shared_ptr<const teacher::Teacher> model;
  ImageAdapter input; // the slot's images -> the teacher's input
};

struct RunInputs {
  Config config;
  Dataset train;
  Dataset test;
  AugmentConfig augment; // training augmentation (evaluation: the same with augment = false)
  SamplerConfig sampler;
  affinity::Topology topology;
  affinity::Plan plan;
  student::Device device; // the student's (student.device resolved)
  DistEnv dist; // torchrun's ranks (one, without torchrun): the sampler's shard, the GPU, the cores
  // The teachers that run, [teacher] first (none when kd.alpha = 0, or when the command asked for
  // none), each on its own replicas and cores.
  std::vector<RunTeacher> teachers;
  std::vector<double> teacher_costs; // several teachers: each one's FLOPs per sample
  std::optional<TeacherMix> mix;     // several teachers: their logits into the slot's target
  // kd.cache, with a teacher that runs: its outputs kept per sample, shared by the run's pipelines
  // (null with kd.cache = none); with kd.cache = disk, the file they are kept in between runs and
  // what they were computed from (prepare_teacher_cache).
  std::shared_ptr<TeacherOutputCache> cache;
  std::filesystem::path cache_file;
  std::string cache_key;

  [[nodiscard]] bool teacher_runs() const { return !teachers.empty(); }
};

} // namespace kdflow::app
