// `kdflow teacher info|infer|bench` end to end: the binary in a child process on the fixture
// models, as a user runs it. infer's .npy must hold PyTorch's answers, bench --profile must account
// for every step of the plan, and bad input must be one line on stderr and exit code 2.
#include "../teacher/fixtures.hpp"
#include "kdflow_process.hpp"

#include "kdflow/cpu_teacher/engine.hpp"
#include "kdflow/cpu_teacher/npy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>
#include <tuple>

#include <nlohmann/json.hpp>

namespace {

using namespace kdflow_test;
using nlohmann::json;

TEST(TeacherCli, InferWritesPyTorchsAnswers) {
  const fs::path out = scratch("infer") / "logits.npy";
  fs::create_directories(out.parent_path());
  const auto r = run({"teacher", "infer", "--model", fixture("resnet18_opset17.onnx").string(),
                      "--input", fixture("resnet18_opset17.input.npy").string(), "--output",
                      out.string(), "--threads", "1"},
                     out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = kdflow::teacher::read_npy(out.string());
  const auto ref = kdflow::teacher::read_npy(fixture("resnet18_opset17.output.npy").string());
  ASSERT_EQ(got.shape, ref.shape);
  EXPECT_LE(kdflow::test::normalized_error(got.data, ref.data), 1e-4);
}

// `teacher info` lists the values a feature can name; `infer --feature` writes each beside the
// logits, its name made a file name, holding what a run of the plan returns for it (the values
// themselves against the reference in TeacherFeatures).
TEST(TeacherCli, InfoListsTheValuesAndInferWritesTheFeatures) {
  const fs::path dir = scratch("features");
  fs::create_directories(dir);
  const std::string model = fixture("resnet18_opset17.onnx").string();
  const Child c = spawn({"teacher", "info", "--model", model, "--batch", "2"},
                        (dir / "info.stderr").string(), dir / "info.txt");
  ASSERT_EQ(wait_exit(c), 0) << read_text(dir / "info.stderr");
  const std::string text = read_text(dir / "info.txt");
  const auto listed = text.find("values (");
  ASSERT_NE(listed, std::string::npos) << text;
  const std::string value = "/layer1/layer1.0/relu_1/Relu_output_0";
  EXPECT_NE(text.find("  " + value + " [2, 64, 8, 8] (Relu)\n", listed), std::string::npos) << text;
  const fs::path out = dir / "logits.npy";
  const auto r = run({"teacher", "infer", "--model", model, "--input",
                      fixture("resnet18_opset17.input.npy").string(), "--output", out.string(),
                      "--threads", "1", "--feature", value},
                     dir / "infer");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto feature = kdflow::teacher::read_npy(
      (dir / "logits._layer1_layer1.0_relu_1_Relu_output_0.npy").string());
  EXPECT_EQ(feature.shape[1], 64);
  EXPECT_EQ(feature.shape[2], 8);
  const auto logits = kdflow::teacher::read_npy(out.string());
  const auto ref = kdflow::teacher::read_npy(fixture("resnet18_opset17.output.npy").string());
  EXPECT_EQ(feature.shape[0], ref.shape[0]);
  EXPECT_LE(kdflow::test::normalized_error(logits.data, ref.data), 1e-4);
  const auto bad = run({"teacher", "infer", "--model", model, "--input",
                        fixture("resnet18_opset17.input.npy").string(), "--output", out.string(),
                        "--feature", "nope"},
                       dir / "bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--feature 'nope'"), std::string::npos) << bad.err;
}

TEST(TeacherCli, BenchProfileAccountsForEveryStep) {
  const fs::path out = scratch("bench") / "bench.json";
  fs::create_directories(out.parent_path());
  const auto r =
      run({"teacher", "bench", "--model", fixture("mobilenet_v2_opset13.onnx").string(), "--batch",
           "8", "--threads", "1", "--seconds", "0.4", "--profile", "--json", out.string()},
          out);
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(read_text(out));
  EXPECT_GT(j.at("images_per_s").get<double>(), 0.0);
  const json& p = j.at("profile");
  EXPECT_GE(p.at("batches").get<int>(), 5);
  double steps_ms = 0, steps_flops = 0;
  std::map<std::string, int> steps_of;
  std::map<std::string, double> flops_of;
  const double peak = j.at("peak_gflops_per_s").get<double>();
  ASSERT_GT(peak, 0.0);
  // A rate and its share of the peak where there are products (null elsewhere).
  const auto check_rate = [&](const json& row) {
    const double flops = row.at("flops").get<double>(), ms = row.at("ms").get<double>();
    if (flops == 0 || ms == 0) {
      EXPECT_TRUE(row.at("gflops_per_s").is_null()) << row.dump();
      EXPECT_TRUE(row.at("peak_share").is_null()) << row.dump();
      return;
    }
    EXPECT_NEAR(row.at("gflops_per_s").get<double>(), flops / ms / 1e6, 1e-9 * flops / ms);
    EXPECT_NEAR(row.at("peak_share").get<double>(), flops / ms / 1e6 / peak, 1e-9 * flops / ms);
  };
  for (const auto& s : p.at("steps")) {
    EXPECT_GE(s.at("ms").get<double>(), 0.0);
    EXPECT_FALSE(s.at("impl").get<std::string>().empty());
    steps_ms += s.at("ms").get<double>();
    const std::string kind = s.at("kind");
    ++steps_of[kind];
    // Products are counted on the step that computes them: every convolution and the
    // classifier's Gemm, never a reorder.
    const double flops = s.at("flops").get<double>();
    EXPECT_EQ(flops > 0, kind.starts_with("Conv") || kind == "Gemm") << s.dump();
    steps_flops += flops;
    flops_of[kind] += flops;
    check_rate(s);
  }
  EXPECT_NEAR(steps_ms, p.at("step_ms_sum").get<double>(), 1e-9);
  // Every multiply-add of the batch, once.
  EXPECT_NEAR(steps_flops, 8 * j.at("flops_per_sample").get<double>(), 1e-9 * steps_flops);
  double kinds_ms = 0, shares = 0;
  for (const auto& k : p.at("by_kind")) {
    const std::string kind = k.at("kind");
    EXPECT_EQ(k.at("steps").get<int>(), steps_of[kind]) << kind;
    EXPECT_NEAR(k.at("flops").get<double>(), flops_of[kind], 1e-9 * flops_of[kind]) << kind;
    check_rate(k);
    kinds_ms += k.at("ms").get<double>();
    shares += k.at("share").get<double>();
  }
  EXPECT_NEAR(kinds_ms, steps_ms, 1e-9);
  EXPECT_NEAR(shares, 1.0, 1e-9);
  EXPECT_EQ(steps_of["Conv (depthwise)"], 17);
  // The tuner's per-node record: the way each node runs, among those it offers, and what each
  // way measured (null where it was never timed: a node another way took in).
  const json& tune = j.at("tune");
  const json& ways = tune.at("ways");
  EXPECT_EQ(ways.size(), tune.at("nodes").get<std::size_t>());
  int compared = 0;
  for (const auto& w : ways) {
    ASSERT_TRUE(w.at("ms").contains(w.at("chosen").get<std::string>())) << w.dump();
    int timed = 0;
    for (const auto& [way, ms] : w.at("ms").items()) {
      if (ms.is_null()) continue;
      EXPECT_GE(ms.get<double>(), 0.0) << way;
      ++timed;
    }
    compared += timed >= 2;
  }
  EXPECT_GT(compared, 0);
}

// The FMA peak a bench reports its share of is measured at the width the engine runs at: capped
// with ONEDNN_MAX_CPU_ISA=AVX2 on an AVX-512 CPU, the AVX2 peak (on cores with 512-bit FMA units
// half the AVX-512 one, which the capped kernels cannot reach), named so in the JSON (peak_isa).
TEST(TeacherCli, BenchMeasuresThePeakAtTheWidthTheEngineRuns) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx2") ||
      !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX-512 here to cap below";
  const fs::path dir = scratch("peak_isa");
  fs::create_directories(dir);
  const auto bench = [&](const std::string& name, std::vector<std::string> env) {
    const fs::path out = dir / (name + ".json"), err = dir / (name + ".stderr");
    const Child c = spawn(
        {"teacher", "bench", "--model", fixture("mobilenet_v2_opset13.onnx").string(), "--batch",
         "4", "--threads", "1", "--seconds", "0.3", "--tune", "off", "--json", out.string()},
        err, "/dev/null", std::move(env));
    EXPECT_EQ(wait_exit(c), 0) << read_text(err);
    return json::parse(read_text(out));
  };
  const json capped = bench("capped", {"ONEDNN_MAX_CPU_ISA=AVX2"});
  EXPECT_EQ(capped.at("isa"), "avx2");
  EXPECT_EQ(capped.at("peak_isa"), "avx2");
  EXPECT_GT(capped.at("peak_gflops_per_s").get<double>(), 0.0);
  const json full = bench("full", {"ONEDNN_MAX_CPU_ISA=ALL"}); // (CI runs a line capped)
  EXPECT_EQ(full.at("peak_isa"), "avx512");
  EXPECT_NE(full.at("isa"), "avx2");
}

