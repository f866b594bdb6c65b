// Resolving a run from its configuration (each input decided once) and assembling its pipeline
// and student: what train, bench-overlap and tune-cores share (run.hpp). The teachers' loading is
// in run_teachers.cpp, kd.cache's in teacher_cache_setup.cpp, evaluation's in evaluation.cpp.
#include "run.hpp"

#include "pipeline.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/cpu_teacher/precision_names.hpp"
#include "kdflow/gpu_student/loss_table.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/settings.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <algorithm>
#include <exception>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::app {

namespace {

std::vector<std::string> names_of(const auto& rows) {
  std::vector<std::string> out;
  for (const auto& row : rows) out.push_back(row.name);
  return out;
}

// "the distillation loss: kl (...), dkd (...)": a key's doc with each row's own.
std::string doc_with(const std::string& doc, const auto& rows, const char* open,
                     const char* close) {
  std::string out = doc;
  for (const auto& row : rows)
    out += fmt::format("{} {}{}{}{}", &row == &rows.front() ? ":" : ",", row.name, open, row.doc,
                       close);
  return out;
}

} // namespace

const std::vector<ConfigKey>& run_schema() {
  static const std::vector<ConfigKey> schema = [] {
    // The keys whose values name a module's vocabulary take their choices from that module.
    const std::map<std::string, std::vector<std::string>> vocabularies = {
        {"student.arch", student::student_names()},
        {"student.stem", student::stem_names()},
        {"student.device", student::device_names()},
        {"train.amp", student::amp_names()},
        {"dist.backend", student::backend_names()},
        {"teacher.precision", teacher::precision_names()},
        {"teacher.others.precision", teacher::precision_names()},
        {"kd.loss", names_of(student::kd_losses())},
        {"kd.features.loss", names_of(student::feature_losses())}};
    const auto choose = [&](const std::string& name, ConfigKey& key) {
      if (const auto it = vocabularies.find(name); it != vocabularies.end())
        key.choices = it->second;
    };
    std::vector<ConfigKey> keys;
    for (ConfigKey key : config_schema()) {
      choose(key.name, key);
      for (ConfigKey& field : key.fields) choose(key.name + "." + field.name, field);
      if (key.name == "kd.loss") key.doc = doc_with(key.doc, student::kd_losses(), " (", ")");
      if (key.name == "kd.features")
        for (ConfigKey& field : key.fields)
          if (field.name == "loss")
            field.doc = doc_with(field.doc, student::feature_losses(), " (", ")");
      const bool kd_loss = key.name == "kd.loss";
      keys.push_back(std::move(key));
      // Each distillation loss's parameters follow kd.loss, named kd.<loss>_<param>.
      if (kd_loss)
        for (const auto& loss : student::kd_losses())
          for (const auto& param : loss.params)
            keys.push_back({student::kd_param_key(loss.name, param.name),
                            ConfigType::real,
                            param.default_value,
                            fmt::format("kd.loss = {}: {}", loss.name, param.doc),
                            {},
                            param.min,
                            param.max});
    }
    return keys;
  }();
  return schema;
}

