// The trainer on the CPU: every student architecture trains a step on 28x28 and 32x32 inputs, a
// TorchScript student (scripted or traced, logits alone or in a tuple or dict) trains like them and
// bad modules are refused in one line, the loss is the KD/CE mix its alpha says, the schedule warms
// up and decays, and a checkpoint restores the exact state. Where a GPU is visible, the CUDA
// student follows the CPU student step by step (within the tolerance of its precision) and its
// checkpoints restore exactly too.
#include "../core/input_error.hpp"
#include "../teacher/fixtures.hpp"
#include "../test_scratch.hpp"
#include "kdflow/core/error.hpp"
#include "kdflow/core/loader.hpp"
#include "kdflow/core/teacher_mix.hpp"
#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/npy.hpp"
#include "kdflow/gpu_student/device.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/trainer.hpp"
#include "losses.hpp"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sched.h>
#include <set>
#include <stdlib.h>
#include <sys/syscall.h>
#include <thread>
#include <tuple>
#include <unistd.h>

namespace kdflow::student {
namespace {

constexpr std::int64_t kBatch = 8;
constexpr std::uint32_t kSlots = 2;

// Regions: inputs, labels, logits, then `extra` (teacher features).
std::vector<RegionSpec> fixture_regions(std::int64_t c, std::int64_t h, std::int64_t w,
                                        std::vector<RegionSpec> extra) {
  std::vector<RegionSpec> regions = {{"inputs", DType::f32, {kBatch, c, h, w}},
                                     {"labels", DType::i64, {kBatch}},
                                     {"logits", DType::f32, {kBatch, 10}}};
  for (auto& r : extra) regions.push_back(std::move(r));
  return regions;
}

struct Fixture {
  Fixture(std::int64_t c, std::int64_t h, std::int64_t w, std::vector<RegionSpec> extra = {})
      : layout(fixture_regions(c, h, w, std::move(extra))),
        ring(layout, kSlots, allocate_pinned_for_device(kSlots * layout.slot_bytes())) {}

  // Ring batch b carries data batch `data` (default b): random inputs and teacher logits from
  // `data`, labels data + i mod 10.
  void produce(std::uint64_t b, std::optional<std::uint64_t> data_batch = std::nullopt) {
    auto s = ring.acquire_free(b);
    ASSERT_TRUE(s);
    s->header().samples = kBatch;
    const std::uint64_t data = data_batch.value_or(b);
    std::mt19937 rng(7000 + static_cast<unsigned>(data));
    std::normal_distribution<float> normal;
    for (float& v : s->region<float>(0)) v = normal(rng);
    auto labels = s->region<std::int64_t>(1);
    for (std::size_t i = 0; i < labels.size(); ++i)
      labels[i] = static_cast<std::int64_t>((data + i) % 10);
    for (std::size_t r = 2; r < layout.regions().size(); ++r)
      for (float& v : s->region<float>(r)) v = 3 * normal(rng);
    ring.publish(*s, SlotState::filling, SlotState::ready);
  }

