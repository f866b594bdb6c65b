// The subcommands of docs/DESIGN.md, registered on a CLI11 app; run() executes the one chosen.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "all_versions.hpp"
#include "bench_overlap.hpp"
#include "cores_command.hpp"
#include "data_command.hpp"
#include "eval.hpp"
#include "export.hpp"
#include "kdflow/core/versions.hpp"
#include "report.hpp"
#include "teacher_commands.hpp"
#include "train.hpp"
#include "tune_cores.hpp"

#include <CLI/CLI.hpp>

namespace kdflow::app {

class Commands {
public:
  explicit Commands(CLI::App& app);
  // Runs the parsed subcommand and returns the exit code; throws what the subcommand throws.
  int run();

private:
  // Each subcommand's options and action, registered on `app`.
  void add_train(CLI::App& app);
  void add_eval(CLI::App& app);
  void add_export(CLI::App& app);
  void add_teacher(CLI::App& app);
  void add_cores(CLI::App& app);
  void add_tune(CLI::App& app);
  void add_overlap(CLI::App& app);
  void add_data(CLI::App& app);
  void add_report(CLI::App& app);

  CLI::App& app_;
  bool version_ = false;
  TrainArgs train_;
  TeacherArgs teacher_;
  CoresArgs cores_;
  TuneArgs tune_;
  OverlapArgs overlap_;
  EvalArgs eval_;
  ExportArgs export_;
  DataSampleArgs data_;
  ReportArgs report_;
  std::function<int()> action_;
};

} // namespace kdflow::app
