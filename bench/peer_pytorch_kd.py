#!/usr/bin/env python3
"""The distillation loop a PyTorch user writes instead of kdflow (the project venv's python: torch,
torchvision): the peer of bench/real_job.sh, on the same image folder, teacher weights, student and
recipe as the `kdflow train` it is compared with.

torchvision.datasets.ImageFolder with RandomResizedCrop + RandomHorizontalFlip + Normalize
(ImageNet's mean/std, as kdflow's folder default), a DataLoader with `--workers` worker processes
(pin_memory on a GPU, persistent workers), the teacher (a torchvision network with the weights
file the ONNX teacher was exported from) under torch.inference_mode, and the student's step: SGD
with Nesterov momentum, weight decay, linear warm-up then cosine, loss = alpha * T^2 *
KL(teacher/T || student/T) + (1 - alpha) * CE, as kdflow's defaults. On the GPU with bf16 autocast
where `--amp bf16`. Prints one JSON line: samples/s over the training loop (first batch to last
step), steps, and the top-1 on the validation split (Resize + CenterCrop) when `--eval`."""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", required=True, help="folder with train/<class> and val/<class>")
    p.add_argument("--teacher-arch", required=True, help="torchvision.models builder name")
    p.add_argument("--teacher-weights", required=True, help="its state_dict (make_real_teacher.py)")
    p.add_argument("--student-arch", default="resnet18", help="torchvision.models builder name")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--resize", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="torch.set_num_threads in the training process")
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--temperature", type=float, default=4.0)
    p.add_argument("--alpha", type=float, default=0.9)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", default="none", choices=["none", "bf16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval", action="store_true")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    norm = T.Normalize(MEAN, STD)
    train = torchvision.datasets.ImageFolder(
        os.path.join(a.data, "train"),
        T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), norm]))
    loader = torch.utils.data.DataLoader(
        train, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
        pin_memory=dev.type == "cuda", persistent_workers=a.workers > 0)
    classes = len(train.classes)
    teacher = getattr(torchvision.models, a.teacher_arch)(num_classes=classes)
    teacher.load_state_dict(torch.load(a.teacher_weights, map_location="cpu"))
    teacher = teacher.to(dev).eval()
    student = getattr(torchvision.models, a.student_arch)(num_classes=classes).to(dev).train()
    # Weight decay on every parameter, as kdflow's trainer applies it.
    opt = torch.optim.SGD(student.parameters(), lr=a.lr, momentum=a.momentum, nesterov=True,
                          weight_decay=a.weight_decay)

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = (step - a.warmup) / max(1, a.steps - a.warmup)
        return 0.5 * a.lr * (1 + math.cos(math.pi * min(t, 1.0)))

    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp == "bf16")
    step, samples = 0, 0
    start = time.perf_counter()
    while step < a.steps:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.inference_mode(), amp:
                t_logits = teacher(x).float()
            t_logits = t_logits.clone()  # out of inference mode: usable in the loss
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            with amp:
                s_logits = student(x).float()
            tau = a.temperature
            kd = F.kl_div(F.log_softmax(s_logits / tau, 1), F.log_softmax(t_logits / tau, 1),
                          reduction="batchmean", log_target=True) * tau * tau
            loss = a.alpha * kd + (1 - a.alpha) * F.cross_entropy(s_logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            samples += x.shape[0]
            if step >= a.steps:
                break
    if dev.type == "cuda":
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - start
    result = {"peer": "pytorch", "samples_per_s": samples / loop_s, "steps": step,
              "samples": samples, "loop_s": loop_s, "workers": a.workers, "threads": a.threads,
              "device": a.device, "amp": a.amp, "loss": loss.item()}
    if a.eval:
        val = torchvision.datasets.ImageFolder(
            os.path.join(a.data, "val"),
            T.Compose([T.Resize(a.resize), T.CenterCrop(a.size), T.ToTensor(), norm]))
        student.eval()
        hits = 0
        with torch.inference_mode():
            for x, y in torch.utils.data.DataLoader(val, batch_size=a.batch,
                                                    num_workers=a.workers):
                hits += (student(x.to(dev)).argmax(1).cpu() == y).sum().item()
        result["test_accuracy"] = hits / len(val)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
