// Where a training step's targets come from, chosen once per trainer: nowhere (kd.alpha = 0),
// the ring's slot regions (what the CPU teachers wrote), or the co-located teachers run on the
// student's device before its step (the usual way to distil, bench-overlap's baseline). Private
// to gpu_student (includes torch).
#pragma once

#include "kdflow/gpu_student/trainer.hpp"
#include "slot_feeder.hpp"

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kdflow::student {

// What a step learns from, beside the labels: the target logits (undefined with kd.alpha = 0)
// and each feature loss's teacher value.
struct StepTargets {
  torch::Tensor logits;
  std::vector<torch::Tensor> features;
};

class TargetSource {
public:
  virtual ~TargetSource() = default;
  // Batch number `number`'s targets for its first `n` rows (`inputs`: the network's input).
  virtual StepTargets get(const DeviceBatch& batch, const torch::Tensor& inputs, std::int64_t n,
                          std::uint64_t number) const = 0;
};

class NoTargets final : public TargetSource {
public:
  StepTargets get(const DeviceBatch&, const torch::Tensor&, std::int64_t,
                  std::uint64_t) const override {
    return {};
  }
};

// The slot's target logits region and one teacher region per feature loss (`losses` of them:
// std::logic_error otherwise).
class RingTargets final : public TargetSource {
public:
  RingTargets(std::size_t logits, std::vector<std::size_t> features, std::size_t losses);
  StepTargets get(const DeviceBatch& batch, const torch::Tensor& inputs, std::int64_t n,
                  std::uint64_t number) const override;

private:
  std::size_t logits_;
  std::vector<std::size_t> features_;
};

// The teachers' forward passes on the student's device (each teacher's weight > 0:
// std::invalid_argument otherwise); several mixed at `temperature` as the pipeline mixes them.
class ColocatedTargets final : public TargetSource {
public:
  ColocatedTargets(std::vector<ColocatedTeacher> teachers, double temperature,
                   std::vector<FeatureLoss> features);
  StepTargets get(const DeviceBatch& batch, const torch::Tensor& inputs, std::int64_t n,
                  std::uint64_t number) const override;

private:
  std::vector<ColocatedTeacher> teachers_;
  torch::Tensor log_weights_; // the normalized weights' logs, [teachers, 1, 1], on the device
  double temperature_;
  std::vector<FeatureLoss> features_;
};

} // namespace kdflow::student
