#!/usr/bin/env python3
"""The distillation loop a PyTorch user writes instead of kdflow (the project venv's python: torch,
torchvision): the peer of bench/real_job.sh, on the same image folder, teacher weights, student and
recipe as the `kdflow train` it is compared with.

With --idx (Fashion-MNIST's IDX files: kdflow's default job), the data is held in memory as the
loop a user writes for it does (the whole split a tensor, a shuffled index per epoch, the
dataset's own mean/std as kdflow's `auto`), the teacher is the shipped ONNX file's own weights
(--teacher-onnx: a chain of Conv/Relu/MaxPool/GlobalAveragePool/Flatten/Gemm read into torch.nn
layers, BatchNorm already folded by its exporter) and the student is kdflow's built-in `cnn`
(--student-arch kdflow-cnn: three 3x3 conv-BN-ReLU stages with 2x2 max-pools between, global
average pool, one linear layer).

torchvision.datasets.ImageFolder with RandomResizedCrop + RandomHorizontalFlip + Normalize
(ImageNet's mean/std, as kdflow's folder default), a DataLoader with `--workers` worker processes
(pin_memory on a GPU, persistent workers), the teacher (a torchvision network with the weights
file the ONNX teacher was exported from) under torch.inference_mode, and the student's step: SGD
with Nesterov momentum, weight decay, linear warm-up then cosine, loss = alpha * T^2 *
KL(teacher/T || student/T) + (1 - alpha) * CE, as kdflow's defaults. On the GPU with bf16 autocast
where `--amp bf16`. Prints one JSON line: samples/s over the training loop (first batch to last
step), steps, and the top-1 on the validation split (Resize + CenterCrop) when `--eval`."""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
import torchvision.transforms.v2 as T2

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def read_idx(path):
    """An IDX file (gzip or raw) as a numpy array of its declared shape."""
    raw = (gzip.open if path.endswith(".gz") else open)(path, "rb").read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


class IdxBatches:
    """A split of IDX images in memory, normalized once; shuffled batches as a user's loop draws
    them (drop_last, as kdflow's default)."""

    def __init__(self, root, split, batch, shuffle, mean, std):
        prefix = "train" if split == "train" else "t10k"
        x = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))
        self.x = ((torch.from_numpy(x.copy()).float() / 255 - mean) / std).unsqueeze(1)
        self.y = torch.from_numpy(
            read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64))
        self.batch, self.shuffle = batch, shuffle

    def __len__(self):
        return len(self.y)

    def __iter__(self):
        n = len(self.y)
        order = torch.randperm(n) if self.shuffle else torch.arange(n)
        last = n - n % self.batch if self.shuffle else n
        for i in range(0, last, self.batch):
            idx = order[i:i + self.batch]
            yield self.x[idx], self.y[idx]


