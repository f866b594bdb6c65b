// The CPU pipeline driven directly, without LibTorch (no student; the test thread consumes the
// ready slots): the flow-graph stages, teacher replicas and lanes, kd.cache's decisions shared by
// two teachers, the moves of CPUs between the stages and the loaders' move onto the teacher's
// CPUs. The TSan build runs this suite on a TSan-built oneTBB (scripts/tbb_tsan.sh): every
// hand-off here is one the race detector sees. On a machine with a CPU to spare the moves are
// kd-ctl's own (a loader CPU to the teacher, where it starts a second replica, and back); on two
// CPUs the loader and teacher pools trade CPUs. Checked: every batch arrives once, in order, with
// the sampler's samples and the teacher's logits for them; the arenas the last move built run
// their workers on its CPUs.
#include "pipeline.hpp"
#include "pipeline_helpers.hpp"
#include "run_inputs.hpp"

#include "../core/input_error.hpp"

#include "kdflow/affinity/pinning.hpp"
#include "kdflow/core/host_memory.hpp"

#include <oneapi/tbb/task_arena.h>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kdflow::app {
namespace {

using namespace std::chrono_literals;
using affinity::PoolAssignment;

Config config_of(const std::vector<std::string>& sets) {
  Config config;
  for (const auto& s : sets) config.set(s);
  return config;
}

// The shipped teacher's run configuration (shipped_teacher_sets).
Config shipped_teacher_config(std::vector<std::string> sets) {
  return config_of(shipped_teacher_sets(std::move(sets)));
}

// `f()` in an arena of one thread, where oneDNN runs its work inline. Under TSan every oneDNN call
// here has one thread (the loads, the references; the pipeline's replicas are one CPU wide): a
// parallel region of the PyPI oneDNN runs oneTBB's templates compiled into libdnnl, which is not
// instrumented, so TSan would not see the region end and would report oneTBB's own bookkeeping
// (its task_group_context on the caller's stack) once that memory is reused.
template <class F>
auto on_one_thread(F&& f) {
  oneapi::tbb::task_arena one(1);
  return one.execute(std::forward<F>(f));
}

// The run's inputs for a student on the CPU, as prepare_run makes them where there is no GPU.
RunInputs cpu_run(const Config& config) {
  return on_one_thread([&] { return load_run_inputs(config, {}, {}, {}); });
}

// cpu_run's inputs on the first 96 training samples, kd.cache made ready for them.
RunInputs cached_run(const Config& config) {
  RunInputs run = cpu_run(config);
  run.train = first_samples(run.train, 96);
  prepare_teacher_cache(run);
  return run;
}

TEST(CpuPipeline, PoolsMovedWhileBatchesFlowLoseNothingAndRunOnTheirNewCpus) {
  const CpuList cpus = allowed_cpus();
  ASSERT_GE(cpus.size(), 2u);
  // The plan: student on the first CPU; on two CPUs the loaders share it, otherwise two loader
  // CPUs; one teacher CPU.
  const bool two = cpus.size() < 4;
  const CpuList loaders = two ? CpuList{cpus[0]} : CpuList{cpus[1], cpus[2]};
  const int teacher_cpu = two ? cpus[1] : cpus[3];
  const Config config = config_of(
      {"teacher.model=" + std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx",
       "data.batch_size=32", "data.slot_dtype=float32", "data.pad_crop=2", "data.hflip=true",
       "cores.student_cpus=" + std::to_string(cpus[0]), "cores.loader_cpus=" + cpu_text(loaders),
       "cores.teacher_cpus=" + std::to_string(teacher_cpu)});
  const RunInputs run = cpu_run(config);
  ASSERT_TRUE(run.teacher_runs());
  const Sampler sampler(run.train.size(), run.sampler);
  constexpr std::uint32_t kSlots = 4;
  constexpr std::uint64_t kBatches = 600;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  CpuPipeline pipeline(run, sampler, kSlots, allocate_locked(kSlots * layout.slot_bytes()));

  const PoolAssignment planned = pipeline.assignment();
  ASSERT_EQ(planned.loader, loaders);
  // The other assignment the mover alternates with.
  PoolAssignment other;
  if (two) {
    other = {CpuList{teacher_cpu}, {CpuList{cpus[0]}}}; // the pools trade CPUs
  } else {
    const auto moved = affinity::move_cpu(planned, affinity::Move::to_teacher, CpuList{cpus[0]}, 1);
    ASSERT_TRUE(moved);
    other = *moved;
    ASSERT_EQ(other.teacher.size(), 2u) << "a second replica on the moved CPU";
  }
  EXPECT_THROW(pipeline.reassign({loaders, {CpuList{teacher_cpu}, CpuList{teacher_cpu}}}),
               std::invalid_argument)
      << "more CPUs than the plan's";

  pipeline.start(0, kBatches);

  // The mover: alternates the two assignments every few milliseconds until the consumer is done.
  std::atomic<bool> consumed_all{false};
  int moves = 0;
  PoolAssignment last = planned;
  std::thread mover;
  // However the consumer ends: the ring closes (a move in progress returns false), then the mover
  // is joined.
  struct Finish {
    std::atomic<bool>& done;
    CpuPipeline& pipeline;
    std::thread& mover;
    ~Finish() {
      done.store(true);
      pipeline.stop();
      if (mover.joinable()) mover.join();
    }
  } finish{consumed_all, pipeline, mover};
  mover = std::thread([&] {
    for (int k = 0; !consumed_all.load(); ++k) {
      const PoolAssignment& to = (k % 2 == 0) ? other : planned;
      if (!pipeline.reassign(to)) break;
      ++moves;
      last = to;
      std::this_thread::sleep_for(3ms);
    }
  });

  // The consumer: each batch in order, checked against the sampler and a reference replica of the
  // same teacher (one thread, like the pipeline's).
  oneapi::tbb::task_arena one_thread(1);
  std::unique_ptr<teacher::Replica> reference;
  one_thread.execute(
      [&] { reference = std::make_unique<teacher::Replica>(run.teachers.front().model); });
  const std::size_t classes = run.train.classes();
  std::vector<float> expected(run.sampler.batch_size * classes);
  std::vector<std::uint32_t> indices;
  std::uint64_t consumed = 0;
  double worst = 0;
  for (std::uint64_t b = 0; b < kBatches; ++b) {
    auto slot = pipeline.ring().acquire_ready(b);
    ASSERT_TRUE(slot) << "batch " << b;
    ASSERT_EQ(slot->header().batch, b);
    sampler.batch_indices(b / sampler.batches_per_epoch(), b % sampler.batches_per_epoch(),
                          indices);
    const auto ids = slot->region<std::int64_t>(pipeline.regions().loader.ids);
    for (std::size_t i = 0; i < indices.size(); ++i)
      ASSERT_EQ(ids[i], indices[i]) << "batch " << b << " sample " << i;
    const auto inputs = slot->region<float>(pipeline.regions().loader.inputs);
    float* out[] = {expected.data()};
    one_thread.execute([&] { reference->run(inputs.data(), out); });
    const auto logits = slot->region<float>(*pipeline.regions().logits);
    for (std::size_t i = 0; i < expected.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(logits[i] - expected[i])));
    pipeline.ring().release(*slot);
    ++consumed;
  }
  consumed_all.store(true);
  mover.join();
  pipeline.ring().rethrow_if_failed();

