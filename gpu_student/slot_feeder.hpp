// The student's end of the slot ring: hands each batch to the training step as tensors, in batch
// order, and returns slots to the ring only when nothing reads them any more. Includes torch: for
// the student's own translation units only.
//
// CUDA: the slot goes to the GPU in one DMA on a copy stream (the slab is pinned), an event marks
//   the copy's end, the compute stream waits on that event (not the host), and the slot is
//   released once the event has completed: never when the copy was merely issued. When the next
//   slots of the ring are ready too, they go with it: one DMA, one event and one wait for the
//   whole run of slots (a group), so that small slots are not paced by the CUDA calls around each
//   copy. A group's copy waits, on the GPU, for the last step that read its device buffers.
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
  [[nodiscard]] std::size_t in_flight() const { return in_flight_slots_; }
  [[nodiscard]] bool on_cuda() const { return device_.is_cuda(); }

private:
  // CUDA: copies batch `batch` and the batches after it that are ready now (up to the ring's end,
  // where the slot indices wrap) in one DMA. False when the ring closed and drained.
  bool copy_group(std::uint64_t batch);
  void reap();           // releases, in order, the groups whose copy events completed
  void release_oldest(); // waits for the oldest copy in flight and releases its slots

  // Host slots whose copy was issued, one entry per group, released together.
  struct InFlight {
    std::vector<Slot> slots;
    std::uint32_t event = 0; // in copied_
  };
  // "Every step up to `last_batch` is done reading its device buffer": recorded on the compute
  // stream after the last batch of each group.
  struct Consumed {
    std::uint64_t last_batch = 0;
    std::uint32_t event = 0; // in consumed_
  };

  SlotRing& ring_;
  torch::Device device_;
  std::optional<Slot> current_cpu_; // CPU: the slot the step reads in place
  // CUDA: one device buffer per slot, slot i at i * slot_bytes of one allocation (so that a group
  // is one copy), each buffer's regions as views made once.
  torch::Tensor device_slab_;
  std::vector<std::vector<torch::Tensor>> device_views_;
  std::vector<std::uint32_t> samples_; // by buffer: the batch's header().samples
  // Batches copied and not yet handed to the step: [next_, copied_end_); group_end_: one past the
  // last batch of the group that the batch being served belongs to.
  std::uint64_t next_ = 0;
  std::uint64_t copied_end_ = 0;
  std::uint64_t group_end_ = 0;
  std::optional<std::uint64_t> serving_; // the batch handed out and not yet finished
  bool started_ = false;
  // Event pools used in turn (a group takes one of each); `slots` of each suffice, as no more
  // than `slots` groups are ever in flight.
  std::vector<at::cuda::CUDAEvent> copied_;
  std::vector<at::cuda::CUDAEvent> consumed_;
  std::uint32_t next_copied_ = 0;
  std::uint32_t next_consumed_ = 0;
  std::optional<c10::cuda::CUDAStream> copy_stream_;
  std::deque<InFlight> in_flight_;
  std::deque<Consumed> consumed_marks_;
  std::size_t in_flight_slots_ = 0;
};

} // namespace kdflow::student
