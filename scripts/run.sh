#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the default training job
# (Fashion-MNIST, the shipped teacher models/fmnist_teacher.onnx, the default student) into
# runs/default. Extra arguments go to `kdflow train`, e.g. --set train.epochs=3.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
./build/release/src/kdflow --version
out=runs/default
if [[ -d $out/checkpoints ]] && [[ " $* " != *" --out "* ]]; then
  # A fresh default run each time: the previous one is moved aside, not overwritten.
  mv "$out" "$out.$(date +%Y%m%d-%H%M%S)"
fi
exec ./build/release/src/kdflow train --out "$out" "$@"
