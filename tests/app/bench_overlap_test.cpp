// `kdflow bench-overlap` end to end: the binary in a child process with a small fixture teacher,
// then its JSON, its Perfetto trace (spans per mode and thread, overlap where the pipeline
// overlaps and none where the loop is serial) and its PNG are read back.
#include "kdflow_process.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace {

using namespace kdflow_test;
using nlohmann::json;

const char* const kModes[] = {"student-alone", "student-contended", "teacher-alone", "loader-alone",
                              "serial-cpu",    "colocated",         "loop",          "overlapped"};

// setup.sh installs gnuplot; the lent GPU machine has none (../shared/GPU.md), and there the
// test checks everything but the picture.
bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// The committed Fashion-MNIST teacher (~20 ms a batch on one core) against a tiny student: the
// overlapped pipeline is teacher-bound, so its teacher is busy through every student step and the
// overlap check below does not depend on how the scheduler treats a busy test machine.
// --plot only where gnuplot is.
std::vector<std::string> small_run(const fs::path& dir) {
  std::vector<std::string> args = {
      "bench-overlap",
      "--set",
      "teacher.model=" + (fs::path(KDFLOW_SOURCE_DIR) / "models" / "fmnist_teacher.onnx").string(),
      "--set",
      "student.arch=mlp",
      "--set",
      "student.width=0.25",
      "--set",
      "ring.slots=4",
      "--steps",
      "6",
      "--repeats",
      "1",
      "--min-seconds",
      "0",
      "--json",
      (dir / "overlap.json").string(),
      "--trace",
      (dir / "trace.json").string(),
      "--plot",
      (dir / "modes.png").string()};
  if (!have_gnuplot()) args.resize(args.size() - 2);
  return args;
}

struct Span {
  std::string name;
  double begin, end; // microseconds
};

// Spans by mode (the trace's process names) and thread name.
std::map<std::string, std::map<std::string, std::vector<Span>>> spans_by_mode(const json& trace) {
  std::map<int, std::string> process, thread_key;
  std::map<std::pair<int, int>, std::string> thread;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "M") continue;
    if (e.at("name") == "process_name") process[e.at("pid")] = e["args"]["name"];
    if (e.at("name") == "thread_name") thread[{e.at("pid"), e.at("tid")}] = e["args"]["name"];
  }
  std::map<std::string, std::map<std::string, std::vector<Span>>> out;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const double ts = e.at("ts"), dur = e.at("dur");
    EXPECT_GE(dur, 0.0);
    EXPECT_TRUE(e.at("args").contains("batch"));
    const int pid = e.at("pid"), tid = e.at("tid");
    EXPECT_TRUE(process.count(pid)) << "span in an unnamed process";
    EXPECT_TRUE(thread.count({pid, tid})) << "span on an unnamed thread";
    out[process[pid]][thread[{pid, tid}]].push_back({e.at("name"), ts, ts + dur});
  }
  return out;
}

bool any_overlap(const std::vector<Span>& a, const std::vector<Span>& b) {
  for (const auto& x : a)
    for (const auto& y : b)
      if (x.begin < y.end && y.begin < x.end) return true;
  return false;
}

std::vector<Span> named(const std::map<std::string, std::vector<Span>>& threads,
                        const std::string& name) {
  std::vector<Span> out;
  for (const auto& [thread, spans] : threads)
    for (const auto& s : spans)
      if (s.name == name) out.push_back(s);
  return out;
}