// --replicas R: R replicas of --threads each on their own cores at once; the images/s are theirs
// together, each replica's own rate listed. Bad splits are exit 2 naming the option.
TEST(TeacherCli, BenchReplicasRunOnTheirOwnCoresAndAddUp) {
  const fs::path dir = scratch("bench_replicas");
  fs::create_directories(dir);
  const fs::path out = dir / "bench.json";
  const std::string model = fixture("mobilenet_v2_opset13.onnx").string();
  const auto r = run({"teacher", "bench", "--model", model, "--batch", "4", "--threads", "1",
                      "--replicas", "2", "--seconds", "0.3", "--json", out.string()},
                     out);
  if (r.code == 2 && r.err.find("may use 1 physical cores") != std::string::npos)
    GTEST_SKIP() << "one physical core here: " << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(read_text(out));
  EXPECT_EQ(j.at("replicas").get<int>(), 2);
  EXPECT_EQ(j.at("threads").get<int>(), 1);
  const auto cpus = j.at("cpus").get<std::vector<int>>();
  ASSERT_EQ(cpus.size(), 2u);
  EXPECT_NE(cpus[0], cpus[1]);
  double sum = 0;
  ASSERT_EQ(j.at("per_replica").size(), 2u);
  for (const auto& e : j.at("per_replica")) {
    EXPECT_GE(e.at("batches_timed").get<int>(), 5);
    EXPECT_GT(e.at("images_per_s").get<double>(), 0.0);
    sum += e.at("images_per_s").get<double>();
  }
  EXPECT_NEAR(j.at("images_per_s").get<double>(), sum, 1e-9 * sum);
  for (const auto& [args, what] :
       {std::pair{std::vector<std::string>{"--replicas", "0"}, "--replicas 0"},
        std::pair{std::vector<std::string>{"--replicas", "2", "--threads", "4096"},
                  "--replicas 2 x --threads 4096"},
        std::pair{std::vector<std::string>{"--replicas", "2", "--profile"}, "--replicas 2"}}) {
    std::vector<std::string> cmd = {"teacher", "bench", "--model", model, "--seconds", "0.1"};
    cmd.insert(cmd.end(), args.begin(), args.end());
    const auto bad = run(cmd, dir / "bad");
    EXPECT_EQ(bad.code, 2) << what;
    EXPECT_NE(bad.err.find(what), std::string::npos) << bad.err;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  }
}

