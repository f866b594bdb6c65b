// The run's teachers from the configuration: each [[teacher]] block's spec, the features it
// computes, its load at the run's batch with every check, how it reads the slot's images, and
// its cost per sample (run_teachers.hpp).
#include "run_teachers.hpp"

#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "kdflow/core/log.hpp"
#include "kdflow/cpu_teacher/graph.hpp"
#include "kdflow/cpu_teacher/passes.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kdflow::app {
namespace {

std::string shape_text(const teacher::Shape& shape) {
  std::string out;
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? "x" : "") + std::to_string(shape[i]);
  return out;
}

} // namespace

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
  return teacher_input(run, spec, model.input_shape());
}

ImageAdapter teacher_input(const RunInputs& run, const TeacherSpec& spec,
                           const teacher::Shape& in) {
  const ImageSpec data{run.train.channels(), run.train.height(), run.train.width()};
  const Normalization data_norm{run.augment.mean, run.augment.std};
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
    what.push_back(
        fmt::format("resized from {}x{} (antialiased bilinear)", data.height, data.width));
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
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(spec.path, ec)))
    throw InputError(
        fmt::format("{}.model = {}: no such file (from {}: the default teacher is trained by "
                    "scripts/train_fmnist_teacher.py; kd.alpha = 0 trains without one)",
                    spec.key, spec.path, std::filesystem::current_path().string()));
  check_input_file(spec.path, spec.key + ".model");
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
    costs.push_back(
        std::max(teacher::summarize(teacher::load_onnx(spec.path, teacher::load_options(options)))
                     .flops_per_sample,
                 1.0));
  }
  return costs;
}

namespace {

// teacher.precision = int8: calibrated on teacher.calibration_batches batches of training images
// (unaugmented, as the teacher reads them; a fixed draw by train.seed), checked against fp32 on
// the next batch.
std::shared_ptr<const teacher::Teacher> load_int8_teacher(const RunInputs& run,
                                                          const TeacherSpec& spec,
                                                          const teacher::TeacherOptions& options) {
  const teacher::Shape in =
      teacher::load_onnx(spec.path, teacher::load_options(options)).input_shape;
  const ImageAdapter adapter = teacher_input(run, spec, in);
  const auto batch = static_cast<std::size_t>(options.batch);
  const auto wanted = static_cast<std::size_t>(run.config.get_int("teacher.calibration_batches"));
  if (run.train.size() < 2 * batch)
    throw InputError(
        fmt::format("{}.precision = int8: the training set's {} samples are fewer than "
                    "two batches of {} (calibration and its check)",
                    spec.key, run.train.size(), batch));
  const std::size_t batches = std::min(wanted, run.train.size() / batch - 1);
  std::vector<std::size_t> order(run.train.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937_64 rng(static_cast<std::uint64_t>(run.config.get_int("train.seed")));
  std::shuffle(order.begin(), order.end(), rng);
  const auto per =
      static_cast<std::size_t>(adapter.to().channels) * adapter.to().height * adapter.to().width;
  std::vector<float> samples((batches + 1) * batch * per);
  SampleScratch scratch;
  std::vector<float> adapt;
  for (std::size_t k = 0; k < (batches + 1) * batch; ++k) {
    const auto image = run.train.sample(order[k], scratch);
    adapter.run(image.data(), 1, samples.data() + k * per, adapt);
  }
  log_info(fmt::format("{}: int8: calibrating on {} training images", spec.path, batches * batch));
  const std::span<const float> all(samples);
  auto t = teacher::Teacher::load_int8(spec.path, options, all.first(batches * batch * per),
                                       all.subspan(batches * batch * per),
                                       fmt::format("{}'s training images", run.train.source()));
  const auto check = *t->int8_check();
  const teacher::Calibration& c = *t->calibration();
  if (c.from_cache)
    log_info(fmt::format("{}: int8: the ranges of those images read back from {}", spec.path,
                         c.cache_file));
  else if (!c.note.empty())
    log_warn(fmt::format("{}: int8: {}", spec.path, c.note));
  log_info(fmt::format("{}: int8 against fp32 on the next {} training images: top-1 agreement "
                       "{:.2f}%, KL {:.2e}",
                       spec.path, check.samples, 100 * check.top1, check.kl));
  if (const std::string w = teacher::int8_check_warning(check, spec.path); !w.empty()) log_warn(w);
  return t;
}

} // namespace

std::shared_ptr<const teacher::Teacher> load_run_teacher(const RunInputs& run,
                                                         const TeacherSpec& spec,
                                                         teacher::Precision precision,
                                                         int threads) {
  check_teacher_file(spec);
  teacher::TeacherOptions options = teacher_options(run, spec);
  options.precision = precision;
  options.tune = teacher::parse_tune(run.config.get_string("teacher.tune"));
  options.threads = threads;
  auto loaded = precision == teacher::Precision::int8 ? load_int8_teacher(run, spec, options)
                                                      : teacher::Teacher::load(spec.path, options);
  const teacher::TuneReport& tuned = loaded->tune_report();
  if (!tuned.note.empty()) fmt::print(stderr, "kdflow: {}\n", tuned.note);
  if (tuned.mode == teacher::Tune::automatic)
    log_info(fmt::format("{}: plan at batch {} on {}: {}; {:.2f} ms per batch as timed ({})",
                         spec.path, loaded->batch(),
                         threads > 0 ? fmt::format("{} thread{}", threads, threads == 1 ? "" : "s")
                                     : std::string("the calling arena's threads"),
                         teacher::describe_passes(*loaded), tuned.tuned_ms,
                         tuned.from_cache ? "the plan cache's"
                                          : fmt::format("tuned in {:.1f} s", tuned.seconds)));
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

} // namespace kdflow::app
