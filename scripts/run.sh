#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the default training job
# (Fashion-MNIST, the shipped teacher models/fmnist_teacher.onnx, the default student) into
# runs/default. Extra arguments go to `kdflow train`, e.g. --set train.epochs=3.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
./build/release/src/kdflow --version
# A run folder given by the caller (--out DIR or --out=DIR) is theirs; otherwise runs/default, a
# fresh one each time: the previous one is moved aside, not overwritten.
if [[ " $* " == *" --out "* || " $* " == *" --out="* ]]; then
  exec ./build/release/src/kdflow train "$@"
fi
out=runs/default
if [[ -d $out/checkpoints ]]; then
  mv "$out" "$out.$(date +%Y%m%d-%H%M%S)"
fi
exec ./build/release/src/kdflow train --out "$out" "$@"
