// `kdflow tune-cores` end to end: a short tuning with a small fixture teacher writes a plan that
// `kdflow train --cores` then runs with; bad input is exit 2 with one line.
#include "kdflow_process.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace {

using namespace kdflow_test;
using nlohmann::json;

std::vector<std::string> small_setup() {
  return {"--set", "teacher.model=" + fixture("mlp_opset13.onnx").string(),
          "--set", "student.arch=mlp",
          "--set", "student.width=0.25",
          "--set", "ring.slots=4"};
}

TEST(TuneCores, WritesAPlanThatTrainRunsWith) {
  const fs::path dir = scratch("tune");
  fs::create_directories(dir);
  std::vector<std::string> args = {"tune-cores",   "--budget-s", "8",
                                   "--exhaustive", "--out",      (dir / "plan.json").string()};
  for (const auto& a : small_setup()) args.push_back(a);
  Result r = run(args, dir / "tune");
  ASSERT_EQ(r.code, 0) << r.err;
  const json plan = json::parse(read_text(dir / "plan.json"));
  ASSERT_TRUE(plan.contains("plan"));
  EXPECT_FALSE(plan["plan"]["student"].empty());
  EXPECT_FALSE(plan["plan"]["teacher"].empty());
  EXPECT_GT(plan["measured_samples_per_s"].get<double>(), 0);
  EXPECT_GT(plan["profiles"]["student_samples_per_s"].get<double>(), 0);
  ASSERT_FALSE(plan["candidates"].empty());
  // The winner is the best verified candidate within the 2% tie band.
  double best = 0;
  for (const auto& c : plan["candidates"])
    if (c["measured_samples_per_s"].is_number())
      best = std::max(best, c["measured_samples_per_s"].get<double>());
  EXPECT_GE(plan["measured_samples_per_s"].get<double>(), 0.98 * best);
  // The exhaustive comparison tried every valid plan; the tuner considered those whose loader set
  // was not dominated (a smaller set already outran the student), and no plan twice.
  EXPECT_EQ(plan["exhaustive"]["plans"].size(), plan["valid_plans"].get<std::size_t>());
  std::set<std::string> loader_sets;
  for (const auto& c : plan["candidates"]) loader_sets.insert(c["plan"]["loader"].dump());
  for (const auto& d : plan["profiles"]["dominated_loader_sets"])
    EXPECT_FALSE(loader_sets.count(d.dump())) << d.dump();
  EXPECT_LE(plan["candidates"].size(), plan["valid_plans"].get<std::size_t>());
  EXPECT_GT(plan["exhaustive"]["tuned_vs_best"].get<double>(), 0);

  const fs::path out = dir / "run";
  args = {"train",
          "--out",
          out.string(),
          "--cores",
          (dir / "plan.json").string(),
          "--set",
          "train.max_steps=5"};
  for (const auto& a : small_setup()) args.push_back(a);
  r = run(args, dir / "train");
  ASSERT_EQ(r.code, 0) << r.err;
  const json summary = json::parse(read_text(out / "summary.json"));
  EXPECT_EQ(summary["plan"]["loader"], plan["plan"]["loader"]);
  EXPECT_EQ(summary["plan"]["teacher"], plan["plan"]["teacher"]);
  EXPECT_NE(summary["plan"]["source"].get<std::string>().find("plan.json"), std::string::npos);
}

