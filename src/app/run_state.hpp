// What a training run's checkpoint carries beside the student: where the run is (the next batch),
// what it measured so far (accuracies, evaluations, wall time) and the keys that decide its
// trajectory, which a resumed run must share to continue it exactly.
#pragma once

#include "kdflow/core/config.hpp"

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace kdflow::app {

// Whether `key` decides a run's trajectory (epochs, step limits, logging, checkpoint cadence,
// devices and the cores may change between a run and its resume; nothing else).
bool shapes_trajectory(const std::string& key);
// Every trajectory key's value as the configuration writes it.
nlohmann::json trajectory_keys(const Config& config);

struct RunState {
  std::uint64_t next_batch = 0;
  double best_test_accuracy = 0, test_accuracy = 0;
  std::optional<double> teacher_test_accuracy; // measured once, at the run's start
  nlohmann::json teachers = nullptr; // several teachers: each one's model, weight, accuracy alone
  nlohmann::json evaluations = nlohmann::json::array();
  double wall_s = 0; // before this process

  // The state as a checkpoint keeps it (`wall_s`: the run's time so far).
  [[nodiscard]] std::string text(const Config& config, int world, double wall_s) const;
  // A checkpoint's state (`from` names it), checked against this run: the same world size and
  // trajectory keys, and a next batch within `last`. InputError naming the checkpoint otherwise.
  static RunState read(const std::string& text, const std::string& from, const Config& config,
                       int world, std::uint64_t last);
};

} // namespace kdflow::app