Config resolve_config(const std::string& file, const std::vector<std::string>& sets,
                      const std::string& cores) {
  Config config(run_schema());
  if (!file.empty()) config.merge_file(file);
  // A tune-cores plan carries the teacher precision it was measured with; --set still wins.
  if (!cores.empty())
    if (const std::string p = affinity::read_plan_file(cores).teacher_precision; !p.empty())
      config.set("teacher.precision=" + p);
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
                run.train.classes(),
                config.get_string("student.path"),
                config.get_string("student.stem")};
  topt.device = run.device;
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
  topt.kd_loss = config.get_string("kd.loss");
  for (const auto& loss : student::kd_losses())
    if (loss.name == topt.kd_loss)
      for (const auto& param : loss.params)
        topt.kd_params.push_back(config.get_double(student::kd_param_key(loss.name, param.name)));
  topt.skip_nonfinite = config.get_string("train.on_nonfinite") == "skip";
  const auto& pairs = config.get_tables("kd.features");
  if (!pairs.empty() && !run.teacher_runs())
    throw std::logic_error("kd.features without a teacher");
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    student::FeatureLoss f;
    f.key = fmt::format("kd.features[{}]", k + 1);
    f.teacher = std::get<std::string>(pairs[k].at("teacher"));
    f.student = std::get<std::string>(pairs[k].at("student"));
    f.loss = std::get<std::string>(pairs[k].at("loss"));
    f.weight = std::get<double>(pairs[k].at("weight"));
    f.teacher_index = static_cast<std::size_t>(std::get<std::int64_t>(pairs[k].at("from")));
    // The teacher's outputs are its graph's, then its features (teacher_feature_names' order).
    const teacher::Teacher& model = *run.teachers.at(f.teacher_index).model;
    const auto names = model.output_names();
    const auto at =
        std::find(names.begin() + static_cast<std::ptrdiff_t>(model.graph().outputs.size()),
                  names.end(), f.teacher);
    if (at == names.end()) throw std::logic_error("kd.features value not among the teacher's");
    f.teacher_output = static_cast<std::size_t>(at - names.begin());
    const teacher::Shape shape = model.output_shape(f.teacher_output);
    f.teacher_shape.assign(shape.begin() + 1, shape.end());
    topt.feature_losses.push_back(std::move(f));
  }
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

std::unique_ptr<student::ProcessGroup> join_job(const Config& config, const DistEnv& dist,
                                                const student::Device& device) {
  // One rank joins a group only when a backend is named (the plain run otherwise): its
  // collectives are then those of a larger job, checked at world size 1.
  if (dist.world < 2 && (config.get_string("dist.backend") == "auto" || dist.master_addr.empty()))
    return nullptr;
  const student::DistOptions options{config.get_string("dist.backend"),
                                     config.get_double("dist.timeout_s"),
                                     config.get_double("dist.bucket_mb")};
  return std::make_unique<student::ProcessGroup>(dist, options, device);
}

RunInputs prepare_run(const Config& config, const DistEnv& dist, const RunRequest& request) {
  const student::Device device = request.device
                                     ? *request.device
                                     : student::resolve_device(config.get_string("student.device"),
                                                               dist.local_rank, dist.local_world);
  return load_run_inputs(config, dist, request, device, gpu_localities);
}

void Assembled::reset() noexcept {
  // The student's slots in flight belong to the ring: its stages end first, then the student goes,
  // then the ring's memory.
  if (pipeline) pipeline->stop();
  trainer.reset();
  pipeline.reset();
}

Assembled::~Assembled() { reset(); }

Assembled& Assembled::operator=(Assembled&& other) noexcept {
  if (this != &other) {
    reset();
    pipeline = std::move(other.pipeline);
    trainer = std::move(other.trainer);
  }
  return *this;
}

Assembled assemble(const RunInputs& run, const Sampler& sampler, std::uint32_t slots,
                   const student::TrainerOptions& options, StudentLogits logits,
                   std::vector<student::ColocatedTeacher> colocated) {
  Assembled parts;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  parts.pipeline = std::make_unique<CpuPipeline>(
      run, sampler, slots,
      student::allocate_pinned_for_device(
          slots * layout.slot_bytes(), affinity::bind_to_numa_of(run.topology, run.plan.student)));
  if (logits == StudentLogits::none) return parts;
  const SlotRegions& r = parts.pipeline->regions();
  student::StepRegions regions{r.loader.inputs, r.loader.labels, r.logits, {}};
  regions.mix_labels = r.loader.mix_labels;
  regions.mix_lam = r.loader.mix_lam;
  for (const auto& f : options.feature_losses)
    regions.teacher_features.push_back(
        r.features.at(f.teacher_index)
            .at(f.teacher_output - run.teachers.at(f.teacher_index).model->graph().outputs.size()));
  if (logits == StudentLogits::colocated) regions.teacher_logits.reset();
  parts.trainer = std::make_unique<student::Trainer>(options, parts.pipeline->ring(), regions);
  if (logits == StudentLogits::colocated)
    parts.trainer->set_colocated_teachers(std::move(colocated));
  return parts;
}

} // namespace kdflow::app
