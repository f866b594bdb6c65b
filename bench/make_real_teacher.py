#!/usr/bin/env python3
"""A torchvision network as the teacher of bench/real_job.sh, written twice from the same weights:
its state_dict (for the PyTorch peer, bench/peer_pytorch_kd.py) and ONNX (for kdflow; the legacy
exporter, batch axis open). The project venv's python. Weights: torchvision's initialisation under
--seed (no pretrained weights offline; a speed run needs the network, not its accuracy)."""
import argparse
import os

import torch
import torchvision


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--arch", required=True, help="torchvision.models builder name")
    p.add_argument("--classes", type=int, required=True)
    p.add_argument("--size", type=int, required=True, help="input side the ONNX file is made at")
    p.add_argument("--out", required=True, help="folder: <arch>.pt and <arch>.onnx")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    m = getattr(torchvision.models, a.arch)(num_classes=a.classes).eval()
    torch.save(m.state_dict(), os.path.join(a.out, f"{a.arch}.pt"))
    torch.onnx.export(m, torch.zeros(1, 3, a.size, a.size), os.path.join(a.out, f"{a.arch}.onnx"),
                      dynamo=False, opset_version=17, input_names=["input"],
                      output_names=["logits"], dynamic_axes={"input": {0: "batch"},
                                                             "logits": {0: "batch"}})
    print(os.path.join(a.out, f"{a.arch}.onnx"))


if __name__ == "__main__":
    main()
