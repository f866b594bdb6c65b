#!/usr/bin/env python3
"""A torchvision network as the teacher of bench/real_job.sh, written twice from the same weights:
its state_dict (for the PyTorch peer, bench/peer_pytorch_kd.py) and ONNX (for kdflow; the legacy
exporter, batch axis open). The project venv's python. Weights: torchvision's initialisation under
--seed (no pretrained weights offline; a speed run needs the network, not its accuracy), or, with
--train-data and --train-epochs, that network trained on the folder's train/ split (the recipe of
the job itself: RandomResizedCrop + flip, SGD/Nesterov, warm-up + cosine, bf16 autocast on a GPU)
and its top-1 on val/ (resize + centre crop) written to <arch>.json. A stamp of the arguments makes
a second call with the same ones a no-op."""
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


def train(m, a):
    dev = torch.device(a.device)
    norm = T.Normalize(MEAN, STD)
    data = torchvision.datasets.ImageFolder(
        os.path.join(a.train_data, "train"),
        T.Compose([T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), norm]))
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True,
                                         num_workers=a.workers, pin_memory=dev.type == "cuda",
                                         persistent_workers=a.workers > 0)
    steps = a.train_epochs * len(loader)
    warmup = min(50, steps // 5)
    opt = torch.optim.SGD(m.parameters(), lr=a.lr, momentum=0.9, nesterov=True, weight_decay=5e-5)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    m.to(dev).train()
    step, start = 0, time.perf_counter()
    for _ in range(a.train_epochs):
        for x, y in loader:
            lr = a.lr * ((step + 1) / warmup if step < warmup else
                         0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))
            for g in opt.param_groups:
                g["lr"] = lr
            with amp:
                loss = F.cross_entropy(m(x.to(dev, non_blocking=True)).float(),
                                       y.to(dev, non_blocking=True))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    train_s = time.perf_counter() - start
    val = torchvision.datasets.ImageFolder(
        os.path.join(a.train_data, "val"),
        T.Compose([T.Resize(a.size * 8 // 7), T.CenterCrop(a.size), T.ToTensor(), norm]))
    m.eval()
    hits = 0
    with torch.inference_mode():
        for x, y in torch.utils.data.DataLoader(val, batch_size=a.batch, num_workers=a.workers):
            hits += (m(x.to(dev)).argmax(1).cpu() == y).sum().item()
    m.cpu()
    return {"steps": step, "epochs": a.train_epochs, "batch": a.batch, "lr": a.lr,
            "device": a.device, "train_s": train_s, "val_accuracy": hits / len(val),
            "val_images": len(val)}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", required=True, help="torchvision.models builder name")
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--size", type=int, required=True, help="input side the ONNX file is made at")
    p.add_argument("--out", required=True, help="folder: <arch>.pt and <arch>.onnx")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-data", help="an image folder (train/<class>, val/<class>) to train on")
    p.add_argument("--train-epochs", type=int, default=0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    if (a.train_epochs > 0) != bool(a.train_data):
        p.error("--train-data and --train-epochs go together")
    os.makedirs(a.out, exist_ok=True)
    stamp = os.path.join(a.out, f"{a.arch}.stamp")
    args = json.dumps({k: v for k, v in vars(a).items() if k not in ("out", "workers")}, sort_keys=True)
    onnx = os.path.join(a.out, f"{a.arch}.onnx")
    if os.path.exists(stamp) and open(stamp).read() == args and os.path.exists(onnx):
        print(onnx)
        return
    torch.manual_seed(a.seed)
    m = getattr(torchvision.models, a.arch)(num_classes=a.classes)
    info = {"arch": a.arch, "classes": a.classes, "seed": a.seed, "trained": None}
    if a.train_epochs > 0:
        info["trained"] = train(m, a)
        print(f"make_real_teacher: {a.arch} trained {a.train_epochs} epochs in "
              f"{info['trained']['train_s']:.1f} s: val top-1 {info['trained']['val_accuracy']:.4f}",
              flush=True)
    m.eval()
    torch.save(m.state_dict(), os.path.join(a.out, f"{a.arch}.pt"))
    torch.onnx.export(m, torch.zeros(1, 3, a.size, a.size), onnx,
                      dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "batch"},
                                                             "logits": {0: "batch"}})
    with open(os.path.join(a.out, f"{a.arch}.json"), "w") as f:
        json.dump(info, f, indent=1)
    with open(stamp, "w") as f:
        f.write(args)
    print(onnx)


if __name__ == "__main__":
    main()
