// The CPU pipeline beside the student's code (its pipeline-only runs are pipeline_core_test.cpp,
// torch-free): a teacher of another input size, channel count and normalization than the data's
// gets its own input (against LibTorch's own resize), open input dimensions, kd.cache's refusals,
// a second teacher that cannot serve, the student's threads over the teachers' CPUs, and the loss
// vocabularies of the run's schema.
#include "pipeline.hpp"
#include "pipeline_helpers.hpp"
#include "run.hpp"
#include "session.hpp"
#include "tune_cores.hpp"

#include "../core/input_error.hpp"
#include "torch_teacher_impl.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/cpu_teacher/precision_names.hpp"
#include "kdflow/gpu_student/loss_table.hpp"
#include "kdflow/gpu_student/pinned_host.hpp"
#include "kdflow/gpu_student/settings.hpp"

#include <oneapi/tbb/task_arena.h>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace kdflow::app {
namespace {

// The run's Config for a fixture teacher on the default data, its roles placed by place_roles.
Config teacher_config(const std::string& model, std::vector<std::string> sets) {
  const CpuList cpus = allowed_cpus();
  const char* fixtures = std::getenv("KDFLOW_FIXTURES");
  sets.push_back("teacher.model=" + std::string(fixtures ? fixtures : ".") + "/ops/" + model);
  sets.push_back("teacher.tune=off");
  place_roles(cpus, sets);
  return resolve_config("", sets);
}

TEST(CpuPipeline, TeacherReadsItsOwnSizeChannelsAndNormalization) {
  ASSERT_GE(allowed_cpus().size(), 2u);
  // A 3 x 40 x 40 teacher trained with its own mean and std, on Fashion-MNIST's 1 x 28 x 28: the
  // replica's logits against the LibTorch executor given the same slot's images made its input
  // with LibTorch's own bilinear resize.
  for (const std::string dtype : {"float32", "uint8"}) {
    SCOPED_TRACE(dtype);
    const RunInputs run = prepare_run(teacher_config(
        "teacher_rgb40.onnx",
        {"data.batch_size=16", "data.slot_dtype=" + dtype, "teacher.mean=0.5,0.4,0.3",
         "teacher.std=0.2,0.25,0.3", "data.pad_crop=2", "data.hflip=true"}));
    const ImageAdapter& adapt = run.teachers.front().input;
    EXPECT_EQ(adapt.to(), (ImageSpec{3, 40, 40}));
    EXPECT_FALSE(adapt.passes_floats());
    const Sampler sampler(run.train.size(), run.sampler);
    constexpr std::uint32_t kSlots = 3;
    constexpr std::uint64_t kBatches = 12;
    const SlotLayout layout = CpuPipeline::layout_for(run);
    CpuPipeline pipeline(run, sampler, kSlots,
                         student::allocate_pinned_for_device(kSlots * layout.slot_bytes()));
    const student::TorchTeacher reference(run.teachers.front().model->graph(),
                                          student::resolve_device("cpu"));
    pipeline.start(0, kBatches);
    double worst = 0, largest = 0;
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      auto slot = pipeline.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto& d = run.train;
      const auto n = static_cast<std::int64_t>(run.sampler.batch_size);
      torch::Tensor images;
      if (dtype == "float32") {
        const auto in = slot->region<float>(pipeline.regions().loader.inputs);
        images =
            torch::from_blob(in.data(), {n, d.channels(), d.height(), d.width()}, torch::kFloat)
                .clone();
      } else {
        const auto in = slot->region<std::uint8_t>(pipeline.regions().loader.inputs);
        images =
            torch::from_blob(in.data(), {n, d.channels(), d.height(), d.width()}, torch::kUInt8)
                    .to(torch::kFloat) *
                channel_scale(run.augment, 0) +
            channel_shift(run.augment, 0);
      }
      const torch::Tensor expected =
          reference.impl().forward(student::adapt_images(adapt, images))[0].contiguous();
      const auto logits = slot->region<float>(*pipeline.regions().logits);
      for (std::size_t i = 0; i < logits.size(); ++i) {
        const float e = expected.data_ptr<float>()[i];
        worst = std::max(worst, static_cast<double>(std::fabs(logits[i] - e)));
        largest = std::max(largest, static_cast<double>(std::fabs(e)));
      }
      pipeline.ring().release(*slot);
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    EXPECT_GT(largest, 1e-2) << "logits that say something";
    EXPECT_LE(worst, 1e-4 * std::max(1.0, largest));
  }
}

TEST(CpuPipeline, TeacherInputSizeBindsOpenDimensionsAndRefusesOthers) {
  ASSERT_GE(allowed_cpus().size(), 2u);
  // Height and width left open by the model: the data's, unless teacher.input_size binds them.
  RunInputs run = prepare_run(teacher_config("teacher_open_hw.onnx", {"data.batch_size=8"}));
  EXPECT_EQ(run.teachers.front().model->input_shape(), (teacher::Shape{8, 1, 28, 28}));
  EXPECT_TRUE(run.teachers.front().input.passes_floats())
      << "nothing to do: the slots are its input";
  run = prepare_run(
      teacher_config("teacher_open_hw.onnx", {"data.batch_size=8", "teacher.input_size=56x48"}));
  EXPECT_EQ(run.teachers.front().model->input_shape(), (teacher::Shape{8, 1, 56, 48}));
  EXPECT_EQ(run.teachers.front().input.to(), (ImageSpec{1, 56, 48}));
  // A size the model fixes otherwise, values for the wrong channel count, a size out of range.
  const std::string fixed = test::error_of(
      [] { prepare_run(teacher_config("teacher_rgb40.onnx", {"teacher.input_size=32"})); });
  EXPECT_NE(fixed.find("teacher_rgb40.onnx"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("teacher.input_size"), std::string::npos) << fixed;
  EXPECT_NE(fixed.find("[3, 40, 40]"), std::string::npos) << fixed;
  const std::string mean = test::error_of(
      [] { prepare_run(teacher_config("teacher_rgb40.onnx", {"teacher.mean=0.5,0.5"})); });
  EXPECT_NE(mean.find("teacher.mean"), std::string::npos) << mean;
  const std::string size = test::error_of(
      [] { prepare_run(teacher_config("teacher_open_hw.onnx", {"teacher.input_size=9000"})); });
  EXPECT_NE(size.find("teacher.input_size"), std::string::npos) << size;
}

// The shipped teacher's run configuration (shipped_teacher_sets).
Config shipped_teacher_config(std::vector<std::string> sets) {
  return resolve_config("", shipped_teacher_sets(std::move(sets)));
}

TEST(Session, StudentThreadsBeyondItsCpusShareTheTeachers) {
  for (const int threads : {0, 1, 8}) {
    SCOPED_TRACE(threads);
    const RunInputs run = prepare_run(
        shipped_teacher_config({"student.device=cpu", "train.threads=" + std::to_string(threads)}));
    const CpuList got = student_cpus(run);
    CpuList want = run.plan.student;
    if (threads > static_cast<int>(run.plan.student.size()))
      for (const auto& replica : run.plan.teacher)
        for (const int c : replica)
          if (std::find(want.begin(), want.end(), c) == want.end()) want.push_back(c);
    EXPECT_EQ(got, want);
    if (threads == 8) {
      EXPECT_GT(got.size(), run.plan.student.size()) << "the teachers' CPUs are shared";
    } else {
      EXPECT_EQ(got, run.plan.student);
    }
    // cores.student_first = auto: the teachers (and loaders) whose CPUs the student's extra
    // threads share go to the background; with no extra threads every producer stays normal, the
    // loaders beside the student's own CPU included.
    for (const auto& replica : run.plan.teacher)
      EXPECT_EQ(producer_priority(run, replica),
                threads == 8 ? affinity::Priority::background : affinity::Priority::normal);
    EXPECT_EQ(producer_priority(run, run.plan.student),
              threads == 8 ? affinity::Priority::background : affinity::Priority::normal);
  }
  // on and off: every producer, whatever it shares.
  const RunInputs on = prepare_run(shipped_teacher_config({"cores.student_first=on"}));
  const RunInputs off =
      prepare_run(shipped_teacher_config({"cores.student_first=off", "train.threads=8"}));
  for (const auto& replica : on.plan.teacher)
    EXPECT_EQ(producer_priority(on, replica), affinity::Priority::background);
  for (const auto& replica : off.plan.teacher)
    EXPECT_EQ(producer_priority(off, replica), affinity::Priority::normal);
}

// ring.slots = 0 (the default) sizes the ring for the plan: a slot for every loader CPU and
// teacher replica and four for the student, at least 8, within an eighth of the memory.
TEST(CpuPipeline, TheRingIsSizedForEveryProducerAndTheStudent) {
  constexpr double kGiB = 1 << 30;
  EXPECT_EQ(auto_ring_slots(2, 1000, 64 * kGiB, 1), 8u);
  EXPECT_EQ(auto_ring_slots(4, 1000, 64 * kGiB, 1), 8u);
  EXPECT_EQ(auto_ring_slots(15, 1000, 64 * kGiB, 1), 19u);
  EXPECT_EQ(auto_ring_slots(100000, 1000, 64 * kGiB, 1), 4096u);
  // The memory bound: 8 GiB of 64 over 100 MiB slots is 81; halved for two ranks on the node; and
  // never under 8 slots.
  EXPECT_EQ(auto_ring_slots(200, 100 << 20, 64 * kGiB, 1), 81u);
  EXPECT_EQ(auto_ring_slots(200, 100 << 20, 64 * kGiB, 2), 40u);
  EXPECT_EQ(auto_ring_slots(200, std::size_t{2} << 30, 64 * kGiB, 4), 8u);

  // Loader workers on every loader and teacher CPU (kd.cache's share) beside every replica.
  RunInputs run = prepare_run(shipped_teacher_config({"student.device=cpu"}));
  const std::size_t producers =
      run.plan.loader.size() + affinity::cpu_count(run.plan.teacher) + run.plan.teacher.size();
  EXPECT_EQ(CpuPipeline::slots_for(run), std::max<std::size_t>(8, producers + 4));
  // A plan of 14 one-CPU replicas (as tune-cores measures on 16 CPUs) gets a ring they and the
  // loaders beside them all fit in.
  run.plan.teacher.assign(14, affinity::CpuList{run.plan.teacher.front().front()});
  run.plan.teacher_of.assign(14, 0);
  EXPECT_EQ(CpuPipeline::slots_for(run), run.plan.loader.size() + 14 + 14 + 4);
  // Set: as set; 1 is refused naming the key.
  EXPECT_EQ(CpuPipeline::slots_for(prepare_run(shipped_teacher_config({"ring.slots=3"}))), 3u);
  const std::string one = test::error_of(
      [] { (void)CpuPipeline::slots_for(prepare_run(shipped_teacher_config({"ring.slots=1"}))); });
  EXPECT_NE(one.find("ring.slots = 1"), std::string::npos) << one;
}

// A cache is refused where a sample's teacher input changes between epochs, unless
// kd.cache_augmented asks for the first view's outputs (never under a mix).
TEST(CpuPipeline, TeacherOutputCacheIsRefusedWithRandomAugmentation) {
  for (const std::string set : {"data.pad_crop=2", "data.hflip=true"}) {
    const std::string key = set.substr(0, set.find('='));
    const std::string error = test::error_of([&] {
      RunInputs run = prepare_run(shipped_teacher_config({"kd.cache=memory", set}));
      prepare_teacher_cache(run);
    });
    EXPECT_NE(error.find("kd.cache = memory"), std::string::npos) << error;
    EXPECT_NE(error.find(key), std::string::npos) << error;
    EXPECT_NE(error.find("kd.cache_augmented"), std::string::npos) << "names the way out";
    // Asked for: each sample's first view's outputs serve later epochs, and the disk file's key
    // says so (a file of unaugmented outputs is not read for them).
    const std::string file =
        std::filesystem::temp_directory_path().string() + "/kdflow_views.kdcache";
    RunInputs views = prepare_run(shipped_teacher_config(
        {"kd.cache=disk", "kd.cache_path=" + file, "kd.cache_augmented=true", set}));
    prepare_teacher_cache(views);
    ASSERT_NE(views.cache, nullptr) << set;
    const auto at = views.cache_key.find("\nviews=first of ");
    ASSERT_NE(at, std::string::npos) << views.cache_key;
    EXPECT_NE(views.cache_key.find(" " + set, at), std::string::npos) << views.cache_key;
  }
  // A mix's targets follow the mix: refused even when asked for.
  const std::string mixed = test::error_of([&] {
    RunInputs run = prepare_run(shipped_teacher_config(
        {"kd.cache=memory", "kd.cache_augmented=true", "data.mixup_alpha=0.8"}));
    prepare_teacher_cache(run);
  });
  EXPECT_NE(mixed.find("data.mixup_alpha"), std::string::npos) << mixed;
  RunInputs run = prepare_run(shipped_teacher_config({}));
  prepare_teacher_cache(run);
  EXPECT_EQ(run.cache, nullptr);
  run = prepare_run(shipped_teacher_config({"kd.cache=memory"}));
  EXPECT_EQ(run.cache, nullptr) << "prepare_run leaves the cache to the commands that read it";
  EXPECT_FALSE(run.sampler.fixed_shards) << "one process";
  prepare_teacher_cache(run);
  ASSERT_NE(run.cache, nullptr);
  // Several ranks: each keeps its own shard every epoch (the sampler's fixed shards, its own
  // test), and with kd.cache = disk its own file.
  {
    const std::string folder = std::filesystem::temp_directory_path().string();
    Config ranks = shipped_teacher_config(
        {"kd.cache=disk", "kd.cache_path=" + folder + "/kdflow_ranks.kdcache"});
    DistEnv two;
    two.world = 2;
    two.rank = 1; // one rank a node: the plan stays the config's CPU lists
    RunInputs shard = prepare_run(ranks, two);
    EXPECT_TRUE(shard.sampler.fixed_shards);
    prepare_teacher_cache(shard);
    ASSERT_NE(shard.cache, nullptr);
    EXPECT_EQ(shard.cache_file.string(), folder + "/kdflow_ranks.kdcache.rank1-of-2");
    // One teacher without features: the key's lines are the ones files have always been written
    // with (a file of an earlier kdflow stays readable), in their order.
    std::vector<std::string> names;
    std::istringstream lines(shard.cache_key);
    for (std::string line; std::getline(lines, line);)
      names.push_back(line.substr(0, line.find('=')));
    EXPECT_EQ(names,
              (std::vector<std::string>{"kdflow teacher outputs", "teacher", "teacher.precision",
                                        "teacher.input", "data", "classes", "kept"}))
        << shard.cache_key;
    ranks.set("kd.cache=none");
    EXPECT_FALSE(prepare_run(ranks, two).sampler.fixed_shards) << "without a cache, as before";
  }
  // A file named for a cache that keeps none, a folder named as the file, a folder that is not.
  const auto refused = [&](const std::vector<std::string>& sets, const std::string& what) {
    for (const auto& set : sets) run.config.set(set);
    const std::string e = test::error_of([&] { prepare_teacher_cache(run); });
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_EQ(run.cache, nullptr);
  };
  const std::string tmp = std::filesystem::temp_directory_path().string();
  refused({"kd.cache_path=" + tmp + "/outputs.kdcache"}, "kd.cache = memory keeps no file");
  refused({"kd.cache=disk", "kd.cache_path=" + tmp}, "a folder, not a file");
  refused({"kd.cache_path=" + tmp + "/kdflow-no-such-folder/outputs.kdcache"},
          "its folder does not exist");
}

// A second teacher of other classes, or of no file: exit 2 naming its row.
TEST(CpuPipeline, ASecondTeacherOfOtherClassesOrNoFileIsRefusedNamingItsRow) {
  const CpuList cpus = allowed_cpus();
  ASSERT_GE(cpus.size(), 2u);
  const auto config = [&](const std::string& other) {
    Config c = shipped_teacher_config({"data.batch_size=16"});
    c.set("teacher.others=[{model = \"" + other + "\", weight = 1}]");
    c.set(fmt::format("cores.teacher_cpus={}|{}", cpus.at(1), cpus.at(1)));
    return c;
  };
  const char* fixtures = std::getenv("KDFLOW_FIXTURES");
  const std::string e = test::error_of([&] {
    (void)prepare_run(config(std::string(fixtures ? fixtures : ".") + "/models/mlp7_opset13.onnx"));
  });
  for (const char* w : {"teacher.others[1].model", "mlp7_opset13.onnx", "7 logits", "10 classes"})
    EXPECT_NE(e.find(w), std::string::npos) << e;
  const std::string missing = test::error_of([&] { (void)prepare_run(config("no_such.onnx")); });
  EXPECT_NE(missing.find("teacher.others[1].model = no_such.onnx: no such file"), std::string::npos)
      << missing;
}

// The loss vocabularies live in the student's loss tables: kd.loss's choices, each loss's
// parameter keys (kd.<loss>_<param>, with the row's default) and kd.features' `loss` come from
// them, and the trainer's options carry the chosen loss's parameters in its row's order.
TEST(RunSchema, LossChoicesAndParameterKeysComeFromTheLossTables) {
  const std::vector<ConfigKey>& schema = run_schema();
  const auto key = [&](const std::string& name) -> const ConfigKey& {
    const auto it = std::find_if(schema.begin(), schema.end(),
                                 [&](const ConfigKey& k) { return k.name == name; });
    EXPECT_NE(it, schema.end()) << name;
    return *it;
  };
  std::vector<std::string> kd_names, feature_names;
  for (const auto& loss : student::kd_losses()) {
    kd_names.push_back(loss.name);
    for (const auto& param : loss.params) {
      const ConfigKey& k = key(student::kd_param_key(loss.name, param.name));
      EXPECT_EQ(std::get<double>(k.default_value), param.default_value) << k.name;
      EXPECT_EQ(k.min, param.min) << k.name;
    }
  }
  for (const auto& loss : student::feature_losses()) feature_names.push_back(loss.name);
  EXPECT_EQ(key("kd.loss").choices, kd_names);
  ASSERT_GE(kd_names.size(), 2u) << "kl and dkd at least";
  const auto& fields = key("kd.features").fields;
  const auto loss_field = std::find_if(fields.begin(), fields.end(),
                                       [](const ConfigKey& f) { return f.name == "loss"; });
  ASSERT_NE(loss_field, fields.end());
  EXPECT_EQ(loss_field->choices, feature_names);
  EXPECT_EQ(key("kd.dkd_beta").name, "kd.dkd_beta") << "the keys users already write";

  // The modules' other vocabularies, the same way (core's schema lists none of them).
  for (const auto& [name, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"student.device", student::device_names()},
           {"train.amp", student::amp_names()},
           {"dist.backend", student::backend_names()},
           {"teacher.precision", teacher::precision_names()}}) {
    EXPECT_EQ(key(name).choices, names) << name;
    const std::string e = test::error_of([&] { (void)resolve_config("", {name + "=tpu"}); });
    EXPECT_NE(e.find(name), std::string::npos) << e;
    EXPECT_NE(e.find(names.front()), std::string::npos) << e;
  }
  const std::string bad = test::error_of([] { (void)resolve_config("", {"kd.loss=l3"}); });
  EXPECT_NE(bad.find("kd.loss"), std::string::npos) << bad;
  Config c(run_schema());
  const std::string row = test::error_of(
      [&] { c.merge_toml("[[kd.features]]\nteacher = \"a\"\nloss = \"l2\"\n", "f.toml"); });
  for (const char* word : {"f.toml", "kd.features[1].loss", "l2", "hint"})
    EXPECT_NE(row.find(word), std::string::npos) << word << ": " << row;
  const RunInputs run =
      prepare_run(shipped_teacher_config({"kd.loss=dkd", "kd.dkd_beta=3", "data.batch_size=8"}));
  EXPECT_EQ(trainer_options(run, 1).kd_params, (std::vector<double>{1.0, 3.0}));
  const RunInputs kl = prepare_run(shipped_teacher_config({"data.batch_size=8"}));
  EXPECT_TRUE(trainer_options(kl, 1).kd_params.empty()) << "kl reads no parameter";
}

} // namespace
} // namespace kdflow::app

// tune-cores' plans with CPUs left spare: a teacher's replicas halved while the rate measured on
// the fewer still reaches the target; never below one, never more than asked for.
TEST(TuneCores, TeacherReplicasAreHalvedWhileTheirRateKeepsTheHeadroom) {
  std::vector<std::size_t> asked;
  // A stage that loses a little per replica to contention among them: 14 -> 7 -> 3 keep the
  // target, 1 does not.
  const auto rate = [&](std::size_t r) {
    asked.push_back(r);
    return static_cast<double>(r) * (1000.0 - 20.0 * static_cast<double>(r));
  };
  EXPECT_EQ(kdflow::app::fewest_replicas(14, 2000, rate), 3u);
  EXPECT_EQ(asked, (std::vector<std::size_t>{7, 3, 1}));
  asked.clear();
  EXPECT_EQ(kdflow::app::fewest_replicas(14, 1e9, rate), 14u)
      << "no fewer replicas keep the target";
  EXPECT_EQ(asked, (std::vector<std::size_t>{7}));
  asked.clear();
  EXPECT_EQ(kdflow::app::fewest_replicas(8, 0, rate), 1u);
  EXPECT_EQ(kdflow::app::fewest_replicas(1, 0, rate), 1u);
}