  // The stages are idle now: a task sent into each arena the last move built says where its
  // workers run (while a stage runs, its graph's own tasks always come first).
  EXPECT_EQ(pipeline.assignment(), last);
  EXPECT_EQ(cpus_seen_in(pipeline.loader_arena()), last.loader);
  ASSERT_EQ(pipeline.replicas(), last.teacher.size());
  for (std::size_t r = 0; r < last.teacher.size(); ++r)
    EXPECT_EQ(cpus_seen_in(pipeline.teacher(0).unit(r).arena()), last.teacher[r])
        << "replica " << r;

  EXPECT_EQ(consumed, kBatches);
  EXPECT_LE(worst, 1e-5) << "the logits in the slots are the teacher's for the slot's images";
  EXPECT_GE(moves, 4) << "the pools moved while batches flowed";
  RecordProperty("moves", moves);
  const RingStats stats = pipeline.ring().stats();
  EXPECT_EQ(stats.stages[static_cast<int>(RingStage::loader)].acquisitions, kBatches)
      << "each batch loaded once";
  EXPECT_EQ(stats.stages[static_cast<int>(RingStage::teacher)].acquisitions, kBatches)
      << "each batch taught once";
}

// kd.cache = memory over two epochs of 96 samples: the first keeps each sample's logits as the
// teacher computed them, the second reads every batch from the cache (no forward pass), and each
// sample's target is the same in both: every logit the teacher's, or under top-K its K largest
// and the rest's probability mass at kd.temperature (what the cache keeps, served from the first
// epoch on). Checked against the teacher run afresh on each slot (within float rounding: other
// threads, and in epoch 2 other batches around each sample). The teacher's features (two of its
// values, teacher.features) are kept whole beside the logits and served the same way.
TEST(CpuPipeline, TeacherOutputCacheServesLaterEpochsWithWhatTheTeacherComputed) {
  ASSERT_GE(allowed_cpus().size(), 2u);
  constexpr double kTemperature = 2.0;
  const auto values =
      per_sample_values(std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx");
  ASSERT_GE(values.size(), 2u);
  const std::vector<std::string> features = {values.front(), values[values.size() / 2]};
  for (const int top_k : {0, 3}) {
    SCOPED_TRACE("kd.cache_topk = " + std::to_string(top_k));
    RunInputs run = cached_run(shipped_teacher_config(
        {"data.batch_size=16", "kd.cache=memory", "kd.cache_topk=" + std::to_string(top_k),
         "kd.temperature=" + std::to_string(kTemperature),
         "teacher.features=[\"" + features[0] + "\", \"" + features[1] + "\"]"}));
    ASSERT_NE(run.cache, nullptr);
    const Sampler sampler(run.train.size(), run.sampler);
    const std::uint64_t per_epoch = sampler.batches_per_epoch();
    ASSERT_EQ(per_epoch, 6u);
    constexpr std::uint32_t kSlots = 3;
    const SlotLayout layout = CpuPipeline::layout_for(run);
    CpuPipeline pipeline(run, sampler, kSlots, allocate_locked(kSlots * layout.slot_bytes()));
    const auto classes = static_cast<std::size_t>(run.train.classes());
    const auto fresh = on_one_thread(
        [&] { return std::make_unique<teacher::Replica>(run.teachers.front().model); });
    teacher::OutputBuffers again(*run.teachers.front().model);
    std::map<std::int64_t, std::vector<float>> taught; // the first epoch's logits per sample
    std::map<std::int64_t, std::vector<float>> taught_features; // and its features, in turn
    ASSERT_EQ(pipeline.regions().features.at(0).size(), 2u);
    std::size_t per_sample = 0; // feature values per sample
    for (const std::size_t r : pipeline.regions().features[0])
      per_sample += layout.regions()[r].bytes / sizeof(float) / 16;
    EXPECT_EQ(run.cache->features(), per_sample);
    double worst = 0, largest = 0, worst_feature = 0, largest_feature = 0;
    pipeline.start(0, 2 * per_epoch, {.cache = true});
    ASSERT_EQ(pipeline.targets().cache(), run.cache.get());
    // With every sample kept, the loaders take the teacher's CPU too: a move made on another
    // thread while the student goes on (it waits for the loaders to drain).
    std::thread sharer;
    bool shared = false;
    for (std::uint64_t b = 0; b < 2 * per_epoch; ++b) {
      if (b == per_epoch && top_k == 0)
        sharer = std::thread([&] { shared = pipeline.share_teacher_cpus(); });
      auto slot = pipeline.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto ids = slot->region<std::int64_t>(pipeline.regions().loader.ids);
      const auto logits = slot->region<float>(*pipeline.regions().logits);
      const std::size_t n = slot->header().samples;
      ASSERT_EQ(n, run.sampler.batch_size);
      on_one_thread([&] {
        fresh->run(slot->region<float>(pipeline.regions().loader.inputs).data(), again.pointers);
      });
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<float> kept; // sample i's features, as the slot holds them
        for (std::size_t k = 0; k < 2; ++k) {
          const auto all = slot->region<float>(pipeline.regions().features[0][k]);
          const std::size_t per = all.size() / n;
          const auto got = all.subspan(i * per, per);
          for (std::size_t j = 0; j < per; ++j) {
            const float want = again.data[1 + k][i * per + j];
            worst_feature = std::max(worst_feature, double(std::fabs(got[j] - want)));
            largest_feature = std::max(largest_feature, double(std::fabs(want)));
          }
          kept.insert(kept.end(), got.begin(), got.end());
        }
        if (b < per_epoch)
          taught_features[ids[i]] = kept;
        else
          EXPECT_EQ(kept, taught_features.at(ids[i])) << "sample " << ids[i] << "'s features";
        const auto row = logits.subspan(i * classes, classes);
        const std::span<const float> z(again.data[0].data() + i * classes, classes);
        // The same target every epoch: the first keeps it, the second reads it.
        if (b < per_epoch)
          taught[ids[i]].assign(row.begin(), row.end());
        else
          EXPECT_TRUE(std::equal(row.begin(), row.end(), taught.at(ids[i]).begin()))
              << "sample " << ids[i];
        if (top_k == 0) {
          for (std::size_t c = 0; c < classes; ++c) {
            worst = std::max(worst, static_cast<double>(std::fabs(row[c] - z[c])));
            largest = std::max(largest, static_cast<double>(std::fabs(z[c])));
          }
          continue;
        }
        // Under top-K: the K largest of the teacher's as they are, the rest's mass at T kept.
        std::vector<std::size_t> order(classes);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t c) { return row[a] > row[c]; });
        const auto k = static_cast<std::size_t>(top_k);
        for (std::size_t j = 0; j < k; ++j)
          EXPECT_NEAR(row[order[j]], z[order[j]], 1e-4 * std::max(1.f, std::fabs(z[order[j]])))
              << "sample " << ids[i];
        const auto p = softmax_at(z, kTemperature), q = softmax_at(row, kTemperature);
        double rest_p = 0, rest_q = 0;
        for (std::size_t j = k; j < classes; ++j) {
          rest_p += p[order[j]];
          rest_q += q[order[j]];
        }
        EXPECT_NEAR(rest_q, rest_p, 1e-5) << "sample " << ids[i];
      }
      pipeline.ring().release(*slot);
    }
    if (sharer.joinable()) {
      sharer.join(); // every batch is loaded: the loaders' graph is done, the move needs nothing
      EXPECT_TRUE(shared);
      EXPECT_TRUE(pipeline.shared());
      const CpuList loaders = pipeline.assignment().loader;
      for (const int c : run.plan.teacher.front())
        EXPECT_NE(std::find(loaders.begin(), loaders.end(), c), loaders.end()) << "CPU " << c;
      EXPECT_FALSE(pipeline.share_teacher_cpus()) << "once";
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    EXPECT_EQ(taught.size(), 96u);
    EXPECT_EQ(pipeline.targets().cache()->stored(), 96u);
    EXPECT_EQ(pipeline.targets().cached_batches(), per_epoch) << "the second epoch ran the teacher";
    // A pipeline started on a full cache: the loaders on the teacher's CPU from the start, every
    // batch served from the cache.
    CpuPipeline again_on(run, sampler, kSlots, allocate_locked(kSlots * layout.slot_bytes()));
    again_on.start(0, per_epoch, {.cache = true, .share_teacher_cpus = true});
    EXPECT_TRUE(again_on.shared());
    for (std::uint64_t b = 0; b < per_epoch; ++b) {
      auto slot = again_on.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto ids = slot->region<std::int64_t>(again_on.regions().loader.ids);
      for (std::size_t i = 0; i < 16; ++i) {
        std::vector<float> kept;
        for (const std::size_t r : again_on.regions().features[0]) {
          const auto all = slot->region<float>(r);
          const auto got = all.subspan(i * (all.size() / 16), all.size() / 16);
          kept.insert(kept.end(), got.begin(), got.end());
        }
        EXPECT_EQ(kept, taught_features.at(ids[i])) << "sample " << ids[i] << "'s features";
      }
      again_on.ring().release(*slot);
    }
    again_on.stop();
    again_on.ring().rethrow_if_failed();
    EXPECT_EQ(again_on.targets().cached_batches(), per_epoch);
    EXPECT_GT(largest_feature, 1e-2) << "features that say something";
    EXPECT_LE(worst_feature, 1e-4 * std::max(1.0, largest_feature)) << "the teacher's features";
    if (top_k == 0) {
      EXPECT_GT(largest, 1e-2) << "logits that say something";
      EXPECT_LE(worst, 1e-4 * std::max(1.0, largest));
    }
  }
}

