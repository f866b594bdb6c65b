// kd.cache made ready for a run's teachers (prepare_teacher_cache, run_inputs.hpp): refused where
// it would serve wrong outputs or not fit, its key for the disk file, and what that file holds
// read.
#include "run_inputs.hpp"

#include "kdflow/core/cache_home.hpp"
#include "kdflow/core/digest.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

namespace kdflow::app {
namespace fs = std::filesystem;
namespace {

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

// What makes a sample's teacher input differ between epochs (mixes aside): a kept output is then
// the first view's.
std::vector<std::string> random_views(const RunInputs& run) {
  std::vector<std::string> changes;
  if (run.augment.pad_crop > 0)
    changes.push_back(fmt::format("data.pad_crop = {} crops it at random", run.augment.pad_crop));
  if (run.augment.hflip) changes.emplace_back("data.hflip = true flips it at random");
  if (run.augment.jitters())
    changes.emplace_back("data.color_jitter changes its colours at random");
  if (run.train.decodes())
    changes.push_back(fmt::format(
        "{} is an image folder, whose training images are cropped at random", run.train.source()));
  return changes;
}

// kd.cache = disk: what the teacher's outputs are computed from, one "name=value" per line: the
// teacher file's bytes and precision, the teacher's input made from the data (each teacher's, and
// their mix's weights and temperature with several), the features each returns, the data's
// pixels, its random views (kd.cache_augmented), and what is kept of each sample's logits. The
// file's path leaves it out: the same bytes elsewhere are the same teacher.
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
    // int8: the ranges it quantizes with (another calibration draw gives other outputs).
    if (const teacher::Calibration* c = teacher.model->calibration())
      key += fmt::format("{}.calibration={:016x}\n", name, c->digest);
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
  // kd.cache_augmented: the outputs are of each sample's first random view, drawn as these keys
  // say (a run without random views keeps the key it always had; no path in it).
  if (!random_views(run).empty()) {
    std::vector<std::string> draws;
    for (const char* k : {"data.pad_crop", "data.hflip", "data.color_jitter", "data.resize",
                          "data.random_resized_crop", "data.crop_scale", "data.crop_ratio"})
      draws.push_back(fmt::format("{}={}", k, run.config.text(k)));
    key += fmt::format("views=first of {}\n", fmt::join(draws, " "));
  }
  key += cache.full() ? std::string("kept=all\n")
                      : fmt::format("kept={} at kd.temperature={:.9g}\n", cache.kept(),
                                    run.config.get_double("kd.temperature"));
  return key;
}

void prepare_teacher_cache_into(RunInputs& run) {
  const std::string mode = run.config.get_string("kd.cache");
  if (mode == "none" || !run.teacher_runs()) return;
  // A mix pairs a sample with another at random: a kept target would be another pair's.
  if (run.augment.mixes())
    throw InputError(fmt::format("kd.cache = {}: data.mixup_alpha/data.cutmix_alpha mix each "
                                 "sample with another at random, and the targets follow the mix: "
                                 "set kd.cache = none",
                                 mode));
  const std::vector<std::string> changes = random_views(run);
  if (!changes.empty() && !run.config.get_bool("kd.cache_augmented"))
    throw InputError(fmt::format("kd.cache = {}: the teacher's input for a sample changes every "
                                 "epoch ({}): set kd.cache = none, or kd.cache_augmented = true "
                                 "to serve each sample's first view's outputs in later epochs",
                                 mode, fmt::join(changes, "; ")));
  if (!changes.empty())
    log_info(fmt::format("kd.cache_augmented: later epochs read the teacher's outputs for each "
                         "sample's first view, not for the view they train on ({})",
                         fmt::join(changes, "; ")));
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
  check_output_path(run.cache_file, "kd.cache_path");
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

} // namespace kdflow::app
