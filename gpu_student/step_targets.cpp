// A training step's target sources (step_targets.hpp).
#include "step_targets.hpp"

#include "kdflow/core/trace.hpp"
#include "losses.hpp"
#include "torch_teacher_impl.hpp"

#include <cmath>
#include <stdexcept>

namespace kdflow::student {

RingTargets::RingTargets(std::size_t logits, std::vector<std::size_t> features, std::size_t losses)
    : logits_(logits), features_(std::move(features)) {
  if (features_.size() != losses)
    throw std::logic_error("the step needs one teacher region per feature loss");
}

StepTargets RingTargets::get(const DeviceBatch& batch, const torch::Tensor&, std::int64_t n,
                             std::uint64_t) const {
  StepTargets t;
  t.logits = batch.regions[logits_].slice(0, 0, n);
  for (const std::size_t r : features_) t.features.push_back(batch.regions[r].slice(0, 0, n));
  return t;
}

ColocatedTargets::ColocatedTargets(std::vector<ColocatedTeacher> teachers, double temperature,
                                   std::vector<FeatureLoss> features)
    : teachers_(std::move(teachers)), temperature_(temperature), features_(std::move(features)) {
  double sum = 0;
  for (const ColocatedTeacher& c : teachers_) {
    if (!(c.weight > 0)) throw std::invalid_argument("a colocated teacher's weight must be > 0");
    sum += c.weight;
  }
  std::vector<double> logs;
  for (const ColocatedTeacher& c : teachers_) logs.push_back(std::log(c.weight / sum));
  log_weights_ = torch::tensor(logs, torch::kDouble)
                     .to(torch::kFloat)
                     .view({static_cast<std::int64_t>(logs.size()), 1, 1})
                     .to(teachers_.front().teacher->impl().device);
}

StepTargets ColocatedTargets::get(const DeviceBatch&, const torch::Tensor& inputs, std::int64_t n,
                                  std::uint64_t number) const {
  trace::Span forward("teacher", number);
  StepTargets t;
  std::vector<torch::Tensor> each;
  t.features.resize(features_.size());
  for (std::size_t k = 0; k < teachers_.size(); ++k) {
    const ColocatedTeacher& c = teachers_[k];
    const torch::Tensor own = c.input ? adapt_images(*c.input, inputs) : inputs;
    const std::vector<torch::Tensor> outs = c.teacher->impl().forward(own);
    each.push_back(outs[0].slice(0, 0, n).to(torch::kFloat));
    for (std::size_t f = 0; f < features_.size(); ++f)
      if (features_[f].teacher_index == k)
        t.features[f] = outs.at(features_[f].teacher_output).slice(0, 0, n).to(torch::kFloat);
  }
  // Several: the logits whose softmax at T is their weighted mix, as the pipeline's.
  t.logits = each.size() == 1 ? each[0]
                              : mix_teacher_logits(torch::stack(each), log_weights_, temperature_);
  return t;
}

} // namespace kdflow::student
