// SlotFeeder: in-order batches from the ring as tensors; releases gated by CUDA events.
#include "slot_feeder.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

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
  for (std::uint32_t i = 0; i < ring_.slots(); ++i) {
    device_buffers_.push_back(torch::empty({bytes}, torch::dtype(torch::kUInt8).device(device_)));
    device_views_.push_back(region_views(ring_.layout(), device_buffers_.back()));
  }
  copied_.resize(ring_.slots());
  consumed_.resize(ring_.slots());
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

  reap();
  // The copies in flight hold slots that only this thread releases, and the producers may be
  // waiting for one of them to fill this very batch: release them (each once its copy is done)
  // before waiting, or the two sides would wait on each other. A student that synchronizes every
  // step (the trainer does) has nothing in flight here.
  while (!in_flight_.empty() && !ring_.ready_now(batch)) release_oldest();
  auto slot = ring_.acquire_ready(batch);
  if (!slot) return std::nullopt;
  const std::uint32_t i = slot->index();
  c10::cuda::CUDAGuard guard(device_);
  const auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
  // The buffer may still be read by the step of batch - slots: the copy waits for that step.
  if (consumed_[i].isCreated()) consumed_[i].block(*copy_stream_);
  // The runtime's copy, not Tensor::copy_: no dispatch or tensor made per batch, and the slab is
  // page-locked, so this is one DMA that returns at once.
  C10_CUDA_CHECK(cudaMemcpyAsync(device_buffers_[i].data_ptr(), slot->data(),
                                 ring_.layout().slot_bytes(), cudaMemcpyHostToDevice,
                                 copy_stream_->stream()));
  copied_[i].record(*copy_stream_);
  copied_[i].block(compute); // the step waits on the GPU, the host goes on
  in_flight_.push_back({*slot, i});
  current_buffer_ = i;
  return DeviceBatch{batch, slot->header().samples, device_views_[i]};
}

void SlotFeeder::finish_step() {
  if (!device_.is_cuda()) {
    if (current_cpu_) ring_.release(*current_cpu_);
    current_cpu_.reset();
    return;
  }
  if (current_buffer_) {
    consumed_[*current_buffer_].record(c10::cuda::getCurrentCUDAStream(device_.index()));
    current_buffer_.reset();
  }
  reap();
}

void SlotFeeder::reap() {
  while (!in_flight_.empty() && copied_[in_flight_.front().buffer].query()) {
    ring_.release(in_flight_.front().slot);
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
  copied_[in_flight_.front().buffer].synchronize();
  ring_.release(in_flight_.front().slot);
  in_flight_.pop_front();
}

} // namespace kdflow::student