// Several teachers, written as [[teacher]] blocks: kdflow cores shares the teacher cores among
// them, tune-cores profiles each teacher's stage alone and writes a plan that says which teacher
// each replica runs, and train runs with it, logging each teacher's accuracy and their mix's.
TEST(TuneCores, TwoTeachersAreEachAStage) {
  const fs::path dir = scratch("tune_two");
  fs::create_directories(dir);
  const fs::path config = dir / "two.toml";
  {
    std::ofstream out(config);
    out << "[[teacher]]\nmodel = \"" << fixture("mlp_opset13.onnx").string()
        << "\"\nweight = 2\n[[teacher]]\nmodel = \""
        << (fs::path(KDFLOW_SOURCE_DIR) / "models" / "fmnist_teacher_w16.onnx").string()
        << "\"\n[student]\narch = \"mlp\"\nwidth = 0.25\n[ring]\nslots = 4\n";
  }
  const Child c = spawn({"cores", "--config", config.string(), "--json"}, dir / "cores.stderr",
                        dir / "cores.json");
  ASSERT_EQ(wait_exit(c), 0) << read_text(dir / "cores.stderr");
  const json cores = json::parse(read_text(dir / "cores.json"));
  std::set<int> served;
  for (const auto& t : cores["plan"]["teacher_of"]) served.insert(t.get<int>());
  EXPECT_EQ(served, (std::set<int>{0, 1})) << cores.dump(1);

  Result r = run({"tune-cores", "--config", config.string(), "--budget-s", "6", "--out",
                  (dir / "plan.json").string()},
                 dir / "tune");
  ASSERT_EQ(r.code, 0) << r.err;
  const json plan = json::parse(read_text(dir / "plan.json"));
  served.clear();
  for (const auto& t : plan["plan"]["teacher_of"]) served.insert(t.get<int>());
  EXPECT_EQ(served, (std::set<int>{0, 1})) << plan.dump(1);
  std::set<int> profiled;
  for (const auto& p : plan["profiles"]["teacher"]) {
    profiled.insert(p["teacher"].get<int>());
    EXPECT_GT(p["samples_per_s"].get<double>(), 0);
  }
  EXPECT_EQ(profiled, (std::set<int>{0, 1})) << "each teacher's stage alone";
  EXPECT_GT(plan["measured_samples_per_s"].get<double>(), 0);

  const fs::path out = dir / "run";
  const Child t = spawn({"train", "--config", config.string(), "--out", out.string(), "--cores",
                         (dir / "plan.json").string(), "--set", "train.max_steps=5"},
                        dir / "train.stderr", dir / "train.log");
  ASSERT_EQ(wait_exit(t), 0) << read_text(dir / "train.stderr");
  const std::string log = read_text(dir / "train.log");
  EXPECT_NE(log.find("the 2 teachers' mix"), std::string::npos) << log;
  EXPECT_NE(log.find("teacher 1 ("), std::string::npos) << log;
  const json summary = json::parse(read_text(out / "summary.json"));
  EXPECT_EQ(summary["plan"]["teacher_of"], plan["plan"]["teacher_of"]);
  ASSERT_EQ(summary["teachers"].size(), 2u) << summary.dump(1);
  EXPECT_NEAR(summary["teachers"][0]["weight"].get<double>(), 2.0 / 3.0, 1e-9);
  EXPECT_GT(summary["teachers"][1]["test_accuracy"].get<double>(), 0.85) << "the shipped w16";
  EXPECT_GT(summary["teacher_test_accuracy"].get<double>(), 0.0) << "their mixture's";
  // The resolved config names both teachers, and resumes as it was written.
  const std::string resolved = read_text(out / "config.toml");
  EXPECT_NE(resolved.find("fmnist_teacher_w16.onnx"), std::string::npos) << resolved;
}

TEST(TuneCores, BadInputIsExitTwoWithOneLine) {
  const fs::path dir = scratch("tune_bad");
  fs::create_directories(dir);
  std::vector<std::string> args = {"tune-cores", "--budget-s", "0", "--out",
                                   (dir / "plan.json").string()};
  Result r = run(args, dir / "budget");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "--budget-s");

  args = {"tune-cores", "--out", (dir / "missing" / "plan.json").string()};
  r = run(args, dir / "folder");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "missing");

  // A plan file that is not JSON, given to train.
  { std::ofstream(dir / "broken.json") << "{ not json"; }
  args = {"train", "--out", (dir / "run").string(), "--cores", (dir / "broken.json").string()};
  r = run(args, dir / "broken");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "broken.json");
  EXPECT_FALSE(fs::exists(dir / "plan.json"));
}

} // namespace