// The profile says which kinds ran as kdflow's own code rather than oneDNN primitives (plain
// kernels by rows, and reference loops element by element) and their shares of the time: an
// Expand that a Relu reads (a broadcast copy by rows) and a reflecting Pad (element by element).
TEST(TeacherCli, BenchProfileSaysWhatRanAsPlainKernelsAndReferenceLoops) {
  for (const auto& [name, kind, impl] :
       {std::tuple{"expand_read_by_relu", "Expand", "plain kernel"},
        std::tuple{"pad_reflect", "Pad", "reference loop"}}) {
    SCOPED_TRACE(name);
    const fs::path out = scratch("bench_plain") / (std::string(name) + ".json");
    fs::create_directories(out.parent_path());
    const fs::path model =
        fixture("model").parent_path().parent_path() / "ops" / (std::string(name) + ".onnx");
    const auto r = run({"teacher", "bench", "--model", model.string(), "--batch", "4", "--threads",
                        "1", "--seconds", "0.3", "--profile", "--json", out.string()},
                       out);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = json::parse(read_text(out));
    const json& p = j.at("profile");
    double plain_ms = 0, reference_ms = 0;
    // kind -> (plain kernel steps, reference loop steps, steps)
    std::map<std::string, std::tuple<int, int, int>> of;
    // kdflow's kernels around oneDNN primitives, and vectorized on their own
    std::map<std::string, int> composite, own;
    for (const auto& s : p.at("steps")) {
      EXPECT_EQ(s.at("writes"), "f32") << s; // an fp32 run writes f32 throughout
      const std::string how = s.at("impl");
      const bool reference = how == "reference loop", plain = reference || how == "plain kernel";
      if (plain) plain_ms += s.at("ms").get<double>();
      if (reference) reference_ms += s.at("ms").get<double>();
      if (how.starts_with("kdflow "))
        (how.find(" + ") != std::string::npos ? composite : own)[s.at("kind").get<std::string>()] +=
            1;
      auto& [n_plain, n_reference, n] = of[s.at("kind").get<std::string>()];
      n_plain += plain && !reference;
      n_reference += reference;
      ++n;
    }
    const auto& [n_plain, n_reference, n] = of[kind];
    EXPECT_EQ(n_plain + n_reference, 1);
    EXPECT_EQ(std::string(impl) == "reference loop" ? n_reference : n_plain, 1);
    EXPECT_NEAR(p.at("plain_kernel_share").get<double>(),
                plain_ms / p.at("step_ms_sum").get<double>(), 1e-9);
    EXPECT_NEAR(p.at("reference_share").get<double>(),
                reference_ms / p.at("step_ms_sum").get<double>(), 1e-9);
    EXPECT_GT(p.at(std::string(impl) == "reference loop" ? "reference_share" : "plain_kernel_share")
                  .get<double>(),
              0);
    for (const auto& k : p.at("by_kind")) {
      const auto& [kp, kr, kn] = of[k.at("kind").get<std::string>()];
      const int kc = composite[k.at("kind").get<std::string>()];
      const int ko = own[k.at("kind").get<std::string>()];
      EXPECT_EQ(k.at("ran").get<std::string>(), kc == kn                 ? "kdflow + oneDNN"
                                                : ko == kn               ? "kdflow kernel"
                                                : kp + kr + kc + ko == 0 ? "oneDNN"
                                                : kp == kn               ? "plain kernel"
                                                : kr == kn               ? "reference loop"
                                                                         : "mixed")
          << k.at("kind");
    }
  }
}

