// SlotFeeder: in-order batches from the ring as tensors; releases gated by CUDA events.
#include "slot_feeder.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <stdexcept>

namespace kdflow::student {

torch::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
  case DType::u8: return torch::kUInt8;
  case DType::i32: return torch::kInt32;
  case DType::i64: return torch::kInt64;
  case DType::f32: return torch::kFloat32;
  }
  return torch::kUInt8;
}

namespace {

// Views of `base` (host slot or device buffer) shaped as the layout's regions.
std::vector<torch::Tensor> region_views(const SlotLayout& layout, const torch::Tensor& bytes) {
  std::vector<torch::Tensor> out;
  for (const auto& r : layout.regions())
    out.push_back(
        bytes.narrow(0, static_cast<std::int64_t>(r.offset), static_cast<std::int64_t>(r.bytes))
            .view(torch_dtype(r.spec.dtype))
            .view(r.spec.shape));
  return out;
}

} // namespace

SlotFeeder::SlotFeeder(SlotRing& ring, torch::Device device) : ring_(ring), device_(device) {
  if (!device_.is_cuda()) return;
  c10::cuda::CUDAGuard guard(device_);
  copy_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index());
  // Allocated once: nothing is allocated per batch.
  const auto bytes = static_cast<std::int64_t>(ring_.layout().slot_bytes());
  const auto slots = static_cast<std::int64_t>(ring_.slots());
  device_slab_ = torch::empty({slots * bytes}, torch::dtype(torch::kUInt8).device(device_));
  for (std::int64_t i = 0; i < slots; ++i)
    device_views_.push_back(region_views(ring_.layout(), device_slab_.narrow(0, i * bytes, bytes)));
  samples_.assign(ring_.slots(), 0);
  // One more than the groups that can be in flight or marked at once: a pool event is never
  // recorded again while a wait or release still means its earlier recording.
  copied_.resize(ring_.slots() + 1);
  consumed_.resize(ring_.slots() + 1);
}

SlotFeeder::~SlotFeeder() {
  try {
    drain();
  } catch (...) {
    // A failed drain at teardown leaves slots unreleased; the ring is being destroyed anyway.
  }
}

std::optional<DeviceBatch> SlotFeeder::next(std::uint64_t batch) {
  if (!device_.is_cuda()) {
    auto slot = ring_.acquire_ready(batch);
    if (!slot) return std::nullopt;
    current_cpu_ = slot;
    const auto bytes = torch::from_blob(
        slot->data(), {static_cast<std::int64_t>(ring_.layout().slot_bytes())}, torch::kUInt8);
    return DeviceBatch{batch, slot->header().samples, region_views(ring_.layout(), bytes)};
  }

  if (serving_) finish_step(); // the last batch's step was issued, even if nobody said so
  if (!started_ || batch != next_) {
    if (started_ && next_ < copied_end_)
      throw std::logic_error(fmt::format(
          "SlotFeeder: batch {} asked for while batches {} to {} are on the device, unread", batch,
          next_, copied_end_ - 1));
    next_ = copied_end_ = batch;
    started_ = true;
  }
  if (next_ == copied_end_ && !copy_group(batch)) return std::nullopt;
  const std::uint32_t i = static_cast<std::uint32_t>(batch % ring_.slots());
  ++next_;
  serving_ = batch;
  return DeviceBatch{batch, samples_[i], device_views_[i]};
}

bool SlotFeeder::copy_group(std::uint64_t batch) {
  reap();
  // The copies in flight hold slots that only this thread releases, and the producers may be
  // waiting for one of them to fill this very batch: release them (each once its copy is done)
  // before waiting, or the two sides would wait on each other. A student that synchronizes every
  // step (the trainer does) has nothing in flight here.
  while (!in_flight_.empty() && !ring_.ready_now(batch)) release_oldest();
  auto first = ring_.acquire_ready(batch);
  if (!first) return false;
  const std::uint32_t slots = ring_.slots();
  const std::uint32_t i0 = first->index();
  InFlight group;
  group.slots.push_back(*first);
  samples_[i0] = first->header().samples;
  // The batches after it that are ready now and whose slots follow it in the slab go with it. A
  // closed or failed ring is left to the next call: it reports that batch as it always has.
  while (i0 + group.slots.size() < slots) {
    const std::uint64_t b = batch + group.slots.size();
    if (ring_.closed() || !ring_.ready_now(b)) break;
    std::optional<Slot> s;
    try {
      s = ring_.acquire_ready(b);
    } catch (...) {
      break; // failed in between: the failure is the ring's, and the next acquire throws it
    }
    if (!s) break;
    samples_[s->index()] = s->header().samples;
    group.slots.push_back(*s);
  }
  const std::size_t k = group.slots.size();
  const std::size_t bytes = ring_.layout().slot_bytes();
  c10::cuda::CUDAGuard guard(device_);
  const auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
  // The buffers may still be read by the steps of batch - slots .. batch + k - 1 - slots, queued
  // on the compute stream: the copy waits (on the GPU) for the mark after the last of them.
  if (batch + k > slots && !consumed_marks_.empty()) {
    const std::uint64_t last_reader = batch + k - 1 - slots;
    while (consumed_marks_.size() > 1 && consumed_marks_.front().last_batch < last_reader)
      consumed_marks_.pop_front();
    consumed_[consumed_marks_.front().event].block(*copy_stream_);
  }
  // The runtime's copy, not Tensor::copy_: no dispatch or tensor made per batch, and the slab is
  // page-locked, so this is one DMA that returns at once.
  auto* device_base = static_cast<std::byte*>(device_slab_.data_ptr()) + std::size_t{i0} * bytes;
  C10_CUDA_CHECK(cudaMemcpyAsync(device_base, first->data(), k * bytes, cudaMemcpyHostToDevice,
                                 copy_stream_->stream()));
  group.event = next_copied_;
  next_copied_ = (next_copied_ + 1) % static_cast<std::uint32_t>(copied_.size());
  copied_[group.event].record(*copy_stream_);
  copied_[group.event].block(compute); // the steps wait on the GPU, the host goes on
  in_flight_slots_ += k;
  in_flight_.push_back(std::move(group));
  copied_end_ = batch + k;
  return true;
}

void SlotFeeder::finish_step() {
  if (!device_.is_cuda()) {
    if (current_cpu_) ring_.release(*current_cpu_);
    current_cpu_.reset();
    return;
  }
  if (serving_) {
    // The last batch of its group: the next copy into these buffers waits for this mark.
    if (*serving_ + 1 == copied_end_) {
      const std::uint32_t e = next_consumed_;
      next_consumed_ = (next_consumed_ + 1) % static_cast<std::uint32_t>(consumed_.size());
      consumed_[e].record(c10::cuda::getCurrentCUDAStream(device_.index()));
      consumed_marks_.push_back({*serving_, e});
    }
    serving_.reset();
  }
  reap();
}

void SlotFeeder::reap() {
  while (!in_flight_.empty() && copied_[in_flight_.front().event].query()) {
    for (const Slot& s : in_flight_.front().slots) ring_.release(s);
    in_flight_slots_ -= in_flight_.front().slots.size();
    in_flight_.pop_front();
  }
}

void SlotFeeder::drain() {
  if (!device_.is_cuda()) {
    finish_step();
    return;
  }
  while (!in_flight_.empty()) release_oldest();
}

void SlotFeeder::release_oldest() {
  copied_[in_flight_.front().event].synchronize();
  for (const Slot& s : in_flight_.front().slots) ring_.release(s);
  in_flight_slots_ -= in_flight_.front().slots.size();
  in_flight_.pop_front();
}

} // namespace kdflow::student
