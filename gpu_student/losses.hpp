// The distillation losses on the student's device (trainer.cpp): Hinton's T^2-scaled KL, decoupled
// KD, and the feature losses. Private to gpu_student (includes torch); the student tests check
// them.
#pragma once

#include "kdflow/gpu_student/loss_table.hpp"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace kdflow::student {

// T^2 * KL(softmax(teacher / T) || softmax(student / T)), batch mean (Hinton et al. 2015).
torch::Tensor kl_loss(const torch::Tensor& student, const torch::Tensor& teacher, double t);

// The cross-entropy of `student` logits against the labels `y`; for a mixed batch (`mix_y` given:
// each row's partner label, `mix_lam` the share of its own) lam * CE(y) + (1 - lam) * CE(mix_y)
// per row, the cross-entropy against torchvision's mixed one-hot target. Batch mean.
torch::Tensor cross_entropy_mixed(const torch::Tensor& student, const torch::Tensor& y,
                                  const torch::Tensor& mix_y = {},
                                  const torch::Tensor& mix_lam = {});

// Several teachers' logits [teachers, batch, classes] as one target: T * log(sum_k w_k *
// softmax(z_k / T)), whose softmax at T is the weighted mean of theirs (`log_weights`: the
// normalized weights' logs, [teachers, 1, 1]). The colocated baseline's side of the pipeline's
// TeacherMix.
torch::Tensor mix_teacher_logits(const torch::Tensor& logits, const torch::Tensor& log_weights,
                                 double t);

// Decoupled KD (Zhao et al., CVPR 2022): alpha * TCKD + beta * NCKD, each T^2-scaled and a batch
// mean. TCKD is the KL between the binary (target class, all others) distributions; NCKD the KL
// between the distributions over the non-target classes (the target's logit pushed down by 1000
// before the softmax, as the authors' code does). `labels`: the target class of each row.
torch::Tensor dkd_loss(const torch::Tensor& student, const torch::Tensor& teacher,
                       const torch::Tensor& labels, double t, double alpha, double beta);

// Feature losses on [batch, ...] tensors of one sample shape each (the trainer adapts the student's
// first where it must):
// FitNets' hint (Romero et al. 2015): the mean squared error.
torch::Tensor hint_loss(const torch::Tensor& student, const torch::Tensor& teacher);
// Attention transfer (Zagoruyko and Komodakis 2017) on [batch, C, H, W] maps of one H and W, any
// C: each map's channel mean of squares, flattened and L2-normalized per sample; the mean squared
// difference of the two.
torch::Tensor at_loss(const torch::Tensor& student, const torch::Tensor& teacher);
// Similarity-preserving KD (Tung and Mori 2019), any shapes: each side's batch Gram matrix of the
// flattened features, rows L2-normalized; the squared Frobenius distance over batch^2.
torch::Tensor sp_loss(const torch::Tensor& student, const torch::Tensor& teacher);

// The loss tables' rows with their functions (loss_table.hpp lists what the configuration sees).
struct KdLossInputs {
  const torch::Tensor& student; // logits [batch, classes], float
  const torch::Tensor& teacher; // the target's logits, float
  const torch::Tensor& labels;  // [batch], the classes
  double temperature;
  const std::vector<double>& params; // the row's parameters, in its order
};
struct KdLossDef {
  KdLossInfo info;
  torch::Tensor (*fn)(const KdLossInputs&);
};

// How the trainer brings a student's tap and a teacher's value to a feature loss.
struct FeatureLossDef {
  FeatureLossInfo info;
  // Both sides must be [C, H, W] maps; `refusal` says why otherwise (empty: any shapes).
  std::string maps_only_refusal;
  bool adapter = false;        // an adapter trained with the student maps its tap to the teacher's
  bool resize_teacher = false; // a teacher map of another height and width is resized (bilinear)
  torch::Tensor (*fn)(const torch::Tensor& student, const torch::Tensor& teacher) = nullptr;
};

// The rows by name; std::invalid_argument for a name no row has (the configuration's choices come
// from the rows, so a name from it always has one).
const KdLossDef& kd_loss_def(const std::string& name);
const FeatureLossDef& feature_loss_def(const std::string& name);

} // namespace kdflow::student
