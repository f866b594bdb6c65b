// Resolving a run from its configuration (each input decided once) and assembling its pipeline
// and student: what train, bench-overlap and tune-cores share (run.hpp).
#include "run.hpp"

#include "pipeline.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/cache_home.hpp"
#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/cpu_teacher/passes.hpp"
#include "kdflow/gpu_student/loss_table.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <filesystem>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

namespace kdflow::app {
namespace fs = std::filesystem;
namespace {

std::vector<float> parse_floats(const std::string& text, const std::string& key,
                                std::size_t channels, bool positive) {
  std::vector<float> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const float v = std::strtof(item.c_str(), &end);
    if (item.empty() || end == item.c_str() || *end != '\0' || !std::isfinite(v) ||
        (positive && !(v > 0)))
      throw InputError(fmt::format("{} = \"{}\": '{}' is not a {}finite number", key, text, item,
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

// The feature values a sample keeps in the cache: every teacher's features (teacher.features,
// kd.features), in the slot's order.
std::size_t cached_feature_floats(const RunInputs& run) {
  std::size_t floats = 0;
  for (const RunTeacher& teacher : run.teachers) {
    const teacher::Teacher& t = *teacher.model;
    for (std::size_t j = t.graph().outputs.size(); j < t.output_names().size(); ++j) {
      const teacher::Shape shape = t.output_shape(j);
      floats += static_cast<std::size_t>(teacher::numel(shape) / shape.at(0));
    }
  }
  return floats;
}

// kd.cache = disk: what the teacher's outputs are computed from, one "name=value" per line: the
// teacher file's bytes and precision, the teacher's input made from the data (each teacher's, and
// their mix's weights and temperature with several), the features each returns, the data's
// pixels, and what is kept of each sample's logits. The file's path leaves it out: the same bytes
// elsewhere are the same teacher.
std::string teacher_cache_key(const RunInputs& run, const TeacherOutputCache& cache) {
  const auto spec = [](const ImageSpec& s) {
    return fmt::format("{}x{}x{}", s.channels, s.height, s.width);
  };
  std::string key = "kdflow teacher outputs\n";
  for (std::size_t k = 0; k < run.teachers.size(); ++k) {
    const RunTeacher& teacher = run.teachers[k];
    // The names earlier kdflows wrote: a one-teacher file stays readable.
    const std::string name = k == 0 ? "teacher" : fmt::format("teacher{}", k);
    const ImageAdapter& adapt = teacher.input;
    key += fmt::format("{}={}\n", name, file_digest(teacher.spec.path));
    key += fmt::format("{}.precision={}\n", name, teacher::precision_name(teacher.spec.precision));
    key += fmt::format("{}.input={} from {} mean={:.9g} std={:.9g}\n", name, spec(adapt.to()),
                       spec(adapt.from()), fmt::join(adapt.to_norm().mean, ","),
                       fmt::join(adapt.to_norm().std, ","));
    // The features the teacher returns beside its graph's outputs; a run without features keeps
    // the key it always had.
    const teacher::Teacher& t = *teacher.model;
    const auto outputs = t.output_names();
    if (outputs.size() > t.graph().outputs.size())
      key += fmt::format(
          "{}.features={}\n", name,
          fmt::join(outputs.begin() + static_cast<std::ptrdiff_t>(t.graph().outputs.size()),
                    outputs.end(), ","));
  }
  if (run.mix) {
    std::vector<double> weights;
    for (const double w : run.mix->log_weights()) weights.push_back(std::exp(w));
    key += fmt::format("mix={:.9g} at kd.temperature={:.9g}\n", fmt::join(weights, ","),
                       run.mix->temperature());
  }
  key += fmt::format("data={:016x} {}x{}x{}x{}\n", run.train.pixel_digest(), run.train.size(),
                     run.train.channels(), run.train.height(), run.train.width());
  key += fmt::format("classes={}\n", cache.classes());
  key += cache.full() ? std::string("kept=all\n")
                      : fmt::format("kept={} at kd.temperature={:.9g}\n", cache.kept(),
                                    run.config.get_double("kd.temperature"));
  return key;
}

void prepare_teacher_cache_into(RunInputs& run) {
  const std::string mode = run.config.get_string("kd.cache");
  if (mode == "none" || !run.teacher_runs()) return;
  std::string changes;
  if (run.augment.pad_crop > 0)
    changes = fmt::format("data.pad_crop = {} crops it at random", run.augment.pad_crop);
  else if (run.augment.hflip)
    changes = "data.hflip = true flips it at random";
  else if (run.train.decodes())
    changes = fmt::format("{} is an image folder, whose training images are cropped at random",
                          run.train.source());
  if (!changes.empty())
    throw InputError(fmt::format("kd.cache = {}: the teacher's input for a sample changes every "
                                 "epoch ({}): set kd.cache = none",
                                 mode, changes));
  const auto classes = static_cast<std::size_t>(run.teachers.front().model->output_shape(0)[1]);
  const auto top_k = static_cast<std::size_t>(run.config.get_int("kd.cache_topk"));
  const std::size_t kept = top_k == 0 || top_k >= classes ? classes : top_k;
  const std::size_t features = cached_feature_floats(run);
  const double bytes =
      static_cast<double>(run.train.size()) *
      static_cast<double>((kept == classes ? 4 * classes : 8 * kept + 4) + 4 * features);
  const double memory =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  // Every rank on this machine keeps one; on disk, a save or a read holds the file's bytes beside
  // it.
  const double local = static_cast<double>(std::max(run.dist.local_world, 1));
  const double copies = mode == "disk" ? 2.0 : 1.0;
  if (bytes * copies * local > memory / 4)
    throw InputError(fmt::format(
        "kd.cache = {}: {:.1f} GiB for {} samples x {} logits{}{}{}, over a quarter of this "
        "machine's {:.1f} GiB: set kd.cache_topk (each sample then keeps K logits){}",
        mode, bytes * copies * local / (1 << 30), run.train.size(), kept,
        features > 0 ? fmt::format(" and {} feature values", features) : "",
        copies > 1 ? " (twice: the cache and its file's bytes while it is saved or read)" : "",
        local > 1 ? fmt::format(" on each of {} local ranks", run.dist.local_world) : "",
        memory / (1 << 30),
        features > 0 ? ", name fewer or smaller features, or set kd.cache = none" : ""));
  run.cache = std::make_shared<TeacherOutputCache>(
      run.train.size(), classes, top_k, run.config.get_double("kd.temperature"), features);
  const TeacherOutputCache& cache = *run.cache;
  const std::string held =
      fmt::format("the {} outputs for {} samples ({} logits each{}{}, {:.1f} MiB)",
                  run.teachers.size() > 1 ? fmt::format("{} teachers' mixed", run.teachers.size())
                                          : std::string("teacher's"),
                  cache.samples(), cache.kept(), cache.full() ? "" : " and the rest's share",
                  features > 0 ? fmt::format(" and {} feature values", features) : "",
                  static_cast<double>(cache.bytes()) / (1 << 20));
  if (mode == "memory") {
    if (const std::string path = run.config.get_string("kd.cache_path"); !path.empty())
      throw InputError(fmt::format("kd.cache_path = {}: kd.cache = memory keeps no file (set "
                                   "kd.cache = disk to keep the outputs there)",
                                   path));
    log_info(fmt::format("kd.cache = memory: {} are kept from their first batch", held));
    return;
  }

  // disk: the file named, or one per key in kdflow's cache folder.
  run.cache_key = teacher_cache_key(run, cache);
  const std::string named = run.config.get_string("kd.cache_path");
  if (named.empty()) {
    const fs::path home = cache_home();
    if (home.empty())
      throw InputError("kd.cache = disk: no cache folder (KDFLOW_CACHE_DIR, XDG_CACHE_HOME and "
                       "HOME are unset): set kd.cache_path");
    run.cache_file = home / "teacher-outputs" /
                     fmt::format("{:016x}.kdcache", fnv1a(std::as_bytes(std::span(run.cache_key))));
    std::error_code ec;
    fs::create_directories(run.cache_file.parent_path(), ec);
    if (ec)
      throw InputError(fmt::format("kd.cache = disk: cannot make the cache folder {}: {}",
                                   run.cache_file.parent_path().string(), ec.message()));
  } else {
    run.cache_file = named;
  }
  // Several ranks each keep their own shard's outputs (the sampler's fixed shards), in their own
  // file: an entry is the teacher's output for its sample whoever computed it, so a file serves
  // any later run with the same key.
  if (run.dist.world > 1)
    run.cache_file += fmt::format(".rank{}-of-{}", run.dist.rank, run.dist.world);
  if (fs::is_directory(run.cache_file))
    throw InputError(fmt::format("kd.cache_path = {}: a folder, not a file", named));
  const fs::path folder = fs::absolute(run.cache_file).parent_path();
  if (!fs::is_directory(folder))
    throw InputError(fmt::format("kd.cache_path = {}: its folder does not exist", named));
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw InputError(fmt::format("kd.cache = disk: {}: the folder {} is not writable",
                                 run.cache_file.string(), folder.string()));
  if (!fs::exists(run.cache_file)) {
    log_info(fmt::format("kd.cache = disk: {} are kept from their first batch and written to {} "
                         "at each epoch's end (none there yet)",
                         held, run.cache_file.string()));
    return;
  }
  std::size_t loaded = 0;
  try {
    loaded = run.cache->load(run.cache_file, run.cache_key);
  } catch (const InputError& e) {
    throw InputError(fmt::format("kd.cache = disk: {}; delete the file to compute the outputs "
                                 "again{}",
                                 e.what(), named.empty() ? "" : ", or set another kd.cache_path"));
  }
  log_info(fmt::format("kd.cache = disk: {} read for {} of {} samples from {}{}", held, loaded,
                       cache.samples(), run.cache_file.string(),
                       loaded == cache.samples() ? ": the teacher runs for none" : ""));
}

} // namespace

void prepare_teacher_cache(RunInputs& run) {
  // Refused or not, no cache of an earlier call is left behind.
  const auto clear = [&] {
    run.cache.reset();
    run.cache_file.clear();
    run.cache_key.clear();
  };
  clear();
  try {
    prepare_teacher_cache_into(run);
  } catch (...) {
    clear();
    throw;
  }
}

const std::vector<ConfigKey>& run_schema() {
  static const std::vector<ConfigKey> schema = [] {
    std::vector<ConfigKey> keys;
    for (ConfigKey key : config_schema()) {
      if (key.name == "student.arch") key.choices = student::student_names();
      if (key.name == "kd.features")
        for (ConfigKey& field : key.fields)
          if (field.name == "loss") {
            field.choices.clear();
            for (const auto& loss : student::feature_losses()) field.choices.push_back(loss.name);
            field.doc = "the feature loss";
            for (const auto& loss : student::feature_losses())
              field.doc += fmt::format("{} {}: {}", loss.name == field.choices.front() ? ":" : ";",
                                       loss.name, loss.doc);
          }
      const bool kd_loss = key.name == "kd.loss";
      if (kd_loss) {
        key.doc = "the distillation loss";
        for (const auto& loss : student::kd_losses()) {
          key.choices.push_back(loss.name);
          key.doc += fmt::format("{} {} ({})", loss.name == key.choices.front() ? ":" : ",",
                                 loss.name, loss.doc);
        }
      }
      keys.push_back(std::move(key));
      // Each loss's parameters follow kd.loss, named kd.<loss>_<param>.
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
                config.get_string("student.path")};
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

std::unique_ptr<student::ProcessGroup> join_job(const Config& config, const DistEnv& dist) {
  if (dist.world < 2) return nullptr;
  const student::DistOptions options{config.get_string("dist.backend"),
                                     config.get_double("dist.timeout_s"),
                                     config.get_double("dist.bucket_mb")};
  return std::make_unique<student::ProcessGroup>(
      dist, options, student::resolve_device(config.get_string("student.device"), dist.local_rank));
}

RunInputs prepare_run(const Config& config, const DistEnv& dist, const RunRequest& request) {
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
                student::resolve_device(config.get_string("student.device"), dist.local_rank),
                dist};
  // The teachers: the configuration's (checked field by field), or the command's.
  const bool configured = !request.teachers;
  const bool teacher_configured = config.get_double("kd.alpha") > 0;
  if (configured && !config.get_tables("kd.features").empty() && !teacher_configured)
    throw InputError("kd.features: the feature losses read the teacher's values, and kd.alpha = 0 "
                     "does not run the teacher (set kd.alpha > 0)");
  const bool teachers_run = configured ? teacher_configured : !request.teachers->empty();
  if (run.train.class_names() != run.test.class_names())
    throw InputError(fmt::format("{} and {} have different class folders: labels would disagree",
                                 run.train.source(), run.test.source()));
  const auto channels = static_cast<std::size_t>(run.train.channels());
  const std::string mean = config.get_string("data.mean"), std_dev = config.get_string("data.std");
  const auto& defaults = dataset_format(format).normalization;
  run.augment.mean =
      mean == "auto" ? defaults.mean : parse_floats(mean, "data.mean", channels, false);
  run.augment.std =
      std_dev == "auto" ? defaults.std : parse_floats(std_dev, "data.std", channels, true);
  run.augment.normalize = config.get_string("data.slot_dtype") == "float32";
  run.augment.pad_crop = static_cast<int>(config.get_int("data.pad_crop"));
  run.augment.hflip = config.get_bool("data.hflip");
  run.sampler.batch_size = static_cast<std::size_t>(config.get_int("data.batch_size"));
  run.sampler.seed = static_cast<std::uint64_t>(config.get_int("train.seed"));
  run.sampler.drop_last = config.get_bool("data.drop_last");
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
  const auto gpus = gpu_localities(run.topology);
  std::vector<std::optional<affinity::CpuList>> near(static_cast<std::size_t>(dist.local_world));
  for (std::size_t r = 0; r < near.size() && r < gpus.size(); ++r) near[r] = gpus[r].local_cpus;
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

TeacherSpec configured_teacher(const Config& config) {
  TeacherSpec first;
  first.key = "teacher";
  first.path = config.get_string("teacher.model");
  first.precision = teacher::parse_precision(config.get_string("teacher.precision"));
  first.weight = config.get_double("teacher.weight");
  first.input_size = config.get_string("teacher.input_size");
  first.mean = config.get_string("teacher.mean");
  first.std = config.get_string("teacher.std");
  return first;
}

std::vector<TeacherSpec> teacher_specs(const Config& config) {
  std::vector<TeacherSpec> specs;
  TeacherSpec first = configured_teacher(config);
  first.features = teacher_feature_names(config);
  specs.push_back(std::move(first));
  const auto& rows = config.get_tables("teacher.others");
  for (std::size_t k = 0; k < rows.size(); ++k) {
    const auto text = [&](const char* field) { return std::get<std::string>(rows[k].at(field)); };
    TeacherSpec spec;
    spec.key = fmt::format("teacher.others[{}]", k + 1);
    spec.path = text("model");
    if (spec.path.empty())
      throw InputError(fmt::format("{}.model: required (the teacher's ONNX file)", spec.key));
    spec.precision = teacher::parse_precision(text("precision"));
    spec.weight = std::get<double>(rows[k].at("weight"));
    spec.input_size = text("input_size");
    spec.mean = text("mean");
    spec.std = text("std");
    spec.features = teacher_feature_names(config, k + 1);
    specs.push_back(std::move(spec));
  }
  return specs;
}

ImageAdapter teacher_input(const RunInputs& run, const TeacherSpec& spec,
                           const teacher::Teacher& model) {
  const ImageSpec data{run.train.channels(), run.train.height(), run.train.width()};
  const Normalization data_norm{run.augment.mean, run.augment.std};
  const teacher::Shape in = model.input_shape();
  const std::string& mean = spec.mean;
  const std::string& stdev = spec.std;
  if (in == teacher::Shape{in[0], data.channels, data.height, data.width} && mean == "auto" &&
      stdev == "auto")
    return {data, data_norm, data, data_norm}; // the slot's images as they are
  if (in.size() != 4)
    throw InputError(fmt::format(
        "{}: the teacher takes samples of shape {}, not images [channels, height, width]: the "
        "data's {}x{}x{} images cannot be made its input",
        spec.path, shape_text({in.begin() + 1, in.end()}), data.channels, data.height, data.width));
  const ImageSpec own{static_cast<int>(in[1]), static_cast<int>(in[2]), static_cast<int>(in[3])};
  if (own.channels != data.channels && data.channels != 1)
    throw InputError(fmt::format("{}: the teacher reads {}-channel images and the data's have {} "
                                 "(only a 1-channel image can be repeated for it)",
                                 spec.path, own.channels, data.channels));
  const auto channels = static_cast<std::size_t>(own.channels);
  const auto repeated = [&](const std::vector<float>& v) {
    return v.size() == channels ? v : std::vector<float>(channels, v.front());
  };
  const Normalization own_norm{
      mean == "auto" ? repeated(data_norm.mean)
                     : parse_floats(mean, spec.key + ".mean", channels, false),
      stdev == "auto" ? repeated(data_norm.std)
                      : parse_floats(stdev, spec.key + ".std", channels, true)};
  ImageAdapter adapter(data, data_norm, own, own_norm);
  std::vector<std::string> what;
  if (adapter.resizes())
    what.push_back(fmt::format("resized from {}x{}{}", data.height, data.width,
                               adapter.box() > 1 ? fmt::format(" (box {} first)", adapter.box())
                                                 : std::string()));
  if (own.channels != data.channels)
    what.push_back(fmt::format("channel repeated {} times", own.channels));
  if (own_norm != Normalization{repeated(data_norm.mean), repeated(data_norm.std)})
    what.push_back(fmt::format("normalized with {}.mean/std", spec.key));
  if (!what.empty())
    fmt::print(stderr, "kdflow: the teacher {} reads {}x{}x{} images: the data's, {}\n", spec.path,
               own.channels, own.height, own.width, fmt::join(what, ", "));
  return adapter;
}

std::vector<std::string> teacher_feature_names(const Config& config, std::size_t teacher) {
  const auto& rows = config.get_tables("teacher.others");
  std::vector<std::string> names =
      teacher == 0 ? config.get_strings("teacher.features")
      : teacher <= rows.size()
          ? std::get<std::vector<std::string>>(rows[teacher - 1].at("features"))
          : std::vector<std::string>{};
  const auto& pairs = config.get_tables("kd.features");
  const std::size_t others = rows.size();
  for (std::size_t k = 0; k < pairs.size(); ++k) {
    for (const char* field : {"teacher", "student"})
      if (std::get<std::string>(pairs[k].at(field)).empty())
        throw InputError(fmt::format("kd.features[{}].{}: required (the {} value or tap the loss "
                                     "reads)",
                                     k + 1, field, field));
    const auto from = static_cast<std::size_t>(std::get<std::int64_t>(pairs[k].at("from")));
    if (from > others)
      throw InputError(fmt::format("kd.features[{}].from = {}: the run has {} teacher(s) (0 is "
                                   "[teacher], k is teacher.others[k])",
                                   k + 1, from, 1 + others));
    if (from != teacher) continue;
    const auto& value = std::get<std::string>(pairs[k].at("teacher"));
    if (std::find(names.begin(), names.end(), value) == names.end()) names.push_back(value);
  }
  return names;
}

namespace {

// What a teacher's load reads of its spec, at `batch`: its input shape (`data`: the data's sample
// shape) and its features.
teacher::TeacherOptions teacher_options(const Config& config, const TeacherSpec& spec,
                                        std::int64_t batch, const teacher::Shape& data) {
  teacher::TeacherOptions options;
  options.batch = batch;
  // The model's own input; input_size asks for (or binds) its height and width, and what the
  // model leaves open takes the data's shape.
  options.sample_shape = teacher::parse_input_size(spec.input_size, spec.key + ".input_size");
  options.sample_default = data;
  options.sample_source = spec.key + ".input_size";
  options.features = spec.features;
  options.features_source =
      spec.key +
      (config.get_tables("kd.features").empty() ? ".features" : ".features/kd.features value");
  return options;
}

teacher::TeacherOptions teacher_options(const RunInputs& run, const TeacherSpec& spec) {
  return teacher_options(run.config, spec, static_cast<std::int64_t>(run.sampler.batch_size),
                         {run.train.channels(), run.train.height(), run.train.width()});
}

void check_teacher_file(const TeacherSpec& spec) {
  if (!std::filesystem::exists(spec.path))
    throw InputError(
        fmt::format("{}.model = {}: no such file (from {}: the default teacher is trained by "
                    "scripts/train_fmnist_teacher.py; kd.alpha = 0 trains without one)",
                    spec.key, spec.path, std::filesystem::current_path().string()));
}

} // namespace

std::vector<double> teacher_costs(const Config& config, const std::vector<TeacherSpec>& specs,
                                  const teacher::Shape& data) {
  std::vector<double> costs;
  if (specs.size() < 2) return costs;
  for (const TeacherSpec& spec : specs) {
    check_teacher_file(spec);
    const teacher::TeacherOptions options =
        teacher_options(config, spec, config.get_int("data.batch_size"), data);
    teacher::LoadOptions lo;
    lo.batch = options.batch;
    lo.sample_shape = options.sample_shape;
    lo.sample_default = options.sample_default;
    lo.sample_source = options.sample_source;
    lo.keep = options.features;
    costs.push_back(
        std::max(teacher::summarize(teacher::load_onnx(spec.path, lo)).flops_per_sample, 1.0));
  }
  return costs;
}

std::shared_ptr<const teacher::Teacher> load_run_teacher(const RunInputs& run,
                                                         const TeacherSpec& spec,
                                                         teacher::Precision precision,
                                                         int threads) {
  check_teacher_file(spec);
  teacher::TeacherOptions options = teacher_options(run, spec);
  options.precision = precision;
  options.tune = teacher::parse_tune(run.config.get_string("teacher.tune"));
  options.threads = threads;
  auto loaded = teacher::Teacher::load(spec.path, options);
  if (const auto& note = loaded->tune_report().note; !note.empty())
    fmt::print(stderr, "kdflow: {}\n", note);
  const teacher::Shape out = loaded->output_shape(0);
  if (out.size() != 2 || out[1] != run.train.classes())
    throw InputError(fmt::format(
        "{}.model = {} outputs {} per sample but the dataset {} ({}) has {} classes: "
        "the teacher and data.dataset disagree",
        spec.key, spec.path,
        out.size() == 2 ? fmt::format("{} logits", out[1]) : "a " + shape_text(out) + " tensor",
        run.config.get_string("data.dataset"), run.config.get_string("data.path"),
        run.train.classes()));
  return loaded;
}

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