  SlotLayout layout;
  SlotRing ring;
};

TrainerOptions options(const std::string& arch, std::int64_t c, std::int64_t h) {
  TrainerOptions o;
  o.model = {arch, 0.5, c, h, h, 10};
  o.device = {};
  o.total_steps = 100;
  o.warmup_steps = 10;
  return o;
}

TEST(Trainer, EveryArchitectureTrainsOnBothInputSizes) {
  for (const char* arch : {"mlp", "cnn", "resnet20", "resnet56", "resnet18", "mobilenetv2"})
    for (auto [c, h] : {std::pair<std::int64_t, std::int64_t>{1, 28}, {3, 32}}) {
      SCOPED_TRACE(std::string(arch) + " " + std::to_string(h));
      Fixture f(c, h, h);
      Trainer t(options(arch, c, h), f.ring, {0, 1, 2});
      EXPECT_GT(t.parameters(), 1000);
      for (std::uint64_t b = 0; b < 2; ++b) {
        f.produce(b);
        const auto s = t.step(b);
        ASSERT_TRUE(s);
        EXPECT_TRUE(std::isfinite(s->loss));
        EXPECT_GT(s->kd_loss, 0);
        EXPECT_GT(s->ce_loss, 0);
        EXPECT_EQ(s->samples, kBatch);
      }
      EXPECT_EQ(t.steps_done(), 2);
    }
}

TEST(Trainer, ImageNetStemsAreTorchvisionsNetworks) {
  // torchvision's resnet18 and mobilenet_v2 at width 1 have 11,689,512 and 3,504,872 parameters
  // with 1000 classes; with 10, their heads are 512 * 990 + 990 and 1280 * 990 + 990 smaller.
  // FLOPs at 224 as kdflow counts them (`kdflow teacher info`: multiply-adds x 2, taps that read
  // only padding not counted) for torchvision's own two networks exported to ONNX: 3359.8 M and
  // 596.8 M.
  struct Expected {
    const char* arch;
    std::int64_t parameters;
    double gflops_lo, gflops_hi;
  };
  for (const Expected e : {Expected{"resnet18", 11689512 - 512 * 990 - 990, 3.359, 3.361},
                           Expected{"mobilenetv2", 3504872 - 1280 * 990 - 990, 0.5963, 0.5973}}) {
    SCOPED_TRACE(e.arch);
    Fixture f(3, 224, 224);
    TrainerOptions o = options(e.arch, 3, 224);
    o.model.width = 1.0;
    o.model.stem = "auto"; // 224 pixels: the ImageNet stem
    EXPECT_EQ(resolve_stem(o.model), "imagenet");
    Trainer t(o, f.ring, {0, 1, 2});
    EXPECT_EQ(t.parameters(), e.parameters);
    EXPECT_GT(t.flops_per_sample() / 1e9, e.gflops_lo);
    EXPECT_LT(t.flops_per_sample() / 1e9, e.gflops_hi);
    f.produce(0);
    const auto s = t.step(0);
    ASSERT_TRUE(s);
    EXPECT_TRUE(std::isfinite(s->loss));
    // The CIFAR form of the same network at 224 costs ~16x (its first stage at full resolution).
    Fixture g(3, 224, 224);
    o.model.stem = "cifar";
    Trainer cifar(o, g.ring, {0, 1, 2});
    EXPECT_GT(cifar.flops_per_sample(), 8 * t.flops_per_sample());
  }
  // Below 96 pixels `auto` keeps the CIFAR stem; a stem an architecture lacks is one line.
  EXPECT_EQ(resolve_stem(options("resnet18", 3, 32).model), "cifar");
  TrainerOptions cnn = options("cnn", 3, 224);
  cnn.model.stem = "imagenet";
  EXPECT_THROW((void)resolve_stem(cnn.model), InputError);
  EXPECT_EQ(resolve_stem(options("cnn", 3, 224).model), "cifar");
}

void expect_checkpoint_restores_exactly(const TrainerOptions& o, const std::filesystem::path& path,
                                        const std::vector<RegionSpec>& extra = {},
                                        const StepRegions& regions = {0, 1, 2, {}});

// The example students of scripts/make_students.py (made at test time).
nlohmann::json students() {
  std::ifstream in(test::fixture_dir("students") / "manifest.json");
  return nlohmann::json::parse(in);
}

TrainerOptions script_options(const std::string& name) {
  TrainerOptions o = options("torchscript", 1, 28);
  o.model.path = (test::fixture_dir("students") / (name + ".pt")).string();
  return o;
}

TEST(Trainer, TorchScriptStudentsTrainEveryParameterAndTheirStatistics) {
  const auto m = students();
  ASSERT_EQ(m["channels"], 1);
  ASSERT_EQ(m["size"], 28);
  ASSERT_GE(m["students"].size(), 6u);
  for (const std::string name : m["students"]) {
    SCOPED_TRACE(name);
    Fixture f(1, 28, 28);
    Trainer t(script_options(name), f.ring, {0, 1, 2});
    EXPECT_GT(t.parameters(), 10000);
    const std::vector<float> before = t.state_vector();
    for (std::uint64_t b = 0; b < 3; ++b) {
      f.produce(b);
      const auto s = t.step(b);
      ASSERT_TRUE(s);
      EXPECT_TRUE(std::isfinite(s->loss));
      EXPECT_GT(s->kd_loss, 0);
    }
    const std::vector<float> after = t.state_vector();
    ASSERT_EQ(after.size(), before.size());
    // Every parameter and buffer of the module moved: weights by the optimizer, BatchNorm's
    // running statistics (and its batch counter) by the forward passes in train mode.
    std::size_t same = 0;
    for (std::size_t i = 0; i < after.size(); ++i) same += after[i] == before[i];
    EXPECT_LT(same, after.size() / 100) << same << " of " << after.size() << " values unchanged";
    std::vector<float> images(static_cast<std::size_t>(20 * 28 * 28), 0.5f);
    std::vector<std::int64_t> labels(20, 3);
    const double accuracy = t.evaluate(images, labels);
    EXPECT_TRUE(accuracy == 0.0 || accuracy == 1.0) << "one image repeated: one answer";
  }
}

TEST(Trainer, TorchScriptCheckpointRestoresTheExactState) {
  const auto dir = std::filesystem::temp_directory_path() / "kdflow_trainer_test";
  std::filesystem::create_directories(dir);
  for (const char* name : {"resnet8_scripted", "mobilenet_tuple"}) {
    SCOPED_TRACE(name);
    expect_checkpoint_restores_exactly(script_options(name), dir / "script.ckpt");
  }
  // Another module file is another student, even with the same tensors' names.
  const auto path = dir / "other.ckpt";
  Fixture f(1, 28, 28);
  Trainer traced(script_options("resnet8_traced"), f.ring, {0, 1, 2});
  traced.save(path, "{}");
  Fixture g(1, 28, 28);
  Trainer scripted(script_options("resnet8_scripted"), g.ring, {0, 1, 2});
  EXPECT_NE(test::error_of([&] { scripted.load(path); }).find("resnet8_traced.pt"),
            std::string::npos);
}

TEST(Trainer, BadTorchScriptStudentsAreOneLineNamingTheFile) {
  const auto m = students();
  ASSERT_EQ(m["refused"].size(), 4u);
  for (const auto& bad : m["refused"]) {
    const std::string name = bad["name"], error = bad["error"];
    SCOPED_TRACE(name);
    Fixture f(1, 28, 28);
    const TrainerOptions o = script_options(name);
    const std::string message = test::error_of([&] { Trainer t(o, f.ring, {0, 1, 2}); });
    EXPECT_NE(message.find(o.model.path), std::string::npos) << message;
    EXPECT_NE(message.find(error), std::string::npos) << message;
  }
  Fixture f(1, 28, 28);
  TrainerOptions o = script_options("x");
  o.model.path.clear();
  EXPECT_NE(test::error_of([&] {
              Trainer t(o, f.ring, {0, 1, 2});
            }).find("student.path"),
            std::string::npos);
  o.model.path = "/no/such/student.pt";
  EXPECT_NE(test::error_of([&] {
              Trainer t(o, f.ring, {0, 1, 2});
            }).find("/no/such/student.pt"),
            std::string::npos);
}

// Logits of `a` against the reference `b`: max |a - b| / max(1, max |b|), and whether every row's
// top-1 agrees.
std::pair<double, bool> compare_logits(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, scale = 1;
  bool agree = true;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  for (std::size_t r = 0; r + 10 <= std::min(a.size(), b.size()); r += 10)
    agree &= std::max_element(a.begin() + r, a.begin() + r + 10) - a.begin() ==
             std::max_element(b.begin() + r, b.begin() + r + 10) - b.begin();
  return {worst / scale, agree};
}

// Every built-in student, trained a few steps (BatchNorm statistics no longer the initial ones),
// exported as ONNX and run by kdflow's own oneDNN teacher engine; the TorchScript students exported
// as TorchScript and loaded again; then all of them through ONNX Runtime and Python's
// torch.jit.load (scripts/check_export.py), each against the LibTorch student's logits.
TEST(Trainer, ExportedStudentsGiveTheStudentsLogits) {
  // A fresh folder (mkdtemp: LibTorch carries its own std::filesystem, whose remove_all the
  // dynamic linker may bind here).
  std::string pattern = kdflow_test::process_scratch("kdflow_student_test_") + "/exports.XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  constexpr std::int64_t kImages = 16;
  const auto check = [&](const TrainerOptions& o, const std::string& name) {
    SCOPED_TRACE(name);
    const auto& s = o.model;
    Fixture f(s.channels, s.height, s.width_px);
    Trainer t(o, f.ring, {0, 1, 2});
    for (std::uint64_t b = 0; b < 3; ++b) {
      f.produce(b);
      ASSERT_TRUE(t.step(b));
    }
    std::vector<float> images(
        static_cast<std::size_t>(kImages * s.channels * s.height * s.width_px));
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (float& v : images) v = normal(rng);
    const std::vector<float> want = t.predict(images);
    ASSERT_EQ(want.size(), static_cast<std::size_t>(kImages * 10));
    const bool script = s.arch == "torchscript";
    const auto path = dir / (name + (script ? ".pt" : ".onnx"));
    t.export_student(path, script ? "torchscript" : "onnx");
    std::vector<float> got(want.size());
    if (script) {
      got = run_torchscript(path.string(), images, s, o.device);
    } else {
      teacher::TeacherOptions to;
      to.batch = kImages;
      const auto engine = teacher::Teacher::load(path.string(), to);
      EXPECT_EQ(engine->input_shape(), (teacher::Shape{kImages, s.channels, s.height, s.width_px}));
      teacher::Replica replica(engine);
      float* outputs[] = {got.data()};
      replica.run(images.data(), outputs);
    }
    const auto [error, agree] = compare_logits(got, want);
    EXPECT_LE(error, 1e-4);
    EXPECT_TRUE(agree);
    const teacher::Shape in = {kImages, s.channels, s.height, s.width_px};
    teacher::write_npy((dir / (name + ".input.npy")).string(), in, images.data());
    teacher::write_npy((dir / (name + ".logits.npy")).string(), {kImages, 10}, want.data());
    // The format the student has no form in is refused, in one line.
    EXPECT_FALSE(test::error_of([&] {
                   t.export_student(dir / "wrong", script ? "onnx" : "torchscript");
                 }).empty());
    EXPECT_FALSE(std::filesystem::exists(dir / "wrong"));
  };
  for (const char* arch : {"mlp", "cnn", "resnet20", "resnet18", "mobilenetv2"})
    for (auto [c, h] : {std::pair<std::int64_t, std::int64_t>{1, 28}, {3, 32}})
      check(options(arch, c, h),
            std::string(arch) + "_" + std::to_string(c) + "x" + std::to_string(h));
  const auto scripted = students();
  ASSERT_GE(scripted["students"].size(), 6u);
  for (const std::string name : scripted["students"]) check(script_options(name), name);
  const std::string command = std::string("'") + KD_PYTHON + "' '" + KDFLOW_SOURCE_DIR +
                              "/scripts/check_export.py' '" + dir.string() + "'";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

// What scripts/<script> prints (one JSON object) when the venv's python runs it with `args` (no
// quotes in them); discarded JSON where it fails.
nlohmann::json reference(const std::string& script, const std::vector<std::string>& args) {
  std::string command =
      std::string("'") + KD_PYTHON + "' '" + KDFLOW_SOURCE_DIR + "/scripts/" + script + "'";
  for (const auto& a : args) command += " '" + a + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return nlohmann::json::value_t::discarded;
  std::string out;
  for (char buf[256]; std::fgets(buf, sizeof buf, pipe) != nullptr;) out += buf;
  if (::pclose(pipe) != 0) {
    ADD_FAILURE() << command << " failed";
    return nlohmann::json::value_t::discarded;
  }
  return nlohmann::json::parse(out, nullptr, false);
}

// Both distillation losses against their authors' PyTorch code (scripts/dkd_reference.py, in
// float64) on fixed logits, at two temperatures and two weightings; and DKD in a training step.
TEST(Trainer, DistillationLossesMatchTheirReferenceCode) {
  std::string pattern = kdflow_test::process_scratch("kdflow_student_test_") + "/dkd.XXXXXX";
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  constexpr std::int64_t kRows = 6, kClasses = 10;
  std::vector<float> s(kRows * kClasses), t(kRows * kClasses);
  const std::vector<float> labels = {0, 3, 9, 2, 2, 7};
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t c = 0; c < kClasses; ++c) {
      s[static_cast<std::size_t>(i * kClasses + c)] = 3.f * std::sin(0.7f * i + 1.3f * c);
      t[static_cast<std::size_t>(i * kClasses + c)] = 4.f * std::cos(0.5f * i - 0.9f * c + 0.3f);
    }
  teacher::write_npy((dir / "student.npy").string(), {kRows, kClasses}, s.data());
  teacher::write_npy((dir / "teacher.npy").string(), {kRows, kClasses}, t.data());
  teacher::write_npy((dir / "labels.npy").string(), {kRows}, labels.data());
  const torch::Tensor st = torch::from_blob(s.data(), {kRows, kClasses}).clone();
  const torch::Tensor tt = torch::from_blob(t.data(), {kRows, kClasses}).clone();
  const torch::Tensor y =
      torch::from_blob(const_cast<float*>(labels.data()), {kRows}).to(torch::kLong);
  for (const auto& [temperature, alpha, beta] :
       {std::tuple{4.0, 1.0, 8.0}, std::tuple{1.5, 0.5, 2.0}}) {
    const auto want = reference("dkd_reference.py", {dir.string(), std::to_string(temperature),
                                                     std::to_string(alpha), std::to_string(beta)});
    ASSERT_FALSE(want.is_discarded());
    const std::string out = want.dump();
    const double kl = kl_loss(st, tt, temperature).item<double>();
    const double dkd = dkd_loss(st, tt, y, temperature, alpha, beta).item<double>();
    EXPECT_NEAR(kl, want["kl"].get<double>(), 1e-5 * std::max(1.0, std::fabs(kl))) << out;
    EXPECT_NEAR(dkd, want["dkd"].get<double>(), 1e-5 * std::max(1.0, std::fabs(dkd))) << out;
    EXPECT_GT(dkd, 0.0);
  }
  // In a step: the mix is still kd.alpha * DKD + (1 - kd.alpha) * CE.
  Fixture f(1, 28, 28);
  auto o = options("cnn", 1, 28);
  o.kd_loss = "dkd";
  Trainer trainer(o, f.ring, {0, 1, 2});
  f.produce(0);
  const auto step = trainer.step(0);
  ASSERT_TRUE(step);
  EXPECT_GT(step->kd_loss, 0);
  EXPECT_NEAR(step->loss, o.kd_alpha * step->kd_loss + (1 - o.kd_alpha) * step->ce_loss, 1e-5);
}

// Mixup/CutMix's CE: the cross-entropy against torchvision's mixed one-hot target, lam * onehot(y)
// + (1 - lam) * onehot(y'), row by row; without a mix the plain CE.
TEST(Trainer, MixedCrossEntropyIsTheCrossEntropyOfTheMixedOneHotTarget) {
  torch::manual_seed(7);
  const torch::Tensor s = torch::randn({6, 10}) * 3;
  const torch::Tensor y = torch::tensor({0, 3, 9, 3, 5, 1}, torch::kInt64);
  const torch::Tensor y2 = torch::tensor({1, 3, 2, 8, 0, 9}, torch::kInt64);
  const torch::Tensor lam = torch::tensor({1.f, 0.f, 0.3f, 0.5f, 0.99f, 0.62f});
  const torch::Tensor target = lam.unsqueeze(1) * torch::one_hot(y, 10).to(torch::kFloat) +
                               (1 - lam).unsqueeze(1) * torch::one_hot(y2, 10).to(torch::kFloat);
  const double want = (-(target * torch::log_softmax(s, 1)).sum(1)).mean().item<double>();
  EXPECT_NEAR(cross_entropy_mixed(s, y, y2, lam).item<double>(), want, 1e-6);
  const double plain = torch::nn::functional::cross_entropy(s, y).item<double>();
  EXPECT_NEAR(cross_entropy_mixed(s, y).item<double>(), plain, 1e-7);
  EXPECT_NEAR(cross_entropy_mixed(s, y, y2, torch::ones({6})).item<double>(), plain, 1e-6);
  EXPECT_GT(std::fabs(want - plain), 0.1); // the mix changes the target
}

// Several teachers: the colocated baseline's mix on the device is the pipeline's TeacherMix.
TEST(Trainer, TheColocatedTeachersMixIsThePipelinesMix) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 5.f);
  constexpr std::int64_t kTeachers = 3, kRows = 9, kClasses = 10;
  std::vector<float> z(kTeachers * kRows * kClasses);
  for (float& v : z) v = normal(rng);
  const std::vector<double> weights = {0.5, 1.0, 2.0};
  for (const double t : {1.0, 4.0}) {
    std::vector<const float*> in;
    for (std::int64_t k = 0; k < kTeachers; ++k) in.push_back(z.data() + k * kRows * kClasses);
    std::vector<float> want(kRows * kClasses);
    TeacherMix(weights, t)(in, kRows, kClasses, want.data());
    const torch::Tensor logits = torch::from_blob(z.data(), {kTeachers, kRows, kClasses}).clone();
    const torch::Tensor log_w =
        torch::tensor(
            std::vector<double>{std::log(0.5 / 3.5), std::log(1 / 3.5), std::log(2 / 3.5)})
            .to(torch::kFloat)
            .view({kTeachers, 1, 1});
    const torch::Tensor got = mix_teacher_logits(logits, log_w, t).contiguous();
    ASSERT_EQ(got.sizes(), (std::vector<std::int64_t>{kRows, kClasses}));
    for (std::int64_t i = 0; i < kRows * kClasses; ++i)
      EXPECT_NEAR(got.data_ptr<float>()[i], want[static_cast<std::size_t>(i)],
                  1e-5 * std::max(1.0f, std::fabs(want[static_cast<std::size_t>(i)])))
          << "T " << t << " at " << i;
  }
}

