// The run folder's layout and its writes (run_folder.hpp).
#include "run_folder.hpp"

#include "tensorboard.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"
#include "kdflow/core/log.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace fs = std::filesystem;

fs::path checkpoint_name(const fs::path& folder, std::int64_t step) {
  return folder / fmt::format("step-{:09d}.ckpt", step);
}

std::vector<fs::path> list_checkpoints(const fs::path& folder) {
  std::vector<fs::path> out;
  if (!fs::is_directory(folder)) return out;
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.starts_with("step-") && name.ends_with(".ckpt") &&
        !is_atomic_temporary(entry.path()))
      out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

RunFolder::RunFolder(fs::path path) : path_(std::move(path)), checkpoints_(path_ / "checkpoints") {}

RunFolder::RunFolder(const std::string& out, const std::string& config_file)
    : RunFolder(fs::path(out)) {
  if (out.empty())
    throw InputError("--out '': name the run folder (it gets config.toml, metrics.jsonl, "
                     "summary.json and checkpoints/; the default is runs/latest)");
  check_output_path(path_, "--out");
  std::error_code ec;
  if (fs::exists(path_, ec) && !fs::is_directory(path_, ec))
    throw InputError(fmt::format("--out {}: a file, not a run folder", out));
  if (!config_file.empty() && fs::equivalent(config_file, this->config_file(), ec))
    throw InputError(fmt::format("--out {}: its config.toml is the --config file, which the run "
                                 "would overwrite with the resolved configuration (choose another "
                                 "--out, or copy the file)",
                                 out));
}

RunFolder RunFolder::existing(const std::string& dir, const std::string& option) {
  check_input_folder(dir, option);
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / "config.toml", ec))
    throw InputError(fmt::format("{} {}: no config.toml (not a kdflow run folder)", option, dir));
  return RunFolder(fs::path(dir));
}

fs::path RunFolder::export_file(const std::string& format) const {
  return path_ / (format == "onnx" ? "student.onnx" : "student.pt");
}

namespace {

// `file` lies in `run` as config.toml, metrics.jsonl, summary.json or under checkpoints/ (links
// resolved as far as the paths exist).
bool is_run_file(const fs::path& run, const fs::path& file) {
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(fs::absolute(file, ec), ec);
  const fs::path r = fs::weakly_canonical(fs::absolute(run, ec), ec);
  const fs::path rel = f.lexically_relative(r);
  if (rel.empty() || *rel.begin() == ".." || rel == ".") return false;
  return rel == "config.toml" || rel == "metrics.jsonl" || rel == "summary.json" ||
         *rel.begin() == "checkpoints" ||
         (rel == rel.filename() && rel.string().starts_with("events.out.tfevents."));
}

} // namespace

bool RunFolder::owns(const fs::path& file) const { return is_run_file(path_, file); }

bool RunFolder::owned_by_a_run(const fs::path& file) {
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(fs::absolute(file, ec), ec).parent_path();
  const fs::path run = parent.filename() == "checkpoints" ? parent.parent_path() : parent;
  return fs::is_regular_file(run / "config.toml", ec) && is_run_file(run, file);
}

fs::path RunFolder::checkpoint(std::int64_t step) const {
  const auto found = list_checkpoints(checkpoints_);
  if (step < 0) {
    if (found.empty()) throw InputError(fmt::format("--run {}: no checkpoint", path_.string()));
    return found.back();
  }
  fs::path file = checkpoint_name(checkpoints_, step);
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw InputError(fmt::format("--step {}: {} has no such checkpoint (it has {})", step,
                                 path_.string(), found.size()));
  return file;
}

std::optional<fs::path> RunFolder::checkpoint_to_resume(const std::string& resume) const {
  if (resume == "auto") {
    const auto found = list_checkpoints(checkpoints_);
    if (!found.empty()) return found.back();
    return std::nullopt;
  }
  if (!resume.empty()) {
    check_input_file(resume, "--resume");
    // Into a folder that holds another run's checkpoints, it would overwrite that run's files.
    const auto own = list_checkpoints(checkpoints_);
    std::error_code ec;
    if (!own.empty() && std::none_of(own.begin(), own.end(), [&](const fs::path& p) {
          return fs::equivalent(p, resume, ec);
        }))
      throw InputError(fmt::format(
          "--resume {}: {} holds the checkpoints of another run, which this one would overwrite "
          "(continue that run with one of its own checkpoints, or choose another --out)",
          resume, checkpoints_.string()));
    return fs::path(resume);
  }
  if (!list_checkpoints(checkpoints_).empty())
    throw InputError(fmt::format(
        "{} already holds checkpoints of a run: continue it with --resume auto, or choose "
        "another --out",
        checkpoints_.string()));
  return std::nullopt;
}

void RunFolder::open(const std::string& config_toml, bool resumed) {
  for (const fs::path& folder : {path_, checkpoints_})
    if (const std::size_t n = sweep_atomic_temporaries(folder); n > 0)
      log_info(fmt::format("removed {} unfinished temporary file(s) from {}", n, folder.string()));
  std::error_code ec;
  fs::create_directories(checkpoints_, ec);
  if (ec)
    throw InputError(fmt::format("--out {}: cannot make {} ({})", path_.string(),
                                 checkpoints_.string(), ec.message()));
  write_file_atomic(config_file(), config_toml);
  const fs::path metrics = path_ / "metrics.jsonl";
  metrics_.open(metrics, resumed ? std::ios::app : std::ios::trunc);
  if (!metrics_) throw InputError(fmt::format("cannot write {}", metrics.string()));
}

RunFolder::~RunFolder() = default;

void RunFolder::open_events(std::int64_t step,
                            const std::vector<std::pair<std::string, std::string>>& texts) {
  std::lock_guard lock(metrics_mutex_);
  events_ = std::make_unique<EventWriter>(path_);
  // What earlier starts logged after the step this one goes on from is dropped by TensorBoard
  // (a step's own points, logged before its checkpoint, stay).
  events_->session_start(step + 1);
  for (const auto& [tag, text] : texts) events_->text(tag, step, text);
  events_->flush();
}

void RunFolder::set_metrics_listener(std::function<void(const std::string&)> listener) {
  std::lock_guard lock(metrics_mutex_);
  listener_ = std::move(listener);
}

void RunFolder::write_metrics(const nlohmann::json& line) {
  std::lock_guard lock(metrics_mutex_);
  const std::string text = line.dump();
  metrics_ << text << '\n' << std::flush;
  if (listener_) listener_(text);
  if (!events_) return;
  const std::string group = line.contains("event") ? line["event"].get<std::string>() : "train";
  const auto step = line.contains("step") ? line["step"].get<std::int64_t>()
                                          : line.value("batch", std::int64_t{0});
  for (const auto& [key, value] : line.items())
    if (key != "step" && value.is_number())
      events_->scalar(group + "/" + key, step, value.get<double>());
  events_->flush();
}

void RunFolder::save_checkpoint(std::int64_t step,
                                const std::function<void(const fs::path&)>& write,
                                std::size_t keep) {
  write(checkpoint_name(checkpoints_, step));
  const auto all = list_checkpoints(checkpoints_);
  for (std::size_t i = 0; i + keep < all.size(); ++i) fs::remove(all[i]);
}

void RunFolder::write_summary(const nlohmann::json& summary) {
  write_file_atomic(path_ / "summary.json", summary.dump(2) + "\n");
}

} // namespace kdflow::app