// Several teachers: each gets its own replicas and logits region, works on every batch beside the
// other, and the batch's logits region holds their mix at kd.temperature (TeacherMix, its own
// test) of exactly what each replica computes; a teacher alone (a benchmark's stage) fills its
// region for every batch.
TEST(CpuPipeline, TwoTeachersReachTheirRegionsAndTheTargetIsTheirMix) {
  const CpuList cpus = allowed_cpus();
  ASSERT_GE(cpus.size(), 2u);
  const std::string second = std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher_w16.onnx";
  const auto config = [&](const std::string& other) {
    Config c = shipped_teacher_config({"data.batch_size=16", "kd.temperature=3"});
    c.set("teacher.weight=2");
    c.set("teacher.others=[{model = \"" + other + "\", weight = 1}]");
    // Both on the teacher CPU (one teacher CPU on a 2-CPU machine: they share it).
    c.set(fmt::format("cores.teacher_cpus={}|{}", cpus.at(1), cpus.at(1)));
    return c;
  };
  const RunInputs run = cpu_run(config(second));
  ASSERT_EQ(run.teachers.size(), 2u);
  ASSERT_TRUE(run.mix);
  EXPECT_EQ(run.plan.teacher_of, (std::vector<int>{0, 1}));
  const Sampler sampler(run.train.size(), run.sampler);
  constexpr std::uint32_t kSlots = 3;
  constexpr std::uint64_t kBatches = 12;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  oneapi::tbb::task_arena one_thread(1);
  std::unique_ptr<teacher::Replica> first, other;
  one_thread.execute([&] {
    first = std::make_unique<teacher::Replica>(run.teachers.front().model);
    other = std::make_unique<teacher::Replica>(run.teachers[1].model);
  });
  teacher::OutputBuffers want0(*run.teachers.front().model), want1(*run.teachers[1].model);
  std::vector<float> want_mix(want0.data[0].size());
  // Each replica's logits for a slot's images (want0, want1), and their mix (want_mix).
  const auto teach_both = [&](std::span<const float> inputs, const TeacherMix& mix) {
    one_thread.execute([&] {
      first->run(inputs.data(), want0.pointers);
      other->run(inputs.data(), want1.pointers);
    });
    const float* each[] = {want0.data[0].data(), want1.data[0].data()};
    mix(each, 16, 10, want_mix.data());
  };
  for (const std::optional<std::size_t> only :
       {std::optional<std::size_t>(), std::optional<std::size_t>(1)}) {
    CpuPipeline pipeline(run, sampler, kSlots, allocate_locked(kSlots * layout.slot_bytes()));
    const SlotRegions& r = pipeline.regions();
    ASSERT_EQ(r.teacher_logits.size(), 2u);
    EXPECT_EQ(layout.regions()[r.teacher_logits[1]].spec.name, teacher_logits_region(1));
    EXPECT_EQ(pipeline.ring().teachers(), 2u);
    pipeline.start(0, kBatches, {.loaders = true, .teacher = true, .only_teacher = only});
    double worst = 0, worst_mix = 0;
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      auto slot = pipeline.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto inputs = slot->region<float>(r.loader.inputs);
      teach_both(inputs, *run.mix);
      for (std::size_t t = 0; t < 2; ++t) {
        if (only && t != *only) continue;
        const auto got = slot->region<float>(r.teacher_logits[t]);
        const auto& want = t == 0 ? want0.data[0] : want1.data[0];
        for (std::size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, double(std::fabs(got[i] - want[i])));
      }
      if (!only) {
        const auto target = slot->region<float>(*r.logits);
        for (std::size_t i = 0; i < target.size(); ++i)
          worst_mix = std::max(worst_mix, double(std::fabs(target[i] - want_mix[i])));
      }
      pipeline.ring().release(*slot);
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    EXPECT_LE(worst, 1e-5) << "each teacher's region holds its replica's logits";
    EXPECT_LE(worst_mix, 1e-5) << "the target is their mix";
    const RingStats stats = pipeline.ring().stats();
    EXPECT_EQ(stats.stages[static_cast<int>(RingStage::teacher)].acquisitions,
              (only ? 1 : 2) * kBatches)
        << "each teacher on each batch once";
  }

  // A feature of the second teacher (kd.features' `from`): its own region, apart from the first's
  // value of the same name, holding what that teacher's replica computes.
  {
    const std::string value = "/features/features.12/Relu_output_0";
    Config c = config(second);
    c.set("kd.features=[{teacher = \"" + value +
          "\", student = \"stage2\", from = 1}, "
          "{teacher = \"" +
          value + "\", student = \"stage2\"}]");
    const RunInputs both = cpu_run(c);
    const SlotLayout l = CpuPipeline::layout_for(both);
    CpuPipeline pipeline(both, sampler, kSlots, allocate_locked(kSlots * l.slot_bytes()));
    const SlotRegions& r = pipeline.regions();
    ASSERT_EQ(r.features.size(), 2u);
    ASSERT_EQ(r.features[0].size(), 1u);
    ASSERT_EQ(r.features[1].size(), 1u);
    EXPECT_EQ(l.regions()[r.features[1][0]].spec.name, feature_region(value, 1));
    EXPECT_EQ(l.regions()[r.features[1][0]].spec.shape, (teacher::Shape{16, 32, 14, 14}));
    EXPECT_EQ(l.regions()[r.features[0][0]].spec.shape, (teacher::Shape{16, 64, 14, 14}));
    std::unique_ptr<teacher::Replica> with;
    one_thread.execute([&] { with = std::make_unique<teacher::Replica>(both.teachers[1].model); });
    teacher::OutputBuffers want(*both.teachers[1].model);
    pipeline.start(0, 4);
    double worst = 0, largest = 0;
    for (std::uint64_t b = 0; b < 4; ++b) {
      auto slot = pipeline.ring().acquire_ready(b);
      ASSERT_TRUE(slot);
      const auto inputs = slot->region<float>(r.loader.inputs);
      one_thread.execute([&] { with->run(inputs.data(), want.pointers); });
      const auto got = slot->region<float>(r.features[1][0]);
      for (std::size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, double(std::fabs(got[i] - want.data[1][i])));
        largest = std::max(largest, double(std::fabs(want.data[1][i])));
      }
      pipeline.ring().release(*slot);
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    EXPECT_GT(largest, 1e-3);
    EXPECT_LE(worst, 1e-5 * std::max(1.0, largest));
    c.set("kd.features=[{teacher = \"" + value + "\", student = \"stage2\", from = 2}]");
    const std::string e = test::error_of([&] { (void)cpu_run(c); });
    EXPECT_NE(e.find("kd.features[1].from = 2"), std::string::npos) << e;

    // The same value asked for by the second teacher's own block (its `features`): its region
    // alone, and a name its graph lacks is exit 2 naming the row's key.
    Config own = config(second);
    own.set("teacher.others=[{model = \"" + second + "\", features = [\"" + value + "\"]}]");
    const RunInputs row = cpu_run(own);
    const SlotLayout rl = CpuPipeline::layout_for(row);
    CpuPipeline rp(row, sampler, kSlots, allocate_locked(kSlots * rl.slot_bytes()));
    ASSERT_EQ(rp.regions().features.size(), 2u);
    EXPECT_TRUE(rp.regions().features[0].empty());
    ASSERT_EQ(rp.regions().features[1].size(), 1u);
    EXPECT_EQ(rl.regions()[rp.regions().features[1][0]].spec.name, feature_region(value, 1));
    own.set("teacher.others=[{model = \"" + second + "\", features = [\"no/such\"]}]");
    const std::string unknown = test::error_of([&] { (void)cpu_run(own); });
    EXPECT_NE(unknown.find("teacher.others[1].features 'no/such'"), std::string::npos) << unknown;
  }

  // kd.cache with two teachers keeps their mix: the first epoch of 96 samples mixes and keeps
  // each sample's target, the second reads its batches from the cache (one decision per batch for
  // both teachers), each sample's target exactly as it was mixed. A batch one teacher reaches
  // while the other still teaches the last of epoch 1 may not be all cached yet: it is taught
  // again, its samples then read from the cache; from batch per_epoch + kSlots - 1 on (the ring's
  // bound) every batch is read. A pipeline started on the full cache reads every batch.
  Config cached = config(second);
  cached.set("kd.cache=memory");
  cached.set("data.pad_crop=0");
  cached.set("data.hflip=false");
  RunInputs with_cache = cached_run(cached);
  ASSERT_NE(with_cache.cache, nullptr);
  {
    const Sampler few(with_cache.train.size(), with_cache.sampler);
    const std::uint64_t per_epoch = few.batches_per_epoch();
    ASSERT_EQ(per_epoch, 6u);
    CpuPipeline pipeline(
        with_cache, few, kSlots,
        allocate_locked(kSlots * CpuPipeline::layout_for(with_cache).slot_bytes()));
    const SlotRegions& r = pipeline.regions();
    std::map<std::int64_t, std::vector<float>> mixed; // the first epoch's target per sample
    double worst = 0;
    pipeline.start(0, 2 * per_epoch, {.cache = true});
    for (std::uint64_t b = 0; b < 2 * per_epoch; ++b) {
      auto slot = pipeline.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto ids = slot->region<std::int64_t>(r.loader.ids);
      const auto target = slot->region<float>(*r.logits);
      const auto inputs = slot->region<float>(r.loader.inputs);
      teach_both(inputs, *with_cache.mix);
      for (std::size_t i = 0; i < target.size(); ++i)
        worst = std::max(worst, double(std::fabs(target[i] - want_mix[i])));
      for (std::size_t i = 0; i < 16; ++i) {
        const auto row = target.subspan(i * 10, 10);
        if (b < per_epoch)
          mixed[ids[i]].assign(row.begin(), row.end());
        else
          EXPECT_TRUE(std::equal(row.begin(), row.end(), mixed.at(ids[i]).begin()))
              << "sample " << ids[i];
      }
      pipeline.ring().release(*slot);
    }
    pipeline.stop();
    pipeline.ring().rethrow_if_failed();
    EXPECT_LE(worst, 1e-5) << "the target, mixed or read, is the teachers' mix";
    EXPECT_EQ(mixed.size(), 96u);
    EXPECT_EQ(with_cache.cache->stored(), 96u);
    EXPECT_GE(pipeline.targets().cached_batches(), per_epoch - (kSlots - 1)) << "the teachers ran";
    EXPECT_LE(pipeline.targets().cached_batches(), per_epoch);
    CpuPipeline full(with_cache, few, kSlots,
                     allocate_locked(kSlots * CpuPipeline::layout_for(with_cache).slot_bytes()));
    full.start(per_epoch, per_epoch, {.cache = true});
    for (std::uint64_t b = 0; b < per_epoch; ++b) {
      auto slot = full.ring().acquire_ready(b);
      ASSERT_TRUE(slot) << "batch " << b;
      const auto ids = slot->region<std::int64_t>(full.regions().loader.ids);
      const auto target = slot->region<float>(*full.regions().logits);
      for (std::size_t i = 0; i < 16; ++i)
        EXPECT_TRUE(std::equal(target.begin() + static_cast<std::ptrdiff_t>(i * 10),
                               target.begin() + static_cast<std::ptrdiff_t>((i + 1) * 10),
                               mixed.at(ids[i]).begin()))
            << "sample " << ids[i];
      full.ring().release(*slot);
    }
    full.stop();
    full.ring().rethrow_if_failed();
    EXPECT_EQ(full.targets().cached_batches(), per_epoch) << "a full cache ran the teachers";
    EXPECT_THROW(pipeline.start(0, 1, {.only_teacher = 1, .cache = true}), std::invalid_argument)
        << "the cache holds the mix, not one teacher's outputs";
  }
  // On disk, the key names both teachers and their mix (a one-teacher file is not read for it),
  // and the features each teacher returns (kept beside the mix; a run without them keeps the key
  // it had).
  cached.set("kd.cache=disk");
  cached.set("kd.cache_path=" + std::filesystem::temp_directory_path().string() +
             "/kdflow_two_teachers.kdcache");
  RunInputs on_disk = cpu_run(cached);
  prepare_teacher_cache(on_disk);
  for (const char* line : {"\nteacher=", "\nteacher1=", "\nteacher1.precision=fp32\n",
                           "\nmix=0.666666667,0.333333333 at kd.temperature=3\n"})
    EXPECT_NE(on_disk.cache_key.find(line), std::string::npos)
        << line << " in " << on_disk.cache_key;
  cached.set("kd.features=[{teacher = \"/features/features.12/Relu_output_0\", "
             "student = \"stage2\", from = 1}]");
  EXPECT_EQ(on_disk.cache_key.find(".features="), std::string::npos) << on_disk.cache_key;
  RunInputs featured = cpu_run(cached);
  featured.train = first_samples(featured.train, 96); // a cache of 96 rows, not 60,000
  prepare_teacher_cache(featured);
  ASSERT_NE(featured.cache, nullptr);
  const teacher::Teacher& w16 = *featured.teachers[1].model;
  const teacher::Shape stage = w16.output_shape(w16.output_names().size() - 1);
  EXPECT_EQ(stage, (teacher::Shape{16, 32, 14, 14})) << "the value kd.features names";
  EXPECT_EQ(featured.cache->features(), 32u * 14 * 14) << "one sample's row of it";
  EXPECT_NE(featured.cache_key.find("\nteacher1.features=/features/features.12/Relu_output_0\n"),
            std::string::npos)
      << featured.cache_key;
  EXPECT_EQ(featured.cache_key.find("\nteacher.features="), std::string::npos)
      << featured.cache_key;
}