// The feature losses against torchdistill's PyTorch code (scripts/feature_loss_reference.py, in
// float64) on fixed maps of different channel counts.
TEST(Trainer, FeatureLossesMatchTheirReferenceCode) {
  std::string pattern = (std::filesystem::temp_directory_path() / "kdflow_feat.XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  const std::vector<std::int64_t> ss = {5, 3, 6, 6}, ts = {5, 7, 6, 6};
  const auto fill = [](const std::vector<std::int64_t>& shape, float a, float b) {
    std::vector<float> v(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = std::sin(a * static_cast<float>(i) + b) * (1.f + 0.1f * static_cast<float>(i % 7));
    return v;
  };
  std::vector<float> s = fill(ss, 0.37f, 0.2f), t = fill(ts, 0.23f, -0.4f), h = fill(ts, 0.11f, 1);
  teacher::write_npy((dir / "student.npy").string(), ss, s.data());
  teacher::write_npy((dir / "teacher.npy").string(), ts, t.data());
  teacher::write_npy((dir / "hint.npy").string(), ts, h.data());
  const auto want = reference("feature_loss_reference.py", {dir.string()});
  ASSERT_FALSE(want.is_discarded());
  const std::string out = want.dump();
  const torch::Tensor st = torch::from_blob(s.data(), ss).clone();
  const torch::Tensor tt = torch::from_blob(t.data(), ts).clone();
  const torch::Tensor ht = torch::from_blob(h.data(), ts).clone();
  for (const auto& [name, got] :
       {std::pair{"hint", hint_loss(ht, tt)}, {"at", at_loss(st, tt)}, {"sp", sp_loss(st, tt)}}) {
    const double v = got.item<double>(), w = want[name].get<double>();
    EXPECT_GT(w, 0.0) << name;
    EXPECT_NEAR(v, w, 1e-5 * std::max(1e-3, std::fabs(w))) << name << " " << out;
  }
  // (POSIX calls: libtorch exports a std::filesystem::remove_all of its own, which crashes here.)
  for (const char* f : {"student.npy", "teacher.npy", "hint.npy"}) ::unlink((dir / f).c_str());
  ::rmdir(dir.c_str());
}

// kd.features in the trainer: a hint through a trained adapter (a 1x1 convolution to the teacher's
// channels; the teacher's map resized to the student's height and width), attention transfer and
// similarity-
// preserving KD, each weighted into the loss; the adapters train with the student, are in the
// checkpoint (resume is bit-exact) and not in the student's parameter count.
TEST(Trainer, FeatureLossesTrainAdaptersThatCheckpointsRestore) {
  const std::vector<RegionSpec> extra = {{"feature:a", DType::f32, {kBatch, 24, 10, 10}},
                                         {"feature:b", DType::f32, {kBatch, 5, 14, 14}},
                                         {"feature:c", DType::f32, {kBatch, 40}}};
  const StepRegions regions{0, 1, 2, {3, 4, 5}};
  auto o = options("cnn", 1, 28);
  Fixture plain_ring(1, 28, 28);
  const auto plain_params = Trainer(o, plain_ring.ring, {0, 1, 2}).parameters();
  o.feature_losses = {{"a", "stage2", "hint", 0.5, {24, 10, 10}, 1, "kd.features[1]"},
                      {"b", "stage1", "at", 100.0, {5, 14, 14}, 2, "kd.features[2]"},
                      {"c", "penultimate", "sp", 2.0, {40}, 3, "kd.features[3]"}};
  Fixture f(1, 28, 28, extra);
  Trainer t(o, f.ring, regions);
  EXPECT_EQ(t.parameters(), plain_params) << "the adapters are not the student's";
  const std::vector<float> before = t.state_vector();
  double last = 0;
  for (std::uint64_t b = 0; b < 3; ++b) {
    f.produce(b);
    const auto step = t.step(b);
    ASSERT_TRUE(step);
    EXPECT_GT(step->feature_loss, 0.0);
    EXPECT_NEAR(step->loss,
                o.kd_alpha * step->kd_loss + (1 - o.kd_alpha) * step->ce_loss + step->feature_loss,
                1e-4 * std::max(1.0, step->loss));
    last = step->feature_loss;
  }
  EXPECT_GT(last, 0.0);
  const std::vector<float> after = t.state_vector();
  // The adapter (a 1x1 convolution from stage2's 32 channels to 24, and its bias) is the state's
  // tail: it trained.
  ASSERT_EQ(after.size(), before.size());
  const std::size_t adapter = 24 * 32 + 24;
  ASSERT_GT(after.size(), adapter);
  EXPECT_FALSE(std::equal(after.end() - adapter, after.end(), before.end() - adapter));

  const auto dir = std::filesystem::temp_directory_path() / "kdflow_trainer_features";
  std::filesystem::create_directories(dir);
  expect_checkpoint_restores_exactly(o, dir / "a.ckpt", extra, regions);
  // A checkpoint without the adapters is another student's.
  Fixture g(1, 28, 28);
  Trainer plain(options("cnn", 1, 28), g.ring, {0, 1, 2});
  plain.save(dir / "plain.ckpt", "{}");
  Fixture h(1, 28, 28, extra);
  Trainer featured(o, h.ring, regions);
  const std::string e = test::error_of([&] { (void)featured.load(dir / "plain.ckpt"); });
  EXPECT_NE(e.find("feature loss hint stage2 -> a"), std::string::npos) << e;
}

// A TorchScript student's taps are the tensor entries besides its logits of the dict its forward
// returns; one named elsewhere is refused with the ones it has.
TEST(Trainer, TorchScriptStudentsTapTheirDictsEntries) {
  auto o = script_options("resnet8_dict");
  o.feature_losses = {{"c", "features", "hint", 1.0, {40}, 3, "kd.features[1]"}};
  Fixture f(1, 28, 28, {{"feature:c", DType::f32, {kBatch, 40}}});
  Trainer t(o, f.ring, {0, 1, 2, {3}});
  for (std::uint64_t b = 0; b < 2; ++b) {
    f.produce(b);
    const auto step = t.step(b);
    ASSERT_TRUE(step);
    EXPECT_GT(step->feature_loss, 0.0);
  }
  o.feature_losses[0].student = "stage1";
  Fixture g(1, 28, 28, {{"feature:c", DType::f32, {kBatch, 40}}});
  const std::string e = test::error_of([&] { Trainer bad(o, g.ring, {0, 1, 2, {3}}); });
  EXPECT_NE(e.find("'stage1'"), std::string::npos) << e;
  EXPECT_NE(e.find("(it has features)"), std::string::npos) << e;
}

// A pair no loss can compare is an InputError naming the pair and both shapes; a tap the student
// lacks names the taps it has.
TEST(Trainer, FeatureLossesTheStudentCannotMeetAreInputErrors) {
  const auto refused = [](FeatureLoss f, const std::vector<std::string>& what) {
    auto o = options("cnn", 1, 28);
    f.key = "kd.features[1]";
    o.feature_losses = {f};
    Fixture fx(1, 28, 28);
    const std::string e = test::error_of([&] { Trainer t(o, fx.ring, {0, 1, 2, {2}}); });
    for (const auto& w : what) EXPECT_NE(e.find(w), std::string::npos) << e;
  };
  refused({"v", "stage9", "hint", 1.0, {8, 7, 7}, 1, ""},
          {"kd.features[1].student = 'stage9'", "stage1, stage2, stage3, penultimate"});
  refused({"v", "penultimate", "hint", 1.0, {8, 7, 7}, 1, ""},
          {"kd.features[1]", "'penultimate' [64]", "'v' [8, 7, 7]", "no adapter"});
  refused({"v", "stage1", "at", 1.0, {49}, 1, ""}, {"kd.features[1]", "attention transfer"});
  refused({"v", "penultimate", "sp", 1.0, {}, 1, ""}, {"kd.features[1]", "something per sample"});
}

TEST(Trainer, LossMixesKdAndCeByAlpha) {
  for (double alpha : {0.0, 0.3, 1.0}) {
    Fixture f(1, 28, 28);
    auto o = options("mlp", 1, 28);
    o.kd_alpha = alpha;
    Trainer t(o, f.ring, {0, 1, alpha > 0 ? std::optional<std::size_t>(2) : std::nullopt});
    f.produce(0);
    const auto s = t.step(0);
    ASSERT_TRUE(s);
    if (alpha == 0) {
      EXPECT_EQ(s->kd_loss, 0.0);
    }
    EXPECT_NEAR(s->loss, alpha * s->kd_loss + (1 - alpha) * s->ce_loss, 1e-5);
  }
}

TEST(Trainer, Uint8SlotsAreNormalizedOnTheDeviceAsTheLoaderWould) {
  // The same pixels in a uint8 ring (normalized by the trainer) and in a float32 ring (normalized
  // by the loader's code): the same losses and parameters, step after step.
  AugmentConfig aug;
  aug.mean = {0.3f};
  aug.std = {0.35f};
  auto o = options("cnn", 1, 28);
  o.input_scale = {channel_scale(aug, 0)};
  o.input_shift = {channel_shift(aug, 0)};
  const SlotLayout u8({{"inputs", DType::u8, {kBatch, 1, 28, 28}},
                       {"labels", DType::i64, {kBatch}},
                       {"logits", DType::f32, {kBatch, 10}}});
  SlotRing bytes(u8, kSlots, allocate_pinned_for_device(kSlots * u8.slot_bytes()));
  Fixture floats(1, 28, 28);
  Trainer on_bytes(o, bytes, {0, 1, 2}), on_floats(o, floats.ring, {0, 1, 2});
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (std::uint64_t b = 0; b < 3; ++b) {
    auto s8 = bytes.acquire_free(b);
    auto sf = floats.ring.acquire_free(b);
    s8->header().samples = sf->header().samples = kBatch;
    for (auto& v : s8->region<std::uint8_t>(0)) v = static_cast<std::uint8_t>(rng() & 0xff);
    normalize_images(s8->region<std::uint8_t>(0).data(), sf->region<float>(0).data(), kBatch, 1,
                     28 * 28, aug);
    for (std::int64_t i = 0; i < kBatch; ++i)
      s8->region<std::int64_t>(1)[static_cast<std::size_t>(i)] =
          sf->region<std::int64_t>(1)[static_cast<std::size_t>(i)] =
              (i + static_cast<std::int64_t>(b)) % 10;
    for (std::size_t i = 0; i < s8->region<float>(2).size(); ++i)
      s8->region<float>(2)[i] = sf->region<float>(2)[i] = 3 * normal(rng);
    bytes.publish(*s8, SlotState::filling, SlotState::ready);
    floats.ring.publish(*sf, SlotState::filling, SlotState::ready);
    const auto a = on_bytes.step(b), c = on_floats.step(b);
    ASSERT_TRUE(a && c);
    EXPECT_NEAR(a->loss, c->loss, 1e-5 * std::abs(c->loss)) << "step " << b;
  }
  const auto pa = on_bytes.state_vector(), pc = on_floats.state_vector();
  ASSERT_EQ(pa.size(), pc.size());
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i)
    worst = std::max(worst, double(std::abs(pa[i] - pc[i])));
  EXPECT_LT(worst, 1e-5);
}

TEST(Trainer, ScheduleWarmsUpThenFollowsTheCosine) {
  Fixture f(1, 28, 28);
  auto o = options("mlp", 1, 28);
  o.lr = 0.1;
  Trainer t(o, f.ring, {0, 1, 2});
  EXPECT_NEAR(t.lr_at(0), 0.01, 1e-12);
  EXPECT_NEAR(t.lr_at(9), 0.1, 1e-12);
  EXPECT_NEAR(t.lr_at(10), 0.1, 1e-12);
  EXPECT_NEAR(t.lr_at(55), 0.05, 1e-12); // half way through the cosine
  EXPECT_NEAR(t.lr_at(100), 0.0, 1e-12);
}

// Straight: 4 steps. Split: 2 steps, save, a fresh trainer of another initialisation loads and
// does 2 more on the same data. Both end in the same state, bit for bit.
void expect_checkpoint_restores_exactly(const TrainerOptions& o, const std::filesystem::path& path,
                                        const std::vector<RegionSpec>& extra,
                                        const StepRegions& regions) {
  Fixture a(1, 28, 28, extra);
  Trainer straight(o, a.ring, regions);
  for (std::uint64_t b = 0; b < 4; ++b) {
    a.produce(b);
    ASSERT_TRUE(straight.step(b));
  }
  Fixture b1(1, 28, 28, extra);
  {
    Trainer first(o, b1.ring, regions);
    for (std::uint64_t b = 0; b < 2; ++b) {
      b1.produce(b);
      ASSERT_TRUE(first.step(b));
    }
    first.save(path, "{\"next\": 2}");
  }
  Fixture b2(1, 28, 28, extra);
  auto o2 = o;
  o2.seed = 999; // a different initialisation: the checkpoint must overwrite all of it
  Trainer second(o2, b2.ring, regions);
  EXPECT_EQ(second.load(path), "{\"next\": 2}");
  EXPECT_EQ(second.steps_done(), 2);
  // The resumed ring starts at batch 0 again, carrying data batches 2 and 3.
  for (std::uint64_t b = 0; b < 2; ++b) {
    b2.produce(b, b + 2);
    ASSERT_TRUE(second.step(b));
  }
  EXPECT_EQ(second.state_vector(), straight.state_vector());
}

TEST(Trainer, CheckpointRestoresTheExactState) {
  const auto dir = std::filesystem::temp_directory_path() / "kdflow_trainer_test";
  std::filesystem::create_directories(dir);
  for (const char* optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    auto o = options("cnn", 1, 28);
    o.optimizer = optimizer;
    expect_checkpoint_restores_exactly(o, dir / "a.ckpt");
  }
}

TEST(Trainer, CheckpointOfAnotherStudentIsAnInputError) {
  const auto path = std::filesystem::temp_directory_path() / "kdflow_trainer_other.ckpt";
  Fixture f(1, 28, 28);
  Trainer mlp(options("mlp", 1, 28), f.ring, {0, 1, 2});
  mlp.save(path, "{}");
  Fixture g(1, 28, 28);
  Trainer cnn(options("cnn", 1, 28), g.ring, {0, 1, 2});
  EXPECT_THROW(cnn.load(path), InputError);
}

TEST(Trainer, AmpFollowsTheDevice) {
  EXPECT_EQ(resolve_amp("auto", 0, ""), "off");
  EXPECT_EQ(resolve_amp("bf16", 0, ""), "off"); // the CPU always trains in fp32
  EXPECT_EQ(resolve_amp("auto", 9, "cuda:0 (H100)"), "bf16");
  EXPECT_EQ(resolve_amp("auto", 8, "cuda:0 (A100)"), "bf16");
  EXPECT_EQ(resolve_amp("auto", 7, "cuda:0 (V100)"), "fp16");
  EXPECT_EQ(resolve_amp("fp16", 9, "cuda:0 (H100)"), "fp16");
  EXPECT_EQ(resolve_amp("off", 7, "cuda:0 (V100)"), "off");
  try {
    (void)resolve_amp("bf16", 7, "cuda:0 (Tesla V100)");
    FAIL() << "bf16 on a 7.x GPU was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 (Tesla V100)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.amp"), std::string::npos) << e.what();
  }
}

