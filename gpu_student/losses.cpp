// Distillation losses (losses.hpp), written from the papers' formulas with LibTorch ops; the KL
// terms as sum p * (log p - log q) with p log p as xlogy, so that zero probabilities add zero.
#include "losses.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace kdflow::student {
namespace {

// sum over everything of p * (log p - log_q): KL(p || q) summed over rows.
torch::Tensor kl_sum(const torch::Tensor& p, const torch::Tensor& log_q) {
  return (torch::xlogy(p, p) - p * log_q).sum();
}

} // namespace

torch::Tensor cross_entropy_mixed(const torch::Tensor& student, const torch::Tensor& y,
                                  const torch::Tensor& mix_y, const torch::Tensor& mix_lam) {
  namespace F = torch::nn::functional;
  if (!mix_y.defined()) return F::cross_entropy(student, y);
  const auto each = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  const torch::Tensor lam = mix_lam.to(student.scalar_type());
  return (lam * F::cross_entropy(student, y, each) +
          (1 - lam) * F::cross_entropy(student, mix_y, each))
      .mean();
}

torch::Tensor mix_teacher_logits(const torch::Tensor& logits, const torch::Tensor& log_weights,
                                 double t) {
  return t * torch::logsumexp(torch::log_softmax(logits / t, 2) + log_weights, 0);
}

torch::Tensor kl_loss(const torch::Tensor& student, const torch::Tensor& teacher, double t) {
  const torch::Tensor log_p_teacher = torch::log_softmax(teacher / t, 1);
  const torch::Tensor log_p_student = torch::log_softmax(student / t, 1);
  return (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum() *
         (t * t / static_cast<double>(student.size(0)));
}

torch::Tensor dkd_loss(const torch::Tensor& student, const torch::Tensor& teacher,
                       const torch::Tensor& labels, double t, double alpha, double beta) {
  const double scale = t * t / static_cast<double>(student.size(0));
  const torch::Tensor target = torch::one_hot(labels, student.size(1)).to(student.dtype());
  const torch::Tensor others = 1 - target;
  // Target-class KD: the (target, rest) split of each softened distribution.
  const torch::Tensor p_student = torch::softmax(student / t, 1);
  const torch::Tensor p_teacher = torch::softmax(teacher / t, 1);
  const auto binary = [&](const torch::Tensor& p) {
    return torch::stack({(p * target).sum(1), (p * others).sum(1)}, 1);
  };
  const torch::Tensor tckd = kl_sum(binary(p_teacher), torch::log(binary(p_student))) * scale;
  // Non-target KD: the distributions over the other classes alone.
  const torch::Tensor nckd = kl_sum(torch::softmax(teacher / t - 1000.0 * target, 1),
                                    torch::log_softmax(student / t - 1000.0 * target, 1)) *
                             scale;
  return alpha * tckd + beta * nckd;
}

torch::Tensor hint_loss(const torch::Tensor& student, const torch::Tensor& teacher) {
  return (student - teacher).pow(2).mean();
}

torch::Tensor at_loss(const torch::Tensor& student, const torch::Tensor& teacher) {
  const auto attention = [](const torch::Tensor& x) {
    const torch::Tensor a = x.pow(2).mean(1).flatten(1);
    return a / a.norm(2, 1, true).clamp_min(1e-12);
  };
  return (attention(student) - attention(teacher)).pow(2).mean();
}

torch::Tensor sp_loss(const torch::Tensor& student, const torch::Tensor& teacher) {
  const auto similarity = [](const torch::Tensor& x) {
    const torch::Tensor f = x.flatten(1);
    const torch::Tensor g = f.matmul(f.t());
    return g / g.norm(2, 1, true).clamp_min(1e-12);
  };
  const auto b = static_cast<double>(student.size(0));
  return (similarity(student) - similarity(teacher)).pow(2).sum() / (b * b);
}

namespace {

const std::vector<KdLossDef>& kd_table() {
  static const std::vector<KdLossDef> table = {
      {{"kl", "Hinton's T^2-scaled KL", {}},
       [](const KdLossInputs& in) { return kl_loss(in.student, in.teacher, in.temperature); }},
      {{"dkd",
        "decoupled KD (Zhao et al. 2022): kd.dkd_alpha * target-class KL + kd.dkd_beta * "
        "non-target KL",
        {{"alpha", 1.0, 0.0, 1e3, "weight of the target-class term"},
         {"beta", 8.0, 0.0, 1e3, "weight of the non-target term"}}},
       [](const KdLossInputs& in) {
         return dkd_loss(in.student, in.teacher, in.labels, in.temperature, in.params.at(0),
                         in.params.at(1));
       }},
  };
  return table;
}

const std::vector<FeatureLossDef>& feature_table() {
  static const std::vector<FeatureLossDef> table = {
      {{"hint", "FitNets' MSE through a trained adapter (1x1 convolution or linear, the "
                "teacher's map resized to the student's)"},
       {},
       true,
       true,
       hint_loss},
      {{"at", "attention transfer"},
       "attention transfer compares [C, H, W] maps",
       false,
       true,
       at_loss},
      {{"sp", "similarity-preserving"}, {}, false, false, sp_loss},
  };
  return table;
}

template <class Row>
const Row& find_row(const std::vector<Row>& table, const std::string& name, const char* what) {
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const Row& row) { return row.info.name == name; });
  if (it == table.end()) throw std::invalid_argument(fmt::format("no {} '{}'", what, name));
  return *it;
}

} // namespace

const KdLossDef& kd_loss_def(const std::string& name) {
  return find_row(kd_table(), name, "distillation loss");
}

const FeatureLossDef& feature_loss_def(const std::string& name) {
  return find_row(feature_table(), name, "feature loss");
}

namespace {

// What the configuration sees of a table: each row's info.
template <class Row>
auto infos_of(const std::vector<Row>& table) {
  std::vector<decltype(Row::info)> out;
  for (const Row& row : table) out.push_back(row.info);
  return out;
}

} // namespace

const std::vector<KdLossInfo>& kd_losses() {
  static const std::vector<KdLossInfo> infos = infos_of(kd_table());
  return infos;
}

const std::vector<FeatureLossInfo>& feature_losses() {
  static const std::vector<FeatureLossInfo> infos = infos_of(feature_table());
  return infos;
}

std::string kd_param_key(const std::string& loss, const std::string& param) {
  return fmt::format("kd.{}_{}", loss, param);
}

} // namespace kdflow::student