// teacher.features: each named value gets a slot region of its shape beside the logits, and the
// replicas fill every one for every batch: checked against a replica of a teacher that returns the
// same values (the values themselves against the reference interpreter in TeacherFeatures), with
// the logits those of a teacher without features.
TEST(CpuPipeline, TeacherFeaturesReachTheirSlotRegionsBesideTheLogits) {
  ASSERT_GE(allowed_cpus().size(), 2u);
  const std::string model = std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx";
  const auto values = per_sample_values(model);
  ASSERT_GE(values.size(), 3u);
  // The first value, one from the middle and the last before the outputs: an early activation
  // that fusion would otherwise fold away, and a late one.
  const std::vector<std::string> features = {values.front(), values[values.size() / 2],
                                             values.back()};
  std::string list;
  for (const auto& f : features) list += (list.empty() ? "\"" : ", \"") + f + "\"";
  const RunInputs run =
      cpu_run(shipped_teacher_config({"data.batch_size=16", "teacher.features=[" + list + "]"}));
  const RunInputs plain = cpu_run(shipped_teacher_config({"data.batch_size=16"}));
  const Sampler sampler(run.train.size(), run.sampler);
  constexpr std::uint32_t kSlots = 3;
  constexpr std::uint64_t kBatches = 20;
  const SlotLayout layout = CpuPipeline::layout_for(run);
  CpuPipeline pipeline(run, sampler, kSlots, allocate_locked(kSlots * layout.slot_bytes()));
  ASSERT_EQ(pipeline.regions().features.size(), 1u);
  ASSERT_EQ(pipeline.regions().features[0].size(), features.size());
  for (std::size_t k = 0; k < features.size(); ++k) {
    const Region& r = layout.regions()[pipeline.regions().features[0][k]];
    EXPECT_EQ(r.spec.name, feature_region(features[k]));
    EXPECT_EQ(r.spec.shape, run.teachers.front().model->output_shape(1 + k)) << features[k];
    EXPECT_EQ(r.spec.shape.at(0), 16);
  }
  EXPECT_GT(layout.slot_bytes(), CpuPipeline::layout_for(plain).slot_bytes());

  oneapi::tbb::task_arena one_thread(1);
  std::unique_ptr<teacher::Replica> with, without;
  one_thread.execute([&] {
    with = std::make_unique<teacher::Replica>(run.teachers.front().model);
    without = std::make_unique<teacher::Replica>(plain.teachers.front().model);
  });
  teacher::OutputBuffers expected(*run.teachers.front().model),
      logits_only(*plain.teachers.front().model);
  pipeline.start(0, kBatches);
  std::vector<double> worst(1 + features.size(), 0.0), largest(features.size(), 0.0);
  for (std::uint64_t b = 0; b < kBatches; ++b) {
    auto slot = pipeline.ring().acquire_ready(b);
    ASSERT_TRUE(slot) << "batch " << b;
    const auto inputs = slot->region<float>(pipeline.regions().loader.inputs);
    one_thread.execute([&] {
      with->run(inputs.data(), expected.pointers);
      without->run(inputs.data(), logits_only.pointers);
    });
    const auto logits = slot->region<float>(*pipeline.regions().logits);
    for (std::size_t i = 0; i < logits.size(); ++i)
      worst[0] = std::max(worst[0], double(std::fabs(logits[i] - logits_only.data[0][i])));
    for (std::size_t k = 0; k < features.size(); ++k) {
      const auto got = slot->region<float>(pipeline.regions().features[0][k]);
      const auto& want = expected.data[1 + k];
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        worst[1 + k] = std::max(worst[1 + k], double(std::fabs(got[i] - want[i])));
        largest[k] = std::max(largest[k], double(std::fabs(want[i])));
      }
    }
    pipeline.ring().release(*slot);
  }
  pipeline.stop();
  pipeline.ring().rethrow_if_failed();
  EXPECT_LE(worst[0], 1e-5) << "the logits are those of the teacher without features";
  for (std::size_t k = 0; k < features.size(); ++k) {
    EXPECT_GT(largest[k], 1e-3) << features[k] << ": values that say something";
    EXPECT_LE(worst[1 + k], 1e-5 * std::max(1.0, largest[k])) << features[k];
  }
}

