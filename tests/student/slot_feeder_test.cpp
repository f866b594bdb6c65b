// The student's end of the ring: on the CPU the step reads the slot in place and the slot returns
// after the step; on CUDA (compiled in here, skipped at run time without a GPU) the slot returns
// only once its copy's event has completed, and the device tensors hold the slot's bytes.
#include "kdflow/gpu_student/pinned_host.hpp"
#include "slot_feeder.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>
#include <thread>

namespace kdflow::student {
namespace {

constexpr std::uint32_t kSlots = 3;

SlotLayout layout() {
  return SlotLayout({{"inputs", DType::f32, {4, 3}},
                     {"labels", DType::i64, {4}},
                     {"logits", DType::f32, {4, 10}}});
}

// Fills batch b with values that depend on b and a per-run seed, then publishes it as ready.
void produce(SlotRing& ring, std::uint64_t b, float seed) {
  auto s = ring.acquire_free(b);
  ASSERT_TRUE(s);
  s->header().samples = 4;
  auto in = s->region<float>(0);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = seed + static_cast<float>(b * 100 + i);
  auto labels = s->region<std::int64_t>(1);
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int64_t>((b + i) % 10);
  auto logits = s->region<float>(2);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = -seed * static_cast<float>(i);
  ring.publish(*s, SlotState::filling, SlotState::ready);
}

void expect_batch(const DeviceBatch& batch, std::uint64_t b, float seed) {
  ASSERT_EQ(batch.regions.size(), 3u);
  const auto in = batch.regions[0].cpu();
  EXPECT_EQ(in.sizes(), (std::vector<std::int64_t>{4, 3}));
  EXPECT_FLOAT_EQ(in[1][2].item<float>(), seed + static_cast<float>(b * 100 + 5));
  EXPECT_EQ(batch.regions[1].cpu()[3].item<std::int64_t>(),
            static_cast<std::int64_t>((b + 3) % 10));
  EXPECT_FLOAT_EQ(batch.regions[2].cpu()[0][7].item<float>(), -seed * 7);
  EXPECT_EQ(batch.samples, 4u);
}

std::uint32_t count(const SlotRing& ring, SlotState s) {
  return ring.stats().occupancy[static_cast<int>(s)];
}

TEST(SlotFeeder, CpuStepReadsTheSlotInPlace) {
  std::mt19937 rng(std::random_device{}());
  const float seed = std::uniform_real_distribution<float>(1, 2)(rng);
  const SlotLayout l = layout();
  SlotRing ring(l, kSlots, allocate_pinned_for_device(kSlots * l.slot_bytes()));
  SlotFeeder feeder(ring, torch::kCPU);
  for (std::uint64_t b = 0; b < 7; ++b) {
    produce(ring, b, seed);
    auto batch = feeder.next(b);
    ASSERT_TRUE(batch);
    expect_batch(*batch, b, seed);
    // In place: the tensor's memory is the slot's.
    EXPECT_EQ(
        static_cast<void*>(batch->regions[0].data_ptr()),
        static_cast<void*>(ring.slab() + (b % kSlots) * l.slot_bytes() + l.regions()[0].offset));
    EXPECT_EQ(count(ring, SlotState::in_flight), 1u);
    feeder.finish_step();
    EXPECT_EQ(count(ring, SlotState::free), kSlots);
  }
  ring.close();
  EXPECT_FALSE(feeder.next(7));
}

TEST(SlotFeeder, CudaSlotReturnsOnlyAfterItsCopyEvent) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  const float seed = 1.5f;
  const SlotLayout l = layout();
  SlotRing ring(l, kSlots, allocate_pinned_for_device(kSlots * l.slot_bytes()));
  EXPECT_EQ(ring.memory_kind(), MemoryKind::cuda_pinned);
  SlotFeeder feeder(ring, torch::Device(torch::kCUDA, 0));
  for (std::uint64_t b = 0; b < 3 * kSlots; ++b) {
    produce(ring, b, seed);
    auto batch = feeder.next(b);
    ASSERT_TRUE(batch);
    EXPECT_TRUE(batch->regions[0].is_cuda());
    // Issued, not yet released: the slot stays in flight until the event is seen complete.
    EXPECT_GE(count(ring, SlotState::in_flight), 1u);
    expect_batch(*batch, b,
                 seed); // .cpu() synchronizes the compute stream, which waited on the copy
    feeder.finish_step();
  }
  feeder.drain();
  EXPECT_EQ(count(ring, SlotState::free), kSlots);
  EXPECT_EQ(feeder.in_flight(), 0u);
}

// Slots that are ready together go to the GPU together: one copy for the run of ready slots up
// to the ring's end (where the indices wrap), each batch still its own bytes, in order; the slots
// return once that copy is done, and the batches after the group start a new one.
TEST(SlotFeeder, CudaReadySlotsGoTogetherInOneCopy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  const float seed = 2.5f;
  const SlotLayout l = layout();
  SlotRing ring(l, kSlots, allocate_pinned_for_device(kSlots * l.slot_bytes()));
  SlotFeeder feeder(ring, torch::Device(torch::kCUDA, 0));
  for (std::uint64_t lap = 0; lap < 3; ++lap) {
    const std::uint64_t first = lap * kSlots;
    for (std::uint64_t b = first; b < first + kSlots; ++b) produce(ring, b, seed);
    for (std::uint64_t b = first; b < first + kSlots; ++b) {
      auto batch = feeder.next(b);
      ASSERT_TRUE(batch);
      // The whole lap was taken by the first call: nothing is left ready in the ring.
      EXPECT_EQ(count(ring, SlotState::ready), 0u);
      expect_batch(*batch, b, seed);
      feeder.finish_step();
    }
    EXPECT_EQ(feeder.in_flight(), 0u); // the lap's copy was seen complete and its slots returned
    EXPECT_EQ(count(ring, SlotState::free), kSlots);
  }
  // A batch out of turn while others are on the device is a caller's error, not a silent skip.
  produce(ring, 3 * kSlots, seed);
  produce(ring, 3 * kSlots + 1, seed);
  ASSERT_TRUE(feeder.next(3 * kSlots));
  EXPECT_THROW((void)feeder.next(3 * kSlots + 2), std::logic_error);
}

// A consumer that never waits for the GPU (no per-step host synchronization, as a faster trainer
// would run) against a producer thread, through 3 slots: every batch arrives once, in order, with
// its own bytes, although each "step" is slow on the GPU and the copies run ahead of it. Catches
// two faults the CPU path cannot show: a copy overwriting a device buffer that a queued step has
// not read yet (the consumed event), and the feeder waiting for a batch while it holds, in
// flight, the slot the producer needs to fill that batch (a hang, turned into a failure here).
TEST(SlotFeeder, CudaConsumerThatNeverSynchronizesGetsEveryBatchOnce) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device here";
  constexpr std::uint64_t kBatches = 3000;
  const SlotLayout l = layout();
  SlotRing ring(l, kSlots, allocate_pinned_for_device(kSlots * l.slot_bytes()));
  const torch::Device cuda(torch::kCUDA, 0);
  SlotFeeder feeder(ring, cuda);
  std::thread producer([&] {
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      auto s = ring.acquire_free(b);
      if (!s) return;
      s->header().samples = 4;
      for (float& v : s->region<float>(0)) v = static_cast<float>(b);
      ring.publish(*s, SlotState::filling, SlotState::ready);
    }
  });
  const auto work = torch::randn({512, 512}, torch::device(cuda));
  const auto seen = torch::zeros({static_cast<std::int64_t>(kBatches)}, torch::device(cuda));
  auto consumer = std::async(std::launch::async, [&] {
    for (std::uint64_t b = 0; b < kBatches; ++b) {
      auto batch = feeder.next(b);
      if (!batch) return b;
      // A slow step queued on the GPU before it reads the batch's bytes.
      if (b % 7 == 0) (void)torch::mm(work, work).sum();
      seen.narrow(0, static_cast<std::int64_t>(b), 1)
          .copy_(batch->regions[0].view({-1}).narrow(0, 11, 1));
      feeder.finish_step();
    }
    feeder.drain();
    return kBatches;
  });
  const bool finished = consumer.wait_for(std::chrono::seconds(120)) == std::future_status::ready;
  if (!finished) ring.close(); // unblocks both sides so the test can fail instead of hanging
  const std::uint64_t consumed = consumer.get();
  producer.join();
  ASSERT_TRUE(finished) << "the feeder and the producer waited on each other";
  ASSERT_EQ(consumed, kBatches);
  const auto expected = torch::arange(static_cast<std::int64_t>(kBatches), torch::kFloat);
  EXPECT_TRUE(torch::equal(seen.cpu(), expected));
  EXPECT_EQ(count(ring, SlotState::free), kSlots);
}

} // namespace
} // namespace kdflow::student
