// Several teachers as one target: the logits whose softmax at the distillation temperature is the
// weighted mean of the teachers' softmaxes at it. The pipeline writes them into the slot's logits
// region, so every logits loss (kl, dkd) reads an ensemble exactly as it reads one teacher.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace kdflow {

class TeacherMix {
public:
  // `weights`: one per teacher, each > 0 (normalized here); `temperature` > 0.
  TeacherMix(std::vector<double> weights, double temperature);

  // out[r, c] = T * log(sum_k w_k * softmax(logits[k][r, :] / T)[c]), for `rows` rows of `classes`
  // (row-major, each teacher's block the same shape). Allocates nothing; `out` may not alias an
  // input. A non-finite input makes its row non-finite (the trainer's check reports it).
  void operator()(std::span<const float* const> logits, std::size_t rows, std::size_t classes,
                  float* out) const;

  // The normalized weights' logs, in the teachers' order.
  [[nodiscard]] const std::vector<double>& log_weights() const { return log_weights_; }
  [[nodiscard]] double temperature() const { return temperature_; }

private:
  std::vector<double> log_weights_;
  double temperature_;
};

} // namespace kdflow
