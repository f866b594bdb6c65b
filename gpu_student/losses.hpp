// The distillation losses on the student's device (trainer.cpp): Hinton's T^2-scaled KL, decoupled
// KD, and the feature losses. Private to gpu_student (includes torch); the student tests check
// them.
#pragma once

#include <torch/torch.h>

namespace kdflow::student {

// T^2 * KL(softmax(teacher / T) || softmax(student / T)), batch mean (Hinton et al. 2015).
torch::Tensor kl_loss(const torch::Tensor& student, const torch::Tensor& teacher, double t);

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

} // namespace kdflow::student
