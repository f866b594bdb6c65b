// The LibTorch executor of the imported teacher graph (the colocated baseline of bench-overlap):
// every op fixture against kdflow's oneDNN engine, and whole PyTorch exports against PyTorch's
// own outputs, so the two implementations of the graph check each other; and its op table
// against the teacher's, so that an op added to the teacher without a LibTorch lowering fails here.
#include "../teacher/fixtures.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/npy.hpp"
#include "kdflow/cpu_teacher/ops.hpp"
#include "kdflow/gpu_student/torch_teacher.hpp"
#include "kdflow/gpu_student/versions.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

namespace kdflow::student {
namespace {

namespace fs = std::filesystem;
using teacher::Shape;

using test::fixture_dir;
using test::manifest;
using test::normalized_error;

std::vector<float> run_torch(const teacher::Teacher& t, const std::vector<float>& x) {
  const TorchTeacher torch_teacher(t.graph(), Device{});
  std::vector<float> out(static_cast<std::size_t>(teacher::numel(t.output_shape(0))));
  float* outputs[] = {out.data()};
  torch_teacher.run(x.data(), outputs);
  return out;
}

std::vector<float> run_onednn(const std::shared_ptr<const teacher::Teacher>& t,
                              const std::vector<float>& x) {
  std::vector<float> out(static_cast<std::size_t>(teacher::numel(t->output_shape(0))));
  float* outputs[] = {out.data()};
  teacher::Replica(t).run(x.data(), outputs);
  return out;
}

TEST(TorchTeacher, LowersEveryOpTheTeacherRunsAtInference) {
  const std::vector<std::string> lowered = TorchTeacher::ops();
  std::vector<std::string> inference;
  for (const auto& op : teacher::teacher_ops())
    if (op.runs_at_inference) inference.push_back(op.name);
  ASSERT_FALSE(inference.empty());
  const auto in = [](const std::vector<std::string>& names, const std::string& op) {
    return std::find(names.begin(), names.end(), op) != names.end();
  };
  for (const auto& op : inference)
    EXPECT_TRUE(in(lowered, op)) << op << ": the teacher runs it, the LibTorch executor has no "
                                 << "lowering for it (gpu_student/torch_teacher.cpp, torch_ops)";
  // The other way round: a LibTorch entry for an op the teacher never runs is a typo or dead code.
  for (const auto& op : lowered)
    EXPECT_TRUE(in(inference, op)) << op << ": lowered for LibTorch, not run by the teacher";
}

TEST(TorchTeacher, EveryOpFixtureMatchesTheOneDnnEngine) {
  const fs::path dir = fixture_dir("ops");
  const auto m = manifest(dir);
  ASSERT_GE(m["models"].size(), 40u);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  int compared = 0;
  for (const auto& entry : m["models"]) {
    const std::string name = entry["name"];
    SCOPED_TRACE(name);
    const Shape shape = entry["input"].get<Shape>();
    teacher::TeacherOptions options;
    options.batch = shape[0];
    const auto t = teacher::Teacher::load((dir / (name + ".onnx")).string(), options);
    std::vector<float> x(static_cast<std::size_t>(teacher::numel(shape)));
    for (auto& v : x) v = normal(rng);
    EXPECT_LE(normalized_error(run_torch(*t, x), run_onednn(t, x)), 1e-4) << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(m["models"].size()));
}

TEST(TorchTeacher, PyTorchExportsMatchPyTorch) {
  const fs::path dir = fixture_dir("models");
  const auto m = manifest(dir);
  ASSERT_GE(m["models"].size(), 5u);
  for (const auto& entry : m["models"]) {
    const std::string name = entry["name"];
    SCOPED_TRACE(name);
    const teacher::NpyArray x = teacher::read_npy((dir / (name + ".input.npy")).string());
    const teacher::NpyArray ref = teacher::read_npy((dir / (name + ".output.npy")).string());
    teacher::TeacherOptions options;
    options.batch = m["batch"];
    const auto t = teacher::Teacher::load((dir / (name + ".onnx")).string(), options);
    EXPECT_LE(normalized_error(run_torch(*t, x.data), ref.data), 1e-4) << name;
  }
}

// The device is decided once, before any executor is built or any rank meets another: the rule
// for every count of GPUs (none, one, two), so that it is checked on any machine.
TEST(TorchTeacher, DeviceRuleForEveryCountOfGpusAndRanks) {
  EXPECT_THROW(choose_device("cuda", 0), InputError);
  EXPECT_THROW(choose_device("gpu", 1), InputError);
  EXPECT_EQ(choose_device("auto", 0), Device{});
  EXPECT_EQ(choose_device("cpu", 2, 1, 2), Device{});
  EXPECT_EQ(choose_device("auto", 1), (Device{Device::Kind::cuda, 0}));
  EXPECT_EQ(choose_device("cuda", 2, 1, 2), (Device{Device::Kind::cuda, 1}));
  // Two local ranks, one GPU: both refuse alike (rank 0 as well, which has a GPU of its own),
  // naming LOCAL_WORLD_SIZE; on the CPU they run.
  for (const char* wanted : {"auto", "cuda"})
    for (int rank = 0; rank < 2; ++rank) {
      try {
        (void)choose_device(wanted, 1, rank, 2);
        ADD_FAILURE() << wanted << " on local rank " << rank << " was not refused";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("LOCAL_WORLD_SIZE = 2"), std::string::npos)
            << e.what();
      }
    }
  EXPECT_EQ(choose_device("cpu", 1, 1, 2), Device{});
  // What this machine sees follows the same rule.
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    EXPECT_THROW(resolve_device("cuda"), InputError);
    EXPECT_EQ(resolve_device("auto"), Device{});
  } else {
    EXPECT_EQ(resolve_device("auto"), (Device{Device::Kind::cuda, 0}));
    EXPECT_THROW(resolve_device("cuda", 0, gpus + 1), InputError);
  }
}

} // namespace
} // namespace kdflow::student
