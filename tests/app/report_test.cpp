// kdflow report over real runs (the binary in child processes): one run's plots and table, three
// runs side by side with the keys that differ first, the table's numbers those of each
// summary.json, and bad input as one line with exit 2. Needs gnuplot (scripts/setup.sh installs
// gnuplot-nox; the lent GPU machines lack it, so gpu_check.sh leaves these to CI).
#include "kdflow_process.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace kdflow_test;
using nlohmann::json;

// Each plot is a PNG of a plot's size (a blank canvas of gnuplot's is ~5 KB).
void expect_plots(const fs::path& dir) {
  for (const char* png : {"loss.png", "loss_time.png", "accuracy.png", "accuracy_time.png",
                          "throughput.png", "stages.png"}) {
    const std::string bytes = read_text(dir / png);
    EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << png;
    EXPECT_GT(bytes.size(), 8000u) << png;
    EXPECT_LT(bytes.size(), 2000000u) << png;
  }
}

// The table's figures are the summary's, each run's own.
void expect_summaries(const json& report, const std::vector<fs::path>& runs) {
  ASSERT_EQ(report["runs"].size(), runs.size());
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const json s = json::parse(read_text(runs[k] / "summary.json"));
    const json& got = report["runs"][k]["summary"];
    for (const char* key : {"steps", "test_accuracy", "best_test_accuracy", "samples_per_s",
                            "wall_s", "teacher_test_accuracy", "student_stall_fraction"})
      EXPECT_EQ(got[key], s[key]) << runs[k] << " " << key;
  }
}

TEST(Report, PlotsOneRunAndThreeRunsSideBySideFromTheirSummaries) {
  const std::vector<fs::path> runs = {scratch("report_a"), scratch("report_b"),
                                      scratch("report_c")};
  ASSERT_EQ(run(with(fast_train_args(runs[0]), {"train.max_steps=20"}), runs[0]).code, 0);
  ASSERT_EQ(
      run(with(fast_train_args(runs[1]), {"train.max_steps=20", "train.lr=0.05"}), runs[1]).code,
      0);
  ASSERT_EQ(run(with(fast_train_args(runs[2]), {"train.max_steps=15"}), runs[2]).code, 0);
  // A kd-ctl move's line, as a machine with CPUs to move writes it (no "step"): not plotted.
  std::ofstream(runs[2] / "metrics.jsonl", std::ios::app)
      << R"({"event":"elastic","time_s":1.5,"batch":7,"move":"loader_to_teacher","reason":"r",)"
      << R"("student_wait":0.4,"from":{"loader":[0],"teacher":[[1]]},"to":{"loader":[0],)"
      << R"("teacher":[[1]]},"move_ms":2.0})" << '\n';

  Result r = run({"report", runs[0].string()}, scratch("report_one"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_plots(runs[0] / "report");
  const json one = json::parse(read_text(runs[0] / "report" / "report.json"));
  expect_summaries(one, {runs[0]});
  EXPECT_TRUE(one["config_differences"].empty()) << one;
  const std::string md = read_text(runs[0] / "report" / "report.md");
  const json s0 = json::parse(read_text(runs[0] / "summary.json"));
  EXPECT_NE(md.find(fmt::format("| steps | {} |", s0["steps"].get<int>())), std::string::npos)
      << md;

  const fs::path three = scratch("report_three");
  r = run({"report", runs[0].string(), runs[1].string(), runs[2].string(), "--out", three.string()},
          scratch("report_three_cmd"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_plots(three);
  const json all = json::parse(read_text(three / "report.json"));
  expect_summaries(all, runs);
  std::vector<std::string> differ;
  for (const json& d : all["config_differences"]) differ.push_back(d["key"]);
  for (const char* key : {"train.lr", "train.max_steps"})
    EXPECT_NE(std::find(differ.begin(), differ.end(), key), differ.end()) << key;
  for (const std::string& key : differ)
    EXPECT_TRUE(key == "train.lr" || key == "train.max_steps" || key == "train.seed" ||
                key.starts_with("cores."))
        << "only what the runs set differs: " << key;
  // The keys that differ come first in the table, before the figures.
  const std::string table = read_text(three / "report.md");
  EXPECT_LT(table.find("| train.max_steps | 20 | 20 | 15 |"), table.find("| steps |")) << table;

  // Bad input: a folder that is no run, --out that is a file.
  r = run({"report", scratch("report_none").string()}, scratch("report_none_cmd"));
  EXPECT_EQ(r.code, 2) << r.err;
  expect_one_line_naming(r.err, scratch("report_none").string());
  r = run({"report", runs[0].string(), "--out", (runs[0] / "summary.json").string()},
          scratch("report_file_cmd"));
  EXPECT_EQ(r.code, 2) << r.err;
  expect_one_line_naming(r.err, "a file, not a folder");
  std::ofstream(runs[1] / "metrics.jsonl", std::ios::app) << R"({"step":25,"loss":"high"})" << '\n';
  r = run({"report", runs[1].string()}, scratch("report_bad_line_cmd"));
  EXPECT_EQ(r.code, 2) << r.err;
  expect_one_line_naming(r.err, (runs[1] / "metrics.jsonl").string() + ":");
}

} // namespace
