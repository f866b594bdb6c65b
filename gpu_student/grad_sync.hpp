// Data-parallel gradients, as PyTorch DDP's reducer does them: parameters in buckets of about
// dist.bucket_mb, each bucket all-reduced from the backward pass's own gradient hooks as soon as
// its last gradient arrived (so the reduction overlaps the rest of the backward pass), launched in
// bucket order on every rank. Parameters and buffers start as rank 0's; BatchNorm's running
// statistics follow rank 0's after every step (DDP's broadcast_buffers), statistics of each batch
// stay local.
#pragma once

#include "process_group_impl.hpp"

#include <torch/torch.h>

#include <vector>

namespace kdflow::student {

class GradSync {
public:
  // Hooks every trainable parameter of `params`; broadcasts parameters and buffers from rank 0.
  GradSync(ProcessGroup& group, std::vector<torch::Tensor> params,
           std::vector<torch::Tensor> buffers);
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // After the forward pass, before backward: sums `control` (a small double tensor on the
  // device: the step's losses, counts and stop flag) over the ranks, and sends rank 0's buffers.
  void begin(torch::Tensor control, std::int64_t step);
  // After backward: launches the buckets still waiting (a parameter without a gradient counts as
  // zero), waits for all, and leaves every parameter's gradient the ranks' mean. Returns the
  // control sum, on the host.
  torch::Tensor finish();

  [[nodiscard]] std::size_t buckets() const { return buckets_.size(); }
  // Buckets launched from the gradient hooks (during backward) and after it, over all steps.
  [[nodiscard]] std::uint64_t launched_in_backward() const { return in_backward_; }
  [[nodiscard]] std::uint64_t launched_after_backward() const { return after_backward_; }

private:
  struct Slice {
    std::size_t bucket;
    std::int64_t offset, numel;
  };
  struct Bucket {
    torch::Tensor flat;
    std::vector<std::size_t> params;
    std::size_t ready = 0;
    c10::intrusive_ptr<c10d::Work> work;
  };
  void on_gradient(std::size_t param, const torch::Tensor& grad);
  void launch_ready(std::uint64_t& counter);
  static void copy_to(const std::vector<torch::Tensor>& tensors, const torch::Tensor& flat);
  static void copy_from(const torch::Tensor& flat, const std::vector<torch::Tensor>& tensors);

  ProcessGroup::Impl& group_;
  std::vector<torch::Tensor> params_, buffers_;
  std::vector<Slice> slices_;       // by parameter
  std::vector<bool> arrived_;       // by parameter, this step
  std::vector<Bucket> buckets_;     // in launch order
  std::size_t next_ = 0;            // the next bucket to launch
  torch::Tensor buffers_flat_;      // rank 0's buffers, sent after each forward pass
  std::vector<at::Tensor> control_; // the step's control sum
  c10::intrusive_ptr<c10d::Work> control_work_, buffers_work_;
  std::int64_t step_ = 0;
  std::uint64_t in_backward_ = 0, after_backward_ = 0;
};

} // namespace kdflow::student
