// kdflow report (report.hpp): each run folder read and checked first, then the data files and one
// gnuplot script for every plot, the PNGs moved into place once gnuplot has drawn them all.
#include "report.hpp"

#include "gnuplot.hpp"
#include "run.hpp"
#include "run_folder.hpp"

#include "kdflow/core/atomic_file.hpp"
#include "kdflow/core/config.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/input_file.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <sstream>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace kdflow::app {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::uint64_t kMaxMetricsBytes = std::uint64_t{1} << 30;

struct Run {
  std::string name;
  fs::path path;
  std::vector<json> intervals; // metrics.jsonl's interval lines
  std::vector<json> evals;     // its evaluations (or summary.json's, from a run before eval lines)
  std::optional<double> teacher_accuracy;
  json summary; // null where the run wrote none (running, or killed)
  Config config;
};

json read_json_file(const fs::path& file, const std::string& what) {
  const json j = json::parse(read_input_file(file, what, kMaxMetricsBytes), nullptr, false);
  if (j.is_discarded()) throw InputError(fmt::format("{} {}: not JSON", what, file.string()));
  return j;
}

Run read_run(const std::string& dir) {
  const RunFolder folder = RunFolder::existing(dir, "kdflow report: run folder");
  Run run{.name = folder.path().filename().string(),
          .path = folder.path(),
          .config = Config(run_schema())};
  if (run.name.empty()) run.name = folder.path().parent_path().filename().string();
  run.config.merge_file(folder.config_file());
  const fs::path metrics = folder.path() / "metrics.jsonl";
  std::istringstream lines(read_input_file(metrics, "the run's metrics", kMaxMetricsBytes));
  std::size_t n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    if (line.empty()) continue;
    json m = json::parse(line, nullptr, false);
    const auto bad = [&](const std::string& why) {
      return InputError(fmt::format("{}:{}: {}", metrics.string(), n, why));
    };
    if (m.is_discarded() || !m.is_object()) throw bad("not a JSON object");
    const json event = m.value("event", json(""));
    if (!event.is_string()) throw bad("\"event\" is not a string");
    // kd-ctl's moves and any other event: not plotted.
    if (!event.get<std::string>().empty() && event.get<std::string>() != "eval") continue;
    if (!m.value("step", json()).is_number()) throw bad("no numeric \"step\"");
    for (const char* key :
         {"loss", "kd_loss", "ce_loss", "train_accuracy", "samples_per_s", "teacher_busy",
          "student_wait_ms", "interval_s", "wall_s", "test_accuracy", "teacher_test_accuracy"})
      if (m.contains(key) && !m[key].is_number() && !m[key].is_null())
        throw bad(fmt::format("\"{}\" is not a number", key));
    if (event.get<std::string>().empty()) {
      run.intervals.push_back(std::move(m));
    } else {
      if (m.value("teacher_test_accuracy", json()).is_number())
        run.teacher_accuracy = m["teacher_test_accuracy"].get<double>();
      if (m.value("test_accuracy", json()).is_number()) run.evals.push_back(std::move(m));
    }
  }
  const fs::path summary = folder.path() / "summary.json";
  std::error_code ec;
  if (fs::exists(summary, ec)) {
    run.summary = read_json_file(summary, "the run's summary");
    if (!run.summary.is_object())
      throw InputError(fmt::format("the run's summary {}: not a JSON object", summary.string()));
    // A run from before the evaluation lines: summary.json's evaluations.
    if (const json e = run.summary.value("evaluations", json()); run.evals.empty() && e.is_array())
      for (const json& row : e)
        if (row.is_object() && row.value("step", json()).is_number() &&
            row.value("test_accuracy", json()).is_number())
          run.evals.push_back(row);
    if (!run.teacher_accuracy && run.summary.value("teacher_test_accuracy", json()).is_number())
      run.teacher_accuracy = run.summary["teacher_test_accuracy"].get<double>();
  }
  return run;
}

// A number for gnuplot, or its missing-value mark.
std::string value(const json& line, const char* key) {
  const auto it = line.find(key);
  return it != line.end() && it->is_number() ? fmt::format("{:.9g}", it->get<double>()) : "?";
}

