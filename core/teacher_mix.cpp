// The teachers' softened distributions mixed in log space (teacher_mix.hpp): each teacher's row is
// turned into log-probabilities at T, then accumulated into `out` by log-add-exp, one teacher at a
// time, so no scratch is needed whatever the number of teachers.
#include "kdflow/core/teacher_mix.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow {

TeacherMix::TeacherMix(std::vector<double> weights, double temperature)
    : temperature_(temperature) {
  if (weights.empty()) throw std::invalid_argument("TeacherMix: no teacher");
  if (!(temperature > 0)) throw std::invalid_argument("TeacherMix: temperature must be > 0");
  double sum = 0;
  for (const double w : weights) {
    if (!(w > 0) || !std::isfinite(w))
      throw std::invalid_argument(fmt::format("TeacherMix: weight {} is not > 0", w));
    sum += w;
  }
  for (const double w : weights) log_weights_.push_back(std::log(w / sum));
}

void TeacherMix::operator()(std::span<const float* const> logits, std::size_t rows,
                            std::size_t classes, float* out) const {
  if (logits.size() != log_weights_.size())
    throw std::invalid_argument(fmt::format("TeacherMix: {} teachers' logits for {} weights",
                                            logits.size(), log_weights_.size()));
  const double inv_t = 1.0 / temperature_;
  for (std::size_t r = 0; r < rows; ++r) {
    float* o = out + r * classes;
    for (std::size_t k = 0; k < logits.size(); ++k) {
      const float* z = logits[k] + r * classes;
      // log softmax(z / T) = z / T - (max + log sum exp(z / T - max))
      double top = -INFINITY;
      for (std::size_t c = 0; c < classes; ++c) top = std::max(top, z[c] * inv_t);
      if (!std::isfinite(top)) top = 0; // a row of -inf or NaN: its values carry it through
      double sum = 0;
      for (std::size_t c = 0; c < classes; ++c) sum += std::exp(z[c] * inv_t - top);
      const double shift = log_weights_[k] - top - std::log(sum);
      for (std::size_t c = 0; c < classes; ++c) {
        const double a = z[c] * inv_t + shift; // log(w_k * p_k[c])
        if (k == 0) {
          o[c] = static_cast<float>(a);
          continue;
        }
        const double b = o[c]; // log of the teachers' sum so far
        const double hi = std::max(a, b), lo = std::min(a, b);
        if (std::isnan(a) || std::isnan(b) || hi == -INFINITY)
          o[c] = static_cast<float>(a + b); // NaN stays NaN; two zero probabilities stay zero
        else
          o[c] = static_cast<float>(hi + std::log1p(std::exp(lo - hi)));
      }
    }
    for (std::size_t c = 0; c < classes; ++c) o[c] = static_cast<float>(temperature_ * o[c]);
  }
}

} // namespace kdflow
