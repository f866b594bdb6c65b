// kdflow report: plots of one training run or several, from their run folders (metrics.jsonl,
// summary.json, config.toml), drawn by gnuplot, and their summaries side by side.
#pragma once

#include <string>
#include <vector>

namespace kdflow::app {

struct ReportArgs {
  std::vector<std::string> runs; // run folders
  std::string out;               // default: <run>/report for one run, ./report for several
};

// Writes into --out: loss.png and accuracy.png against the step, loss_time.png and
// accuracy_time.png against the run's wall time, throughput.png (samples/s) and stages.png (the
// teacher's busy share and the student's wait share) against the step, each run a curve of its
// own; report.md, the runs side by side (the configuration keys whose values differ first, then
// each summary's figures), also printed; and report.json, the same as data. A folder that is not
// a run folder, a metrics line that is not JSON, or no gnuplot: exit 2 naming it, before anything
// is written.
int report_command(const ReportArgs& args);

} // namespace kdflow::app
