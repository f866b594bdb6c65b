// A training run's state in its checkpoints (run_state.hpp).
#include "run_state.hpp"

#include "kdflow/core/error.hpp"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

namespace kdflow::app {
using nlohmann::json;

bool shapes_trajectory(const std::string& key) {
  static const char* const free_keys[] = {
      "train.epochs",     "train.max_steps",        "train.checkpoint_every",
      "train.log_every",  "train.keep_checkpoints", "train.on_nonfinite",
      "ring.slots",       "student.device",         "train.export",
      "dist.backend",     "dist.timeout_s",         "pipeline.stall_timeout_s",
      "train.tensorboard"};
  if (key.starts_with("cores.")) return false;
  return std::none_of(std::begin(free_keys), std::end(free_keys),
                      [&](const char* k) { return key == k; });
}

json trajectory_keys(const Config& config) {
  json out = json::object();
  for (const auto& key : config.schema())
    if (shapes_trajectory(key.name)) out[key.name] = config.text(key.name);
  return out;
}

std::string RunState::text(const Config& config, int world, double wall) const {
  return json{{"next_batch", next_batch},
              {"config", trajectory_keys(config)},
              {"best_test_accuracy", best_test_accuracy},
              {"test_accuracy", test_accuracy},
              {"teacher_test_accuracy",
               teacher_test_accuracy ? json(*teacher_test_accuracy) : json(nullptr)},
              {"teachers", teachers},
              {"evaluations", evaluations},
              {"world_size", world},
              {"wall_s", wall}}
      .dump();
}

RunState RunState::read(const std::string& text, const std::string& from, const Config& config,
                        int world, std::uint64_t last) {
  RunState s;
  try {
    const json state = json::parse(text);
    const int written_world = state.value("world_size", 1);
    if (written_world != world)
      throw InputError(fmt::format(
          "checkpoint {} was written by a job of {} rank(s); this job has {} (each rank trains "
          "on its shard of every batch: resume with {} rank(s), or start a new --out)",
          from, written_world, world, written_world));
    const json written = state.value("config", json::object());
    const json expected = trajectory_keys(config);
    for (const auto& [key, value] : expected.items()) {
      const std::string was = written.value(key, std::string("<absent>"));
      if (was != value)
        throw InputError(fmt::format(
            "checkpoint {} was written with {} = {}; this run has {} (resume with the same "
            "settings, or start a new --out)",
            from, key, was, value.get<std::string>()));
    }
    s.next_batch = state.at("next_batch").get<std::uint64_t>();
    s.best_test_accuracy = state.value("best_test_accuracy", 0.0);
    s.test_accuracy = state.value("test_accuracy", 0.0);
    s.evaluations = state.value("evaluations", json::array());
    s.wall_s = state.value("wall_s", 0.0);
    if (const auto t = state.value("teacher_test_accuracy", json()); t.is_number())
      s.teacher_test_accuracy = t.get<double>();
    s.teachers = state.value("teachers", json());
  } catch (const json::exception& e) {
    throw InputError(
        fmt::format("checkpoint {}: its run state is unreadable ({})", from, e.what()));
  }
  if (s.next_batch > last)
    throw InputError(fmt::format("checkpoint {} is at batch {}, past this run's end ({}): raise "
                                 "train.epochs or train.max_steps to continue it",
                                 from, s.next_batch, last));
  return s;
}

} // namespace kdflow::app