def onnx_chain(path):
    """A teacher ONNX file whose nodes form one chain of Conv/Relu/MaxPool/GlobalAveragePool/
    Flatten/Gemm as torch.nn.Sequential with its weights (the shipped teacher's form)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    init = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in m.graph.initializer}
    layers = []
    for node in m.graph.node:
        at = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            w = init[node.input[1]]
            pads = list(at.get("pads", [0, 0, 0, 0]))
            if pads[:2] != pads[2:]:
                raise SystemExit(f"{path}: node {node.name}: asymmetric pads")
            c = nn.Conv2d(w.shape[1] * at.get("group", 1), w.shape[0], tuple(w.shape[2:]),
                          stride=tuple(at.get("strides", [1, 1])), padding=tuple(pads[:2]),
                          dilation=tuple(at.get("dilations", [1, 1])), groups=at.get("group", 1),
                          bias=len(node.input) > 2)
            c.weight.data.copy_(w)
            if c.bias is not None:
                c.bias.data.copy_(init[node.input[2]])
            layers.append(c)
        elif node.op_type == "Relu":
            layers.append(nn.ReLU())
        elif node.op_type == "MaxPool":
            layers.append(nn.MaxPool2d(tuple(at["kernel_shape"]),
                                       tuple(at.get("strides", at["kernel_shape"]))))
        elif node.op_type == "GlobalAveragePool":
            layers.append(nn.AdaptiveAvgPool2d(1))
        elif node.op_type == "Flatten":
            layers.append(nn.Flatten())
        elif node.op_type == "Gemm":
            w = init[node.input[1]]
            if not at.get("transB", 0):
                w = w.t()
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data.copy_(w)
            lin.bias.data.copy_(init[node.input[2]])
            layers.append(lin)
        else:
            raise SystemExit(f"{path}: node {node.name}: {node.op_type} is outside the chain the "
                             "peer reads (Conv/Relu/MaxPool/GlobalAveragePool/Flatten/Gemm)")
    return nn.Sequential(*layers)


def kdflow_cnn(channels, classes):
    """kdflow's built-in `cnn` student (gpu_student/models.cpp) at width 1."""
    def conv_bn(i, o):
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
    return nn.Sequential(*conv_bn(channels, 32), nn.MaxPool2d(2), *conv_bn(32, 64),
                         nn.MaxPool2d(2), *conv_bn(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(128, classes))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", help="folder with train/<class> and val/<class>")
    p.add_argument("--idx", help="folder of Fashion-MNIST's IDX files instead (kdflow's default job)")
    p.add_argument("--mean", type=float, default=0.2860, help="--idx: the data's mean")
    p.add_argument("--std", type=float, default=0.3530, help="--idx: the data's std")
    p.add_argument("--teacher-arch", help="torchvision.models builder name")
    p.add_argument("--teacher-weights", help="its state_dict (make_real_teacher.py)")
    p.add_argument("--teacher-onnx", help="--idx: the teacher's ONNX file (its weights)")
    p.add_argument("--student-arch", default="resnet18",
                   help="torchvision.models builder name, or kdflow-cnn")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--resize", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--schedule-steps", type=int, default=0,
                   help="the steps the warm-up + cosine schedule spans (0: --steps); kdflow's spans "
                        "its epochs, and train.max_steps only stops it")
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
    p.add_argument("--eval-epochs", action="store_true",
                   help="also evaluate at each epoch's end (as kdflow does), outside the timed "
                        "loop: the steps and accuracies in the output's evaluations")
    p.add_argument("--mixup-alpha", type=float, default=0.0,
                   help="torchvision.transforms.v2.MixUp on each batch (0: off)")
    p.add_argument("--cutmix-alpha", type=float, default=0.0,
                   help="torchvision.transforms.v2.CutMix on each batch (0: off); with "
                        "--mixup-alpha, one of the two per batch (RandomChoice)")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if (a.idx is None) == (a.data is None):
        p.error("one of --data (an image folder) and --idx (Fashion-MNIST's IDX files)")
    if a.idx:
        if not a.teacher_onnx:
            p.error("--idx takes the teacher as --teacher-onnx")
        loader = IdxBatches(a.idx, "train", a.batch, True, a.mean, a.std)
        classes = int(loader.y.max()) + 1
        teacher = onnx_chain(a.teacher_onnx)
    else:
        if not (a.teacher_arch and a.teacher_weights):
            p.error("--data takes --teacher-arch and --teacher-weights")
        norm = T.Normalize(MEAN, STD)
        train = torchvision.datasets.ImageFolder(
            os.path.join(a.data, "train"),
            T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(),
                       norm]))
        loader = torch.utils.data.DataLoader(
            train, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
            pin_memory=dev.type == "cuda", persistent_workers=a.workers > 0)
        classes = len(train.classes)
        teacher = getattr(torchvision.models, a.teacher_arch)(num_classes=classes)
        teacher.load_state_dict(torch.load(a.teacher_weights, map_location="cpu"))
    teacher = teacher.to(dev).eval()
    if a.student_arch == "kdflow-cnn":
        student = kdflow_cnn(1 if a.idx else 3, classes)
    else:
        student = getattr(torchvision.models, a.student_arch)(num_classes=classes)
    student = student.to(dev).train()
    # Weight decay on every parameter, as kdflow's trainer applies it.
    opt = torch.optim.SGD(student.parameters(), lr=a.lr, momentum=a.momentum, nesterov=True,
                          weight_decay=a.weight_decay)

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = (step - a.warmup) / max(1, (a.schedule_steps or a.steps) - a.warmup)
        return 0.5 * a.lr * (1 + math.cos(math.pi * min(t, 1.0)))

    mixes = []
    if a.cutmix_alpha > 0:
        mixes.append(T2.CutMix(alpha=a.cutmix_alpha, num_classes=classes))
    if a.mixup_alpha > 0:
        mixes.append(T2.MixUp(alpha=a.mixup_alpha, num_classes=classes))
    mix = mixes[0] if len(mixes) == 1 else T2.RandomChoice(mixes) if mixes else None
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.amp == "bf16")

    def evaluate():
        """The student's top-1 on the validation split (the teacher's too, for --idx)."""
        if a.idx:
            val = IdxBatches(a.idx, "test", a.batch, False, a.mean, a.std)
            batches = iter(val)
        else:
            val = torchvision.datasets.ImageFolder(
                os.path.join(a.data, "val"),
                T.Compose([T.Resize(a.resize), T.CenterCrop(a.size), T.ToTensor(), norm]))
            batches = torch.utils.data.DataLoader(val, batch_size=a.batch, num_workers=a.workers)
        student.eval()
        hits = 0
        with torch.inference_mode():
            for x, y in batches:
                hits += (student(x.to(dev)).argmax(1).cpu() == y).sum().item()
        student.train()
        return hits / len(val), val

    step, samples, evaluations, evaluation_s = 0, 0, [], 0.0
    start = time.perf_counter()
    while step < a.steps:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if mix is not None:  # the teacher sees the mixed images; CE's target is the mix
                x, y = mix(x, y)
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
        else:  # an epoch's end
            if a.eval_epochs and step < a.steps:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                evaluations.append({"step": step, "test_accuracy": evaluate()[0]})
                evaluation_s += time.perf_counter() - t0
    if dev.type == "cuda":
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - start - evaluation_s
    result = {"peer": "pytorch", "samples_per_s": samples / loop_s, "steps": step,
              "samples": samples, "loop_s": loop_s, "workers": 0 if a.idx else a.workers,
              "threads": a.threads, "seed": a.seed,
              "device": a.device, "amp": a.amp, "loss": loss.item()}
    if a.eval or a.eval_epochs:
        accuracy, val = evaluate()
        result["test_accuracy"] = accuracy
        evaluations.append({"step": step, "test_accuracy": accuracy})
        if a.eval_epochs:
            result["evaluations"] = evaluations
        if a.idx:  # the teacher read from ONNX is the shipped one: its accuracy as its .json says
            with torch.inference_mode():
                hits = sum((teacher(x).argmax(1) == y).sum().item() for x, y in iter(val))
            result["teacher_test_accuracy"] = hits / len(val)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
