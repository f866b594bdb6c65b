// A training run's folder, the one place that knows its layout: config.toml (the resolved
// configuration), metrics.jsonl (a line per log interval, evaluation and kd-ctl move),
// TensorBoard's events.out.tfevents.* (the same numbers; one file per start of the run),
// summary.json, the exported student, and checkpoints/step-NNNNNNNNN.ckpt (atomic, the newest K
// kept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace kdflow::app {

class EventWriter;

// A run folder's checkpoint of `step`, and the finished checkpoints in `folder`, oldest first
// (temporaries of a killed writer are skipped).
std::filesystem::path checkpoint_name(const std::filesystem::path& folder, std::int64_t step);
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& folder);

class RunFolder {
public:
  // The folder a run writes (`out`, --out), checked before anything is written: InputError when
  // it is empty (the current folder would take the run's files) or when its config.toml is the
  // `config_file` (--config) the run reads.
  RunFolder(const std::string& out, const std::string& config_file);
  // An existing run's folder, to read (export): InputError naming `option` when it holds no
  // config.toml.
  static RunFolder existing(const std::string& dir, const std::string& option);
  ~RunFolder();
  RunFolder(RunFolder&&) = delete;
  RunFolder& operator=(RunFolder&&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] std::filesystem::path config_file() const { return path_ / "config.toml"; }
  [[nodiscard]] const std::filesystem::path& checkpoints() const { return checkpoints_; }
  // Whether `file` is one of the run's own files (config.toml, metrics.jsonl, summary.json, what
  // is under checkpoints/), which another command must never replace; and whether it is one of any
  // run folder's (the same names beside a config.toml).
  [[nodiscard]] bool owns(const std::filesystem::path& file) const;
  [[nodiscard]] static bool owned_by_a_run(const std::filesystem::path& file);
  // The exported student's file for `format` (onnx or torchscript).
  [[nodiscard]] std::filesystem::path export_file(const std::string& format) const;
  // The checkpoint of `step` (InputError naming --step and the folder when there is none), or the
  // newest (step < 0; InputError when there is none).
  [[nodiscard]] std::filesystem::path checkpoint(std::int64_t step) const;

  // The checkpoint a run continues from, picked before anything is written: `resume` = "auto"
  // (the newest, if any), a path, or "" (none: a folder that holds checkpoints is then refused,
  // as is a path into a folder holding another run's).
  [[nodiscard]] std::optional<std::filesystem::path>
  checkpoint_to_resume(const std::string& resume) const;

  // Opens the folder for the run's writes: the temporaries of a writer killed mid-write go,
  // checkpoints/ is made, config.toml written and metrics.jsonl opened (appended to when
  // `resumed`).
  void open(const std::string& config_toml, bool resumed);
  // TensorBoard's events from here on (train.tensorboard): a new event file beside any earlier
  // start's, beginning with a session start and `texts` (tag, text: the configuration, the core
  // plan) at `step`, the step the run starts (or resumes) from.
  void open_events(std::int64_t step,
                   const std::vector<std::pair<std::string, std::string>>& texts);
  // One metrics line (from the student and kd-ctl's thread: serialized), flushed. With events
  // open, each of its numbers is also a TensorBoard scalar at the line's step (kd-ctl's moves:
  // their batch), tagged "<event>/<key>" ("train/<key>" for the interval lines).
  void write_metrics(const nlohmann::json& line);
  // Called with each metrics line's JSON text after it is written (under the metrics lock).
  void set_metrics_listener(std::function<void(const std::string&)> listener);
  // Writes step `step`'s checkpoint through `write` (given its path), then removes all but the
  // newest `keep`.
  void save_checkpoint(std::int64_t step,
                       const std::function<void(const std::filesystem::path&)>& write,
                       std::size_t keep);
  void write_summary(const nlohmann::json& summary);

private:
  explicit RunFolder(std::filesystem::path path);
  std::filesystem::path path_, checkpoints_;
  std::ofstream metrics_;
  std::mutex metrics_mutex_;
  std::unique_ptr<EventWriter> events_; // under metrics_mutex_
  std::function<void(const std::string&)> listener_;
};

} // namespace kdflow::app