// teacher info --plan lists the tuned plan: a summary line, then every node that can run more
// than one way with its ways' times and the one kept (marked *); --tune off says so instead.
TEST(TeacherCli, InfoPlanListsEveryTunableNode) {
  const fs::path dir = scratch("info_plan");
  fs::create_directories(dir);
  const std::string model = fixture("mobilenet_v2_opset13.onnx").string();
  const auto info = [&](std::vector<std::string> extra, const std::string& name) {
    std::vector<std::string> args = {"teacher", "info", "--model", model, "--batch", "8"};
    args.insert(args.end(), extra.begin(), extra.end());
    const fs::path out = dir / name;
    const Child c = spawn(args, out.string() + ".stderr", out);
    EXPECT_EQ(wait_exit(c), 0) << read_text(out.string() + ".stderr");
    return read_text(out);
  };
  const std::string tuned = info({"--threads", "1", "--plan"}, "tuned.txt");
  EXPECT_NE(tuned.find("tuning:     "), std::string::npos) << tuned;
  EXPECT_NE(tuned.find("plans timed"), std::string::npos) << tuned;
  EXPECT_NE(tuned.find("memory:     "), std::string::npos) << tuned;
  const auto listed = tuned.find("plan (node: way ms per batch");
  ASSERT_NE(listed, std::string::npos) << tuned;
  // mobilenet_v2's 1x1 convolutions each list their ways, one of them kept.
  const std::string listing = tuned.substr(listed, tuned.find("graph after passes") - listed);
  EXPECT_GE(std::count(listing.begin(), listing.end(), '*'), 30) << listing;
  // The batch whole and in halving passes, each timed (ms per batch of 8), the one kept said.
  const auto passes = tuned.find("\npasses:     ");
  ASSERT_NE(passes, std::string::npos) << tuned;
  EXPECT_TRUE(tuned.compare(passes + 13, 15, "the batch whole") == 0 ||
              tuned.compare(passes + 13, 10, "passes of ") == 0)
      << tuned;
  EXPECT_NE(tuned.find("8 samples "), std::string::npos) << tuned;
  EXPECT_NE(tuned.find(", 4 samples "), std::string::npos) << tuned;
  const std::string off = info({"--tune", "off"}, "off.txt");
  EXPECT_NE(off.find("tuning:     off"), std::string::npos) << off;
  EXPECT_EQ(off.find("\npasses:     "), std::string::npos) << off;
  // Passes fixed by hand: said on the batch line, nothing else timed.
  const std::string fixed = info({"--tune", "off", "--samples-per-pass", "2"}, "fixed.txt");
  EXPECT_NE(fixed.find("batch:      8 samples in passes of 2 samples, one at a time"),
            std::string::npos)
      << fixed;
  if (std::thread::hardware_concurrency() >= 2) { // two at once, each on one of two threads
    const std::string both = info(
        {"--tune", "off", "--threads", "2", "--samples-per-pass", "2", "--passes-at-once", "2"},
        "at_once.txt");
    EXPECT_NE(both.find("batch:      8 samples in passes of 2 samples, 2 at once, each on one "
                        "thread"),
              std::string::npos)
        << both;
  }
}