TEST(BenchOverlap, WritesJsonTraceAndPlotThatAgreeWithTheModes) {
  const fs::path dir = scratch("overlap");
  fs::create_directories(dir);
  auto args = small_run(dir);
  const Result r = run(args, dir / "run");
  ASSERT_EQ(r.code, 0) << r.err;

  const json report = json::parse(read_text(dir / "overlap.json"));
  double lowest_alone = 1e300;
  for (const char* mode : kModes) {
    SCOPED_TRACE(mode);
    const json& m = report.at("modes").at(mode);
    EXPECT_GT(m.at("samples_per_s").get<double>(), 0);
    EXPECT_GE(m.at("steps").get<int>(), 6);
    EXPECT_GT(m.at("seconds").get<double>(), 0);
    if (std::string(mode).ends_with("-alone"))
      lowest_alone = std::min(lowest_alone, m.at("samples_per_s").get<double>());
  }
  const auto rate = [&](const char* mode) {
    return report["modes"][mode]["samples_per_s"].get<double>();
  };
  EXPECT_DOUBLE_EQ(report.at("ideal_samples_per_s").get<double>(), lowest_alone);
  EXPECT_NEAR(report.at("efficiency").get<double>(), rate("overlapped") / lowest_alone, 1e-9);
  // The contention ceiling: the slowest stage alone with the student measured beside the busy
  // teacher replicas.
  const double ceiling =
      std::min({rate("student-contended"), rate("teacher-alone"), rate("loader-alone")});
  EXPECT_DOUBLE_EQ(report.at("contention_ceiling_samples_per_s").get<double>(), ceiling);
  EXPECT_NEAR(report.at("efficiency_vs_contention_ceiling").get<double>(),
              rate("overlapped") / ceiling, 1e-9);
  EXPECT_NEAR(report.at("speedup_vs_serial_cpu").get<double>(),
              rate("overlapped") / rate("serial-cpu"), 1e-9);
  EXPECT_NEAR(report.at("speedup_vs_colocated").get<double>(),
              rate("overlapped") / rate("colocated"), 1e-9);
  EXPECT_NEAR(report.at("speedup_vs_loop").get<double>(), rate("overlapped") / rate("loop"), 1e-9);
  // The loop is the plain PyTorch loop: on the CPU its student's intra-op threads span every CPU
  // of the plan (the other modes' keep to the student's own).
  if (!gpu_visible()) {
    const json& plan = report.at("plan");
    std::set<int> every;
    for (const char* role : {"student", "loader"})
      for (const auto& c : plan.at(role)) every.insert(c.get<int>());
    for (const auto& replica : plan.at("teacher"))
      for (const auto& c : replica) every.insert(c.get<int>());
    const json& loop = report.at("modes").at("loop");
    EXPECT_EQ(loop.at("student_threads").get<int>(), static_cast<int>(every.size()));
    EXPECT_EQ(report.at("modes").at("colocated").at("student_threads").get<int>(),
              static_cast<int>(plan.at("student").size()));
    std::cout << "loop: " << loop.at("student_threads") << " threads on CPUs "
              << loop.at("student_cpus") << "; colocated on "
              << report.at("modes").at("colocated").at("student_cpus") << "\n";
  }
  const double idle = report.at("student_idle_fraction");
  EXPECT_GE(idle, 0.0);
  EXPECT_LE(idle, 1.0);
  expect_student_device(report.at("device"));
  // H2D bandwidth: ring slots against cudaMemcpy from pinned memory, on a CUDA student only.
  if (gpu_visible()) {
    for (const char* which : {"run_slots", "large_slots"}) {
      const json& h = report.at("h2d").at(which);
      EXPECT_GT(h.at("slots_gb_per_s").get<double>(), 0) << which;
      EXPECT_GT(h.at("memcpy_pinned_gb_per_s").get<double>(), 0) << which;
      EXPECT_EQ(h.at("slot_memory"), "cuda-pinned") << which;
    }
  } else {
    EXPECT_TRUE(report.at("h2d").is_null());
  }
  EXPECT_FALSE(report.at("plan").at("student").empty());
  EXPECT_TRUE(report.at("versions").contains("kdflow"));

  const auto modes = spans_by_mode(json::parse(read_text(dir / "trace.json")));
  const std::map<std::string, std::set<std::string>> expected = {
      {"student-alone", {"wait", "step"}},
      {"student-contended", {"wait", "step", "teacher"}},
      {"teacher-alone", {"teacher", "wait"}},
      {"loader-alone", {"load", "wait"}},
      {"serial-cpu", {"load", "teacher", "wait", "step"}},
      {"colocated", {"load", "teacher", "wait", "step"}},
      {"loop", {"load", "teacher", "wait", "step"}},
      {"overlapped", {"load", "teacher", "wait", "step"}}};
  for (const auto& [mode, names] : expected) {
    SCOPED_TRACE(mode);
    ASSERT_TRUE(modes.count(mode));
    const auto& threads = modes.at(mode);
    for (const auto& name : names) EXPECT_FALSE(named(threads, name).empty()) << name;
    // On one thread, spans follow each other or nest (a colocated teacher inside its step).
    for (const auto& [thread, spans] : threads)
      for (std::size_t i = 0; i + 1 < spans.size(); ++i)
        for (std::size_t j = i + 1; j < spans.size(); ++j) {
          const Span &a = spans[i], &b = spans[j];
          const bool apart = a.end <= b.begin || b.end <= a.begin;
          const bool nested =
              (a.begin <= b.begin && b.end <= a.end) || (b.begin <= a.begin && a.end <= b.end);
          EXPECT_TRUE(apart || nested) << thread << ": " << a.name << " and " << b.name;
        }
  }
  // Where the spans run: the student's steps on kd-student, the CPU teacher on its own thread
  // (colocated: the student's thread).
  EXPECT_FALSE(modes.at("overlapped").at("kd-student").empty());
  // (Some replica's: with several, a short run may give every batch to one of them.)
  std::size_t on_teacher_threads = 0;
  for (const auto& [thread, spans] : modes.at("overlapped"))
    if (thread.starts_with("kd-teacher-"))
      on_teacher_threads += named({{thread, spans}}, "teacher").size();
  EXPECT_GT(on_teacher_threads, 0u);
  EXPECT_FALSE(named({{"kd-student", modes.at("colocated").at("kd-student")}}, "teacher").empty());
  EXPECT_FALSE(named({{"kd-student", modes.at("loop").at("kd-student")}}, "teacher").empty());
  // The pipeline overlaps the teacher with the student's steps; the serial loop never does.
  EXPECT_TRUE(
      any_overlap(named(modes.at("overlapped"), "teacher"), named(modes.at("overlapped"), "step")));
  // The contention ceiling's replicas work while the student steps, on their own threads.
  EXPECT_TRUE(any_overlap(named(modes.at("student-contended"), "teacher"),
                          named(modes.at("student-contended"), "step")));
  EXPECT_TRUE(
      named({{"kd-student", modes.at("student-contended").at("kd-student")}}, "teacher").empty());
  EXPECT_FALSE(
      any_overlap(named(modes.at("serial-cpu"), "teacher"), named(modes.at("serial-cpu"), "step")));
  EXPECT_FALSE(
      any_overlap(named(modes.at("serial-cpu"), "load"), named(modes.at("serial-cpu"), "teacher")));

  if (!have_gnuplot()) {
    std::cout << "no gnuplot here: --plot not checked\n";
    return;
  }
  const std::string png = read_text(dir / "modes.png");
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// kd.cache: bench-overlap keeps the teacher's first epoch, then measures the overlapped pipeline
// reading it (overlapped-cached), beside the other modes, which run the teacher as before. With
// kd.cache = disk the outputs kept are written, and the next bench-overlap reads them instead of
// running the teacher's first epoch.
TEST(BenchOverlap, CachedModeReadsTheTeachersFirstEpoch) {
  const fs::path dir = scratch("overlap_cache"), data = scratch("overlap_cache_data");
  write_fmnist_subset(data, 640, 256);
  const fs::path file = dir / "outputs.kdcache";
  const auto bench = [&](const std::string& mode) {
    auto args = small_run(dir);
    args.insert(args.begin() + 1,
                {"--set", "data.path=" + data.string(), "--set", "kd.cache=" + mode});
    if (mode == "disk") args.insert(args.begin() + 1, {"--set", "kd.cache_path=" + file.string()});
    const Result r = run(args, dir / mode);
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(read_text(dir / "overlap.json"));
  };
  fs::create_directories(dir);
  for (const std::string mode : {"memory", "disk", "disk"}) {
    SCOPED_TRACE("kd.cache = " + mode);
    const bool again = mode == "disk" && fs::exists(file);
    const json report = bench(mode);
    ASSERT_TRUE(report["modes"].contains("overlapped-cached")) << report.dump(1);
    for (const char* m : kModes) EXPECT_TRUE(report["modes"].contains(m)) << m;
    const json& cached = report["modes"]["overlapped-cached"];
    EXPECT_GT(cached["samples_per_s"].get<double>(), 0.0);
    EXPECT_GE(cached["steps"].get<int>(), 6);
    const json& cache = report["teacher_cache"];
    EXPECT_EQ(cache["mode"], mode);
    EXPECT_EQ(cache["samples"], 640);
    EXPECT_EQ(cache["samples_kept"], 640);
    EXPECT_EQ(cache["fill_teacher_batches"], again ? 0 : 10) << "the teacher's first epoch";
    EXPECT_NEAR(cache["speedup_vs_overlapped"].get<double>(),
                cached["samples_per_s"].get<double>() /
                    report["modes"]["overlapped"]["samples_per_s"].get<double>(),
                1e-9);
    EXPECT_EQ(fs::exists(file), mode == "disk");
  }
  // Without kd.cache there is no cached mode.
  const json plain = bench("none");
  EXPECT_FALSE(plain["modes"].contains("overlapped-cached"));
  EXPECT_TRUE(plain["teacher_cache"].is_null());
}

// Several teachers: every mode runs them all (colocated on the student's device too), and each is
// measured as a stage alone on its own replicas; the ideal is the slowest stage.
TEST(BenchOverlap, TwoTeachersAreEachAStage) {
  const fs::path dir = scratch("overlap_two");
  fs::create_directories(dir);
  auto args = small_run(dir);
  const std::string second =
      (fs::path(KDFLOW_SOURCE_DIR) / "models" / "fmnist_teacher_w16.onnx").string();
  args.insert(args.begin() + 1, {"--set", "teacher.others=[{model = \"" + second + "\"}]"});
  const Child c = spawn(args, dir / "two.stderr", dir / "two.out");
  ASSERT_EQ(wait_exit(c), 0) << read_text(dir / "two.stderr");
  const std::string printed = read_text(dir / "two.out");
  const json report = json::parse(read_text(dir / "overlap.json"));
  for (const char* m : kModes)
    EXPECT_GT(report["modes"][m]["samples_per_s"].get<double>(), 0.0) << m;
  const json& alone = report["teachers_alone"];
  ASSERT_EQ(alone.size(), 2u) << report.dump(1);
  double slowest = 1e300;
  for (std::size_t t = 0; t < 2; ++t) {
    EXPECT_EQ(alone[t]["teacher"], t);
    EXPECT_GE(alone[t]["replicas"].get<int>(), 1);
    slowest = std::min(slowest, alone[t]["samples_per_s"].get<double>());
  }
  EXPECT_EQ(alone[1]["model"], second);
  EXPECT_LE(report["ideal_samples_per_s"].get<double>(), slowest * (1 + 1e-12));
  EXPECT_NE(printed.find("teacher-alone[1]"), std::string::npos) << printed;
}

TEST(BenchOverlap, BadInputIsExitTwoWithOneLine) {
  const fs::path dir = scratch("overlap_bad");
  fs::create_directories(dir);
  auto args = small_run(dir);
  args.insert(args.begin() + 1, {"--set", "kd.alpha=0"});
  Result r = run(args, dir / "alpha");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "kd.alpha");

  args = small_run(dir);
  const auto json_arg = std::find(args.begin(), args.end(), "--json") + 1;
  *json_arg = (dir / "missing" / "overlap.json").string();
  r = run(args, dir / "folder");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "missing");
  EXPECT_FALSE(fs::exists(dir / "trace.json")); // nothing measured, nothing written

  args = small_run(dir); // the last --set of a key wins
  args.insert(args.end(), {"--set", "teacher.model=" + (dir / "none.onnx").string()});
  r = run(args, dir / "teacher");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "none.onnx");

  // --plot where gnuplot is not: refused before anything is measured (a machine without it, as
  // the lent GPU machines are: PATH without gnuplot here).
  args = small_run(dir);
  if (std::find(args.begin(), args.end(), "--plot") == args.end())
    args.insert(args.end(), {"--plot", (dir / "modes.png").string()});
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", "/nonexistent", 1);
  r = run(args, dir / "plot");
  ::setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "gnuplot is not installed");
  EXPECT_FALSE(fs::exists(dir / "trace.json"));
}

} // namespace
