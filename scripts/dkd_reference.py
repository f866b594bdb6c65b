#!/usr/bin/env python3
"""The distillation losses as their authors' PyTorch code computes them, on tensors kdflow's test
wrote, for the student tests to compare with (run with the kdflow venv's python).

usage: dkd_reference.py DIR TEMPERATURE DKD_ALPHA DKD_BETA

DIR holds student.npy and teacher.npy ([batch, classes] float32) and labels.npy (float32 class
indices). Prints {"kl": ..., "dkd": ...}: Hinton's T^2-scaled KL (batch mean), and decoupled KD
written as in the DKD paper's reference implementation (mdistiller's dkd_loss, without its warm-up
factor).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def dkd_loss(logits_student, logits_teacher, target, alpha, beta, temperature):
    gt_mask = torch.zeros_like(logits_student).scatter_(1, target.unsqueeze(1), 1).bool()
    other_mask = torch.ones_like(logits_student).scatter_(1, target.unsqueeze(1), 0).bool()
    pred_student = F.softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)

    def cat_mask(t):
        return torch.cat([(t * gt_mask).sum(1, keepdims=True), (t * other_mask).sum(1, keepdims=True)],
                         dim=1)

    pred_student, pred_teacher = cat_mask(pred_student), cat_mask(pred_teacher)
    tckd = (F.kl_div(torch.log(pred_student), pred_teacher, reduction="sum")
            * temperature ** 2 / target.shape[0])
    pred_teacher_part2 = F.softmax(logits_teacher / temperature - 1000.0 * gt_mask, dim=1)
    log_pred_student_part2 = F.log_softmax(logits_student / temperature - 1000.0 * gt_mask, dim=1)
    nckd = (F.kl_div(log_pred_student_part2, pred_teacher_part2, reduction="sum")
            * temperature ** 2 / target.shape[0])
    return alpha * tckd + beta * nckd


def main():
    folder, t, alpha, beta = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    s = torch.from_numpy(np.load(os.path.join(folder, "student.npy"))).double()
    te = torch.from_numpy(np.load(os.path.join(folder, "teacher.npy"))).double()
    y = torch.from_numpy(np.load(os.path.join(folder, "labels.npy"))).long()
    kl = F.kl_div(F.log_softmax(s / t, 1), F.softmax(te / t, 1), reduction="batchmean") * t * t
    print(json.dumps({"kl": kl.item(), "dkd": dkd_loss(s, te, y, alpha, beta, t).item()}))


if __name__ == "__main__":
    main()
