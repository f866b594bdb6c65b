#!/usr/bin/env python3
"""The feature losses as torchdistill's PyTorch code computes them, on tensors kdflow's test wrote,
for the student tests to compare with (run with the kdflow venv's python).

usage: feature_loss_reference.py DIR

DIR holds student.npy and teacher.npy ([batch, C, H, W] float32 maps of one height and width,
channel counts that may differ) and hint.npy (the student's map already the teacher's shape).
Prints {"hint": ..., "at": ..., "sp": ...}: FitNets' hint (MSE, mean), attention transfer (the
channel mean of squares, flattened and L2-normalized, its mean squared difference; torchdistill's
AttentionTransferLoss with p = 2 and the mean reduction) and similarity-preserving KD (batch Gram
matrices of the flattened features, rows L2-normalized, squared Frobenius distance over batch^2;
torchdistill's SPKDLoss).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def attention_map(x):
    return F.normalize(x.pow(2).mean(1).view(x.size(0), -1))


def at_loss(student, teacher):
    return (attention_map(student) - attention_map(teacher)).pow(2).mean()


def sp_loss(student, teacher):
    b = student.shape[0]
    fs, ft = student.view(b, -1), teacher.view(b, -1)
    gs = F.normalize(torch.mm(fs, fs.t()))
    gt = F.normalize(torch.mm(ft, ft.t()))
    return torch.norm(gs - gt, p="fro").pow(2) / (b * b)


def main():
    folder = sys.argv[1]
    load = lambda name: torch.from_numpy(np.load(os.path.join(folder, name))).double()
    s, t, h = load("student.npy"), load("teacher.npy"), load("hint.npy")
    print(json.dumps({"hint": F.mse_loss(h, t).item(), "at": at_loss(s, t).item(),
                      "sp": sp_loss(s, t).item()}))


if __name__ == "__main__":
    main()