std::string interval_data(const Run& run) {
  std::string out = "# step wall_s loss kd_loss ce_loss train_accuracy samples_per_s "
                    "teacher_busy student_wait_share\n";
  for (const json& m : run.intervals) {
    std::string wait = "?";
    const json waited = m.value("student_wait_ms", json()), span = m.value("interval_s", json());
    if (waited.is_number() && span.is_number() && span.get<double>() > 0)
      wait = fmt::format("{:.9g}", waited.get<double>() / 1e3 / span.get<double>());
    out += fmt::format("{} {} {} {} {} {} {} {} {}\n", value(m, "step"), value(m, "wall_s"),
                       value(m, "loss"), value(m, "kd_loss"), value(m, "ce_loss"),
                       value(m, "train_accuracy"), value(m, "samples_per_s"),
                       value(m, "teacher_busy"), wait);
  }
  return out;
}

std::string eval_data(const Run& run) {
  std::string out = "# step wall_s test_accuracy\n";
  for (const json& e : run.evals)
    out +=
        fmt::format("{} {} {}\n", value(e, "step"), value(e, "wall_s"), value(e, "test_accuracy"));
  return out;
}

// One PNG: `series` are gnuplot plot clauses.
std::string figure(const fs::path& png, const std::string& title, const std::string& xlabel,
                   const std::string& ylabel, const std::vector<std::string>& series) {
  std::string out =
      fmt::format("set output {}\nset title {} noenhanced\nset xlabel {}\nset ylabel {}\nplot ",
                  gnuplot_quoted(png.string()), gnuplot_quoted(title), gnuplot_quoted(xlabel),
                  gnuplot_quoted(ylabel));
  for (std::size_t i = 0; i < series.size(); ++i) out += (i == 0 ? "" : ", ") + series[i];
  return out + "\n";
}

// The figures of summary.json the table compares, in its order.
const std::vector<std::string>& figure_keys() {
  static const std::vector<std::string> keys = {"steps",
                                                "epochs",
                                                "test_accuracy",
                                                "best_test_accuracy",
                                                "teacher_test_accuracy",
                                                "samples_per_s",
                                                "wall_s",
                                                "student_stall_fraction",
                                                "teacher_busy_fraction",
                                                "device",
                                                "teacher",
                                                "precision",
                                                "interrupted"};
  return keys;
}

std::string cell(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

} // namespace

