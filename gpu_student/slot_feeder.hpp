// The student's end of the slot ring: hands each batch to the training step as tensors, in batch
// order, and returns slots to the ring only when nothing reads them any more. Includes torch: for
// the student's own translation units only.
//
// CUDA: the whole slot goes to the GPU in one DMA on a copy stream (the slab is pinned), an event
//   marks the copy's end, the compute stream waits on that event (not the host), and the slot is
//   released once the event has completed: never when the copy was merely issued.
// CPU:  the tensors are views of the slot itself (no copy); the slot is released after the step.
#pragma once

#include "kdflow/core/slot_ring.hpp"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <deque>
#include <optional>
#include <vector>

namespace kdflow::student {

// One batch as the step sees it: one tensor per region of the slot layout, by region index.
struct DeviceBatch {
  std::uint64_t batch = 0;
  std::uint32_t samples = 0;
  std::vector<torch::Tensor> regions;
};

torch::ScalarType torch_dtype(DType dtype);

class SlotFeeder {
public:
  SlotFeeder(SlotRing& ring, torch::Device device);
  ~SlotFeeder();
  SlotFeeder(const SlotFeeder&) = delete;
  SlotFeeder& operator=(const SlotFeeder&) = delete;

  // Batch `batch` (the next in order), or nullopt when the ring closed and drained.
  [[nodiscard]] std::optional<DeviceBatch> next(std::uint64_t batch);
  // The step that used the last batch has been issued: on the CPU the slot goes back now; on CUDA
  // the device buffer is marked reusable once the compute stream passes this point.
  void finish_step();
  // Waits for every copy in flight and releases its slot (end of run, or before a checkpoint).
  void drain();

  // Slots whose copy was issued and not yet released (CUDA only).
  [[nodiscard]] std::size_t in_flight() const { return in_flight_.size(); }
  [[nodiscard]] bool on_cuda() const { return device_.is_cuda(); }

private:
  void reap();           // releases, in order, the slots whose copy events completed
  void release_oldest(); // waits for the oldest copy in flight and releases its slot

  struct InFlight {
    Slot slot;
    std::uint32_t buffer;
  };

  SlotRing& ring_;
  torch::Device device_;
  std::optional<Slot> current_cpu_;             // CPU: the slot the step reads in place
  std::optional<std::uint32_t> current_buffer_; // CUDA: the device buffer the step reads
  // CUDA: one device buffer per slot; events for "copy done" and "step done with this buffer".
  std::vector<torch::Tensor> device_buffers_;
  std::vector<std::vector<torch::Tensor>> device_views_; // each buffer's regions, made once
  std::vector<at::cuda::CUDAEvent> copied_;
  std::vector<at::cuda::CUDAEvent> consumed_;
  std::optional<c10::cuda::CUDAStream> copy_stream_;
  std::deque<InFlight> in_flight_;
};

} // namespace kdflow::student
