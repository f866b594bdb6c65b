// The subcommands of docs/DESIGN.md, registered on a CLI11 app; run() executes the one chosen.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench_overlap.hpp"
#include "eval.hpp"
#include "export.hpp"
#include "kdflow/core/versions.hpp"
#include "teacher_commands.hpp"
#include "train.hpp"
#include "tune_cores.hpp"

#include <CLI/CLI.hpp>

namespace kdflow::app {

// Every module's version lines (kdflow --version, and the benchmarks' JSON).
VersionLines all_versions();

class Commands {
public:
  explicit Commands(CLI::App& app);
  // Runs the parsed subcommand and returns the exit code; throws what the subcommand throws.
  int run();

private:
  int show_cores();

  struct CoresArgs {
    std::string synthetic;
    bool json = false;
    std::string gpu_numa; // with synthetic: NUMA node of each GPU, "0" or "0,0,1,1"
    int local_world = 1;  // torchrun's ranks on the node: each one's share and plan
    std::string config;
    std::vector<std::string> sets;
  };

  CLI::App& app_;
  bool version_ = false;
  TrainArgs train_;
  TeacherArgs teacher_;
  CoresArgs cores_;
  TuneArgs tune_;
  OverlapArgs overlap_;
  EvalArgs eval_;
  ExportArgs export_;
  std::function<int()> action_;
};

} // namespace kdflow::app
