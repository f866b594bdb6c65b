// A run's inputs, each decided once from its configuration (run.hpp resolves them): the data,
// augmentation and sampler, the core plan, the teacher at its precision, the student's device.
// What the CPU pipeline reads; it holds no student (device.hpp is a torch-free value type).
#pragma once

#include "kdflow/affinity/pinning.hpp"
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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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

// A teacher's outputs are its graph's (the first is the logits), then its features: the index of
// its first feature.
inline std::size_t first_feature(const teacher::Teacher& t) { return t.graph().outputs.size(); }

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

// What a command asks of load_run_inputs besides the data, the plan and the student's device.
struct RunRequest {
  // The teachers loaded (and given cores): the configuration's ([teacher] and teacher.others,
  // none at kd.alpha = 0) when unset; else exactly these (eval: the model it scores; export: none,
  // or the configuration's when the student's feature adapters need their shapes).
  std::optional<std::vector<TeacherSpec>> teachers;
  // kd.cache made ready for the teachers (prepare_teacher_cache): train and bench-overlap.
  bool cache = false;
  // The student's device, when the caller resolved student.device already (the Session: once,
  // for its process group and the run); unset, prepare_run (run.hpp) resolves it.
  std::optional<student::Device> device;
};

// The CUDA devices a run may use, each with the allowed CPUs nearest it (prepare_run's is
// gpu_localities; none where the caller has no GPU, as the torch-free tests).
using GpuLocator = std::function<std::vector<affinity::GpuLocality>(const affinity::Topology&)>;

// Loads and checks everything the configuration names for a student on `device`, without
// LibTorch (the torch-free pipeline tests call it; prepare_run, run.hpp, for every command);
// InputError (exit 2) naming the key, the file, or both sides of a mismatch (teacher classes vs
// dataset classes, input shapes). Under torchrun (`dist`), the sampler takes this rank's shard
// and the plan its local rank's share of the node's cores (those nearest its GPU, from `gpus`).
RunInputs load_run_inputs(const Config& config, const DistEnv& dist, const RunRequest& request,
                          const student::Device& device, const GpuLocator& gpus = {});

// kd.cache: run.cache for run.train (run.cache_file and run.cache_key too with kd.cache = disk,
// and what the file holds loaded), or nothing with kd.cache = none. InputError where a cache would
// serve wrong or no outputs (random augmentation, an image folder, several ranks), would not fit a
// quarter of the memory, or its file cannot be used. load_run_inputs calls it for the commands that
// read the cache (RunRequest::cache: train, bench-overlap); eval, export and tune-cores leave it
// out.
void prepare_teacher_cache(RunInputs& run);

// The CPUs the student's thread (and its intra-op threads) run on: the plan's student CPUs, and on
// the CPU, with train.threads above their count, the teachers' CPUs too (shared with them).
affinity::CpuList student_cpus(const RunInputs& run);

// How a loader pool or teacher replica on `cpus` competes with the student's threads
// (cores.student_first): in the background where the student's threads beyond its own CPUs
// (train.threads) run on any of them (auto), everywhere (on), or never (off).
affinity::Priority producer_priority(const RunInputs& run, const affinity::CpuList& cpus);

} // namespace kdflow::app