// Passes run at once, each on one of two threads (TSan runs this suite): every pass of every batch
// is written once, by whichever lane takes it, and bit for bit as the same plan's passes run in
// turn on one thread; and within float noise of the whole batch.
TEST(TeacherPassesAtOnce, EveryPassOfEveryBatchIsRunOnceWhicheverLaneTakesIt) {
  ASSERT_GE(allowed_cpus().size(), 2u);
  const std::string model = std::string(KDFLOW_SOURCE_DIR) + "/models/fmnist_teacher.onnx";
  // Only the lanes run on two threads: the plans are built, and the whole batch run, on one (oneDNN
  // is not instrumented, and its own parallel sections on two threads read to TSan as races in
  // oneTBB's task contexts).
  oneapi::tbb::task_arena two(2), one(1);
  teacher::TeacherOptions opts;
  opts.batch = 16;
  opts.threads = 1;
  std::shared_ptr<const teacher::Teacher> whole, at_once;
  one.execute([&] {
    whole = teacher::Teacher::load(model, opts);
    opts.threads = 2;
    opts.samples_per_pass = 1;
    opts.passes_at_once = 2;
    at_once = teacher::Teacher::load(model, opts);
  });
  ASSERT_EQ(at_once->graph().chunks, 16);
  std::unique_ptr<teacher::Replica> lanes, in_turn, reference;
  two.execute([&] { lanes = std::make_unique<teacher::Replica>(at_once); });
  one.execute([&] {
    in_turn = std::make_unique<teacher::Replica>(at_once);
    reference = std::make_unique<teacher::Replica>(whole);
  });
  teacher::OutputBuffers got(*at_once), turn(*at_once), want(*whole);
  std::vector<float> x(static_cast<std::size_t>(teacher::numel(at_once->input_shape())));
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  constexpr int kBatches = 40;
  for (int b = 0; b < kBatches; ++b) {
    for (auto& v : x) v = dist(rng);
    for (auto& o : got.data) std::fill(o.begin(), o.end(), std::nanf(""));
    two.execute([&] { lanes->run(x.data(), got.pointers); });
    one.execute([&] {
      in_turn->run(x.data(), turn.pointers);
      reference->run(x.data(), want.pointers);
    });
    for (std::size_t k = 0; k < got.data.size(); ++k) {
      ASSERT_EQ(
          std::memcmp(got.data[k].data(), turn.data[k].data(), got.data[k].size() * sizeof(float)),
          0)
          << "batch " << b << ", output " << k;
      double worst = 0;
      for (std::size_t i = 0; i < got.data[k].size(); ++i)
        worst = std::max(worst, double(std::abs(got.data[k][i] - want.data[k][i])));
      EXPECT_LE(worst, 1e-4) << "batch " << b;
    }
  }
}

} // namespace
} // namespace kdflow::app