// The same batches through a CPU student and a CUDA student of the same initialisation: the losses
// agree step by step within the tolerance of the CUDA side's precision.
void expect_cuda_follows_cpu(const std::string& arch, const std::string& amp, double tolerance) {
  SCOPED_TRACE(arch + " amp " + amp);
  auto o = options(arch, 1, 28);
  o.lr = 0.02;
  Fixture on_cpu(1, 28, 28), on_cuda(1, 28, 28);
  Trainer cpu(o, on_cpu.ring, {0, 1, 2});
  o.device = {Device::Kind::cuda, 0};
  o.amp = amp;
  Trainer cuda(o, on_cuda.ring, {0, 1, 2});
  EXPECT_EQ(cuda.device().rfind("cuda:0 (", 0), 0u) << cuda.device();
  for (std::uint64_t b = 0; b < 12; ++b) {
    on_cpu.produce(b);
    on_cuda.produce(b);
    const auto c = cpu.step(b), g = cuda.step(b);
    ASSERT_TRUE(c && g);
    EXPECT_NEAR(g->loss, c->loss, tolerance * std::abs(c->loss)) << "step " << b;
    EXPECT_NEAR(g->kd_loss, c->kd_loss, tolerance * std::abs(c->kd_loss)) << "step " << b;
    EXPECT_NEAR(g->ce_loss, c->ce_loss, tolerance * std::abs(c->ce_loss)) << "step " << b;
  }
}

