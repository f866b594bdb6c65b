// The distillation losses on the student's device (trainer.cpp): Hinton's T^2-scaled KL, and
// decoupled KD. Private to gpu_student (includes torch); the student tests check them.
#pragma once

#include <torch/torch.h>

namespace kdflow::student {

// T^2 * KL(softmax(teacher / T) || softmax(student / T)), batch mean (Hinton et al. 2015).
torch::Tensor kl_loss(const torch::Tensor& student, const torch::Tensor& teacher, double t);

// Decoupled KD (Zhao et al., CVPR 2022): alpha * TCKD + beta * NCKD, each T^2-scaled and a batch
// mean. TCKD is the KL between the binary (target class, all others) distributions; NCKD the KL
// between the distributions over the non-target classes (the target's logit pushed down by 1000
// before the softmax, as the authors' code does). `labels`: the target class of each row.
torch::Tensor dkd_loss(const torch::Tensor& student, const torch::Tensor& teacher,
                       const torch::Tensor& labels, double t, double alpha, double beta);

} // namespace kdflow::student