int report_command(const ReportArgs& args) {
  if (args.runs.empty()) throw InputError("kdflow report: name at least one run folder");
  std::vector<Run> runs;
  for (const std::string& dir : args.runs) runs.push_back(read_run(dir));
  // Absolute: gnuplot runs in a scratch folder of its own.
  const fs::path out = fs::absolute(!args.out.empty()  ? fs::path(args.out)
                                    : runs.size() == 1 ? runs.front().path / "report"
                                                       : fs::path("report"));
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw InputError(fmt::format("--out {}: a file, not a folder", out.string()));
  check_output_path(out, "--out");
  if (!gnuplot_installed())
    throw InputError("kdflow report: gnuplot is not installed here (scripts/setup.sh installs "
                     "gnuplot-nox)");
  fs::create_directories(out, ec);
  if (ec)
    throw InputError(fmt::format("--out {}: cannot make it ({})", out.string(), ec.message()));

  // The data and the plots.
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> loss_step, loss_time, acc_step, acc_time, rate, stages;
  const bool one = runs.size() == 1;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const Run& r = runs[k];
    const std::string dat = fmt::format("run{}.dat", k), evl = fmt::format("eval{}.dat", k);
    files.emplace_back(dat, interval_data(r));
    files.emplace_back(evl, eval_data(r));
    const std::string name = gnuplot_quoted(r.name), color = fmt::format("lc {}", k + 1);
    const auto lines = [&](const std::string& file, int x, int y, const std::string& title,
                           const std::string& style) {
      return fmt::format("'{}' using {}:{} with {} {} title {}", file, x, y, style, color, title);
    };
    for (const int x : {1, 2}) {
      auto& loss = x == 1 ? loss_step : loss_time;
      auto& acc = x == 1 ? acc_step : acc_time;
      loss.push_back(lines(dat, x, 3, one ? "'loss'" : name, "lines lw 2"));
      if (one) {
        loss.push_back(
            fmt::format("'{}' using {}:4 with lines lw 1 dt 2 lc 2 title 'kd_loss'", dat, x));
        loss.push_back(
            fmt::format("'{}' using {}:5 with lines lw 1 dt 3 lc 3 title 'ce_loss'", dat, x));
      }
      acc.push_back(lines(evl, x, 3, one ? "'test'" : gnuplot_quoted(r.name + " test"),
                          "linespoints lw 2 pt 7"));
      acc.push_back(lines(dat, x, 6, one ? "'train (interval)'" : gnuplot_quoted(r.name + " train"),
                          "lines lw 1 dt 2"));
      if (r.teacher_accuracy)
        acc.push_back(fmt::format("{:.9g} with lines lw 1 dt 4 {} title {}", *r.teacher_accuracy,
                                  color, one ? "'teacher'" : gnuplot_quoted(r.name + " teacher")));
    }
    rate.push_back(lines(dat, 1, 7, name, "lines lw 2"));
    stages.push_back(lines(dat, 1, 8, gnuplot_quoted(r.name + " teacher busy"), "lines lw 2"));
    stages.push_back(
        lines(dat, 1, 9, gnuplot_quoted(r.name + " student waiting"), "lines lw 1 dt 2"));
  }
  const std::string what = one ? runs.front().name : fmt::format("{} runs", runs.size());
  const std::vector<std::string> plots = {"loss.png",          "loss_time.png",  "accuracy.png",
                                          "accuracy_time.png", "throughput.png", "stages.png"};
  const auto temporary = [&](const std::string& png) { return out / ("." + png + ".tmp"); };
  std::string script = "set terminal pngcairo size 1000,560 font 'sans,11'\n"
                       "set datafile missing '?'\nset grid\nset key outside right top noenhanced\n";
  script += figure(temporary("loss.png"), "loss: " + what, "step", "loss", loss_step);
  script += figure(temporary("loss_time.png"), "loss: " + what, "wall time (s)", "loss", loss_time);
  script += "set yrange [0:1]\n";
  script += figure(temporary("accuracy.png"), "accuracy: " + what, "step", "top-1", acc_step);
  script += figure(temporary("accuracy_time.png"), "accuracy: " + what, "wall time (s)", "top-1",
                   acc_time);
  script += "set yrange [0:*]\n";
  script += figure(temporary("throughput.png"), "throughput: " + what, "step",
                   "samples/s (interval)", rate);
  script += "set yrange [0:1.05]\n";
  script +=
      figure(temporary("stages.png"), "stages: " + what, "step", "share of the interval", stages);
  try {
    run_gnuplot(script, files, "kdflow report");
  } catch (...) {
    for (const std::string& png : plots) fs::remove(temporary(png), ec);
    throw;
  }
  for (const std::string& png : plots) {
    fs::rename(temporary(png), out / png, ec);
    if (ec)
      throw std::runtime_error(fmt::format("kdflow report: gnuplot wrote no {} ({})",
                                           (out / png).string(), ec.message()));
  }

  // The table: the configuration keys that differ between the runs, then the figures.
  json report = {{"runs", json::array()}, {"config_differences", json::array()}, {"plots", plots}};
  for (const ConfigKey& key : runs.front().config.schema()) {
    std::vector<std::string> values;
    for (const Run& r : runs) values.push_back(r.config.text(key.name));
    if (std::any_of(values.begin(), values.end(),
                    [&](const std::string& v) { return v != values.front(); }))
      report["config_differences"].push_back({{"key", key.name}, {"values", values}});
  }
  for (const Run& r : runs) {
    json figures = json::object();
    for (const std::string& key : figure_keys())
      figures[key] = r.summary.is_object() ? r.summary.value(key, json()) : json();
    report["runs"].push_back({{"name", r.name}, {"path", r.path.string()}, {"summary", figures}});
  }
  std::string md = "| |";
  std::string rule = "|---|";
  for (const Run& r : runs) {
    md += fmt::format(" {} |", r.name);
    rule += "---|";
  }
  md += "\n" + rule + "\n";
  for (const json& d : report["config_differences"]) {
    md += fmt::format("| {} |", d["key"].get<std::string>());
    for (const json& v : d["values"]) md += fmt::format(" {} |", v.get<std::string>());
    md += "\n";
  }
  for (const std::string& key : figure_keys()) {
    md += fmt::format("| {} |", key);
    for (const json& r : report["runs"]) md += fmt::format(" {} |", cell(r["summary"][key]));
    md += "\n";
  }
  for (const std::string& png : plots) md += fmt::format("\n![{}]({})", png, png);
  md += "\n";
  write_file_atomic(out / "report.md", md);
  write_file_atomic(out / "report.json", report.dump(2) + "\n");
  fmt::print("{}\nkdflow report: {} ({} plots, report.md, report.json)\n", md, out.string(),
             plots.size());
  return kExitOk;
}

} // namespace kdflow::app