TEST(Trainer, CudaStudentFollowsTheCpuStudent) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  // fp32 on the GPU differs from the CPU by summation order (and TF32 convolutions); bf16
  // autocast by its 8-bit mantissa.
  expect_cuda_follows_cpu("mlp", "off", 1e-3);
  expect_cuda_follows_cpu("cnn", "off", 1e-2);
  expect_cuda_follows_cpu("cnn", "auto", 5e-2);
  expect_cuda_follows_cpu("resnet20", "fp16", 5e-2);
}

TEST(Trainer, CudaCheckpointRestoresTheExactState) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  auto o = options("mlp", 1, 28);
  o.device = {Device::Kind::cuda, 0};
  o.optimizer = "adamw";
  expect_checkpoint_restores_exactly(o,
                                     std::filesystem::temp_directory_path() / "kdflow_cuda.ckpt");
}

// bench-overlap's loop mode runs its student on a thread of its own bound to every CPU of the
// plan: the OpenMP team LibTorch starts from a thread is that thread's own, made with its CPUs,
// and ends with it.
TEST(IntraOpThreads, AThreadsOwnTeamKeepsItsCpusAndEndsWithIt) {
  const auto tasks = [] {
    std::set<pid_t> out;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
      out.insert(static_cast<pid_t>(std::stoi(e.path().filename().string())));
    return out;
  };
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  (void)torch::ones({1 << 22}).add_(1).sum(); // the test thread's own team, if any, first
  std::set<pid_t> team;
  std::thread loop([&] {
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    at::set_num_threads(3); // (its pool for QNNPACK, if it makes one, is the process's)
    EXPECT_EQ(intra_op_threads(), 3);
    const std::set<pid_t> before = tasks();
    const auto x = torch::ones({1 << 24});
    EXPECT_EQ(x.add(1).sum().item<double>(), 2.0 * (1 << 24)); // a parallel region of 3
    for (const pid_t tid : tasks())
      if (!before.count(tid)) team.insert(tid);
    for (const pid_t tid : team) {
      cpu_set_t got;
      ASSERT_EQ(sched_getaffinity(tid, sizeof(got), &got), 0);
      EXPECT_TRUE(CPU_EQUAL(&got, &one)) << "thread " << tid << " of the team";
    }
  });
  loop.join();
  EXPECT_EQ(team.size(), 2u); // the thread's two workers
  // Its workers leave with it.
  std::set<pid_t> left;
  for (int i = 0; i < 500; ++i) {
    left.clear();
    const std::set<pid_t> now = tasks();
    for (const pid_t tid : team)
      if (now.count(tid)) left.insert(tid);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " of the team's " << team.size()
                            << " threads still running";
}

} // namespace
} // namespace kdflow::student