TEST(TeacherCli, BadInputIsOneLineAndExitCode2) {
  const fs::path dir = scratch("bad");
  fs::create_directories(dir);
  const std::string missing = (dir / "missing.onnx").string();
  auto r = run({"teacher", "info", "--model", missing}, dir / "info");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, missing);

  const std::string model = fixture("mlp_opset13.onnx").string();
  r = run({"teacher", "bench", "--model", model, "--batch", "0"}, dir / "batch");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "--batch");
  for (const char* seconds : {"nan", "inf", "-1", "0", "1s"}) {
    r = run({"teacher", "bench", "--model", model, "--seconds", seconds}, dir / "seconds");
    EXPECT_EQ(r.code, 2) << seconds;
    expect_one_line_naming(r.err, "--seconds");
  }
  // Passes of a number of samples that does not divide the batch, or below 0.
  r = run({"teacher", "bench", "--model", model, "--batch", "8", "--samples-per-pass", "3"},
          dir / "passes");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, model + ": teacher batch 8 cannot run in passes of 3 samples");
  r = run({"teacher", "bench", "--model", model, "--samples-per-pass", "-1"}, dir / "passes_neg");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "--samples-per-pass");
  // More passes at once than threads.
  r = run({"teacher", "bench", "--model", model, "--batch", "8", "--threads", "1",
           "--samples-per-pass", "2", "--passes-at-once", "2"},
          dir / "at_once");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, model + ": 2 passes at once with 1 threads per replica");
  // A folder where the model belongs.
  r = run({"teacher", "info", "--model", dir.string()}, dir / "folder");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, dir.string() + ": a folder, not a file");

  const std::string input = (dir / "missing.npy").string();
  r = run({"teacher", "infer", "--model", model, "--input", input, "--output",
           (dir / "y.npy").string()},
          dir / "infer");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, input);
  EXPECT_FALSE(fs::exists(dir / "y.npy"));
}

// `teacher bench --precision int8 --calibration FILE.npy`: calibrated on the file's batches but
// the last, which checks the int8 logits against fp32; the JSON carries the check. Without the
// file, with too few samples, or on a CPU capped below VNNI (ONEDNN_MAX_CPU_ISA=AVX2): one line,
// exit 2, naming what is wrong.
TEST(TeacherCli, BenchInt8CalibratesChecksAndRefusesWhatItCannotRun) {
  const fs::path dir = scratch("int8");
  fs::create_directories(dir);
  const std::string model = fixture("resnet18_opset17.onnx").string();
  const std::string calib = fixture("resnet18_opset17.input.npy").string(); // 64 samples
  auto r = run({"teacher", "bench", "--model", model, "--precision", "int8", "--batch", "16"},
               dir / "none");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, "--calibration");
  r = run({"teacher", "bench", "--model", model, "--precision", "int8", "--batch", "64",
           "--calibration", calib},
          dir / "few");
  EXPECT_EQ(r.code, 2);
  expect_one_line_naming(r.err, calib);

  const fs::path json_out = dir / "bench.json";
  const std::vector<std::string> args = {"teacher",       "bench",
                                         "--model",       model,
                                         "--precision",   "int8",
                                         "--batch",       "16",
                                         "--threads",     "1",
                                         "--seconds",     "0.5",
                                         "--json",        json_out.string(),
                                         "--calibration", calib};
  const fs::path capped_err = dir / "capped.stderr";
  const Child capped = spawn(args, capped_err, "/dev/null", {"ONEDNN_MAX_CPU_ISA=AVX"});
  EXPECT_EQ(wait_exit(capped), 2);
  expect_one_line_naming(read_text(capped_err), "AVX2 at least");
  EXPECT_FALSE(fs::exists(json_out));

  r = run(args, dir / "bench");
  if (!kdflow::teacher::has_int8()) {
    EXPECT_EQ(r.code, 2);
    GTEST_SKIP() << "no int8 kernels on this CPU: " << r.err;
  }
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("calibrated on 48 samples"), std::string::npos) << r.err;
  const auto j = json::parse(read_text(json_out));
  EXPECT_EQ(j["precision"], "int8");
  EXPECT_EQ(j["int8"]["calibration_samples"], 48);
  EXPECT_EQ(j["int8"]["check_samples"], 16);
  EXPECT_GE(j["int8"]["top1_agreement"].get<double>(), 0.0);
  EXPECT_LE(j["int8"]["top1_agreement"].get<double>(), 1.0);
  EXPECT_GE(j["int8"]["kl"].get<double>(), 0.0);
  // How many quantized products have weights of each magnitude: 127 everywhere with int8 dot
  // products; without them "127 in pairs" where the kernel sums known pairs of u8 x s8 products
  // in 16 bits, 63 where it sums pairs not known.
  int products = 0;
  for (const auto& [levels, n] : j["int8"]["weight_levels"].items()) {
    EXPECT_TRUE(levels == "127" || levels == "127 in pairs" || levels == "63") << levels;
    EXPECT_TRUE(levels == "127" || !kdflow::teacher::has_native_int8()) << levels;
    products += n.get<int>();
  }
  EXPECT_GT(products, 0);
  EXPECT_GT(j["images_per_s"].get<double>(), 0.0);
}

