// A run's inputs from its configuration, without LibTorch (run_inputs.hpp): the data, the
// augmentation and sampler, the core plan, the teachers and kd.cache. prepare_run (run.cpp) adds
// the student's device and the GPUs as LibTorch sees them.
#include "run_inputs.hpp"

#include "data_config.hpp"
#include "run_teachers.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace kdflow::app {

RunInputs load_run_inputs(const Config& config, const DistEnv& dist, const RunRequest& request,
                          const student::Device& device, const GpuLocator& gpus) {
  const std::string format = config.get_string("data.dataset");
  const std::string path = config.get_string("data.path");
  const ImageGeometry geometry = image_geometry(config);
  RunInputs run{config,
                Dataset::load(format, path, Split::train, geometry),
                Dataset::load(format, path, Split::test, geometry),
                {},
                {},
                affinity::Topology::load(),
                {},
                device,
                dist};
  // The teachers: the configuration's (checked field by field), or the command's.
  check_geometry(geometry, run.train);
  const bool configured = !request.teachers;
  const bool teacher_configured = config.get_double("kd.alpha") > 0;
  if (configured && !config.get_tables("kd.features").empty() && !teacher_configured)
    throw InputError("kd.features: the feature losses read the teacher's values, and kd.alpha = 0 "
                     "does not run the teacher (set kd.alpha > 0)");
  const bool teachers_run = configured ? teacher_configured : !request.teachers->empty();
  if (run.train.class_names() != run.test.class_names())
    throw InputError(fmt::format("{} and {} have different class folders: labels would disagree",
                                 run.train.source(), run.test.source()));
  if (run.train.channels() != run.test.channels() || run.train.height() != run.test.height() ||
      run.train.width() != run.test.width())
    throw InputError(fmt::format(
        "{} has images of {}x{}x{} (channels x height x width) and {} of {}x{}x{}: the splits must "
        "agree",
        run.train.source(), run.train.channels(), run.train.height(), run.train.width(),
        run.test.source(), run.test.channels(), run.test.height(), run.test.width()));
  run.augment = augment_config(config, run.train);
  run.sampler = sampler_config(config);
  run.sampler.rank = dist.rank;
  run.sampler.world = dist.world;
  // kd.cache under several ranks: each keeps its own samples every epoch, so that its cache holds
  // its later epochs' batches (prepare_teacher_cache).
  run.sampler.fixed_shards =
      dist.world > 1 && teachers_run && config.get_string("kd.cache") != "none";
  if (run.train.size() < run.sampler.batch_size && run.sampler.drop_last)
    throw InputError(fmt::format("data.batch_size = {}: larger than the training set of {} ({})",
                                 run.sampler.batch_size, run.train.size(), run.train.source()));

  // The student's GPU is its local rank's; with several ranks on the node, each plans inside its
  // share of the node's cores, those nearest its GPU.
  const auto localities = gpus ? gpus(run.topology) : std::vector<affinity::GpuLocality>{};
  std::vector<std::optional<affinity::CpuList>> near(static_cast<std::size_t>(dist.local_world));
  for (std::size_t r = 0; r < near.size() && r < localities.size(); ++r)
    near[r] = localities[r].local_cpus;
  std::optional<affinity::CpuList> share;
  if (dist.local_world > 1) {
    const auto shares = affinity::rank_shares(run.topology, dist.local_world, near);
    const auto& mine = shares[static_cast<std::size_t>(dist.local_rank)];
    share = mine.cpus;
    if (mine.shared)
      log_warn(fmt::format("rank {}: {} local ranks on {} core(s): ranks share CPU(s) {} (each "
                           "rank's roles share its cores too)",
                           dist.rank, dist.local_world, run.topology.cores().size(),
                           affinity::format_cpus(mine.cpus)));
  }
  const std::vector<TeacherSpec> specs = !configured    ? *request.teachers
                                         : teachers_run ? teacher_specs(config)
                                                        : std::vector<TeacherSpec>{};
  // Several teachers share the teacher cores by their cost per sample.
  run.teacher_costs =
      teacher_costs(config, specs, {run.train.channels(), run.train.height(), run.train.width()});
  run.plan = affinity::plan_from_config(config, run.topology,
                                        near[static_cast<std::size_t>(dist.local_rank)], share,
                                        run.teacher_costs, specs.size());

  for (std::size_t k = 0; k < specs.size(); ++k) {
    const TeacherSpec& spec = specs[k];
    // The first replica of the teacher's: its width is the one plans are tuned at.
    const auto first =
        std::find(run.plan.teacher_of.begin(), run.plan.teacher_of.end(), static_cast<int>(k)) -
        run.plan.teacher_of.begin();
    const int threads =
        static_cast<std::size_t>(first) < run.plan.teacher.size()
            ? static_cast<int>(run.plan.teacher[static_cast<std::size_t>(first)].size())
            : 0;
    auto model = load_run_teacher(run, spec, spec.precision, threads);
    ImageAdapter input = teacher_input(run, spec, *model);
    run.teachers.push_back({spec, std::move(model), std::move(input)});
  }
  if (specs.size() > 1) {
    std::vector<double> weights;
    for (const TeacherSpec& spec : specs) weights.push_back(spec.weight);
    run.mix.emplace(std::move(weights), config.get_double("kd.temperature"));
  }
  if (request.cache) prepare_teacher_cache(run);
  return run;
}

affinity::Priority producer_priority(const RunInputs& run, const affinity::CpuList& cpus) {
  const std::string& mode = run.config.get_string("cores.student_first");
  if (mode == "off") return affinity::Priority::normal;
  if (mode == "on") return affinity::Priority::background;
  // Only where the run asked the student onto more CPUs than its own (train.threads): a producer
  // sharing the plan's student CPU as well (the 2-CPU plan's loaders) stays normal, since at
  // SCHED_IDLE any other busy process on that CPU would starve it.
  const affinity::CpuList student = student_cpus(run);
  if (student.size() == run.plan.student.size()) return affinity::Priority::normal;
  for (const int c : cpus)
    if (std::find(student.begin(), student.end(), c) != student.end())
      return affinity::Priority::background;
  return affinity::Priority::normal;
}

affinity::CpuList student_cpus(const RunInputs& run) {
  affinity::CpuList cpus = run.plan.student;
  const auto threads = run.config.get_int("train.threads");
  if (run.device.is_cuda() || threads <= static_cast<std::int64_t>(cpus.size())) return cpus;
  // More intra-op threads than the student's CPUs: they run on the teachers' CPUs too, where the
  // teachers run in the background (cores.student_first): the student takes what they leave.
  for (const auto& replica : run.plan.teacher)
    for (const int c : replica)
      if (std::find(cpus.begin(), cpus.end(), c) == cpus.end()) cpus.push_back(c);
  return cpus;
}

} // namespace kdflow::app