// Where int8 changes the teacher's answers beyond quantization noise, `teacher bench` says so in a
// warning naming the model and the levers (and in its JSON), and goes on: the shipped teacher
// calibrated on Fashion-MNIST images shrunk a thousandfold (ranges far too narrow for the real
// images of its check batch) against the same teacher calibrated on the images themselves.
TEST(TeacherCli, BenchInt8WarnsWhereInt8ChangesTheTeachersAnswers) {
  if (!kdflow::teacher::has_int8()) GTEST_SKIP() << "no int8 kernels on this CPU";
  const fs::path dir = scratch("int8_warning");
  fs::create_directories(dir);
  const std::string model =
      (fs::path(KDFLOW_SOURCE_DIR) / "models" / "fmnist_teacher.onnx").string();
  const auto test = kdflow::Dataset::load("fashion-mnist", "/usr/share/datasets/fashion-mnist",
                                          kdflow::Split::test);
  constexpr std::size_t kSamples = 64, kPixels = 28 * 28;
  std::vector<float> images(kSamples * kPixels);
  for (std::size_t i = 0; i < kSamples; ++i) {
    const auto image = test.image(i);
    for (std::size_t k = 0; k < kPixels; ++k)
      images[i * kPixels + k] = (static_cast<float>(image[k]) / 255.f - 0.2860f) / 0.3530f;
  }
  std::vector<float> shrunk = images;
  for (std::size_t k = 0; k < 48 * kPixels; ++k) shrunk[k] *= 1e-3f; // the calibration's 3 batches
  const auto bench = [&](const std::string& name, const std::vector<float>& samples) {
    const fs::path npy = dir / (name + ".npy"), out = dir / (name + ".json");
    kdflow::teacher::write_npy(npy.string(), {static_cast<std::int64_t>(kSamples), 1, 28, 28},
                               samples.data());
    const Result r = run({"teacher", "bench", "--model", model, "--precision", "int8", "--batch",
                          "16", "--threads", "1", "--seconds", "0.2", "--calibration", npy.string(),
                          "--json", out.string()},
                         dir / name);
    EXPECT_EQ(r.code, 0) << r.err;
    return std::pair{r.err, json::parse(read_text(out))["int8"]};
  };
  const auto [bad_err, bad] = bench("shrunk", shrunk);
  EXPECT_LT(bad["top1_agreement"].get<double>(), 0.8);
  EXPECT_NE(bad_err.find("kdflow: warning: " + model + ": int8 changed the teacher's top-1"),
            std::string::npos)
      << bad_err;
  EXPECT_NE(bad_err.find("teacher.precision = bf16"), std::string::npos) << bad_err;
  ASSERT_TRUE(bad["warning"].is_string());
  EXPECT_NE(bad["warning"].get<std::string>().find(model), std::string::npos);

  const auto [good_err, good] = bench("real", images);
  EXPECT_GE(good["top1_agreement"].get<double>(), 0.9);
  EXPECT_EQ(good_err.find("kdflow: warning"), std::string::npos) << good_err;
  EXPECT_TRUE(good["warning"].is_null());
}

} // namespace
