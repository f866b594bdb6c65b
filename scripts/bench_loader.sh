#!/usr/bin/env bash
# The loader benchmark: kdflow's loader stage (bench/loader_bench.cpp) and its PIL peer
# (bench/loader_peer.py, Debian's /usr/bin/python3) on the same JPEG folder, and the ImageNet
# training recipe (RandomResizedCrop, flip, with and without ColorJitter) on Fashion-MNIST made into
# 300-500 pixel JPEGs against torchvision's transforms (bench/loader_peer_torchvision.py, the
# venv's python), one run, written to bench/results/loader_$KD_BENCH_TAG.json (default tag
# "cpu2"). The folders (1000 JPEGs of 256x256, bench/make_jpeg_folder.py, seed 0; 2000 training
# images, bench/make_fmnist_folder.py, seed 0) are made once under ~/.cache/kdflow/bench. Builds
# first. Extra arguments go to kdflow_loader_bench (e.g. --seconds 5 --reps 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release >/dev/null
tag="${KD_BENCH_TAG:-cpu2}"
py=$(cat .kdflow-venv)/bin/python
folder="${KDFLOW_DEPS:-$HOME/.cache/kdflow}/bench/jpeg256"
recipe="${KDFLOW_DEPS:-$HOME/.cache/kdflow}/bench/fmnist_folder"
/usr/bin/python3 bench/make_jpeg_folder.py --out "$folder" --images 1000 --size 256 --seed 0
"$py" bench/make_fmnist_folder.py --out "$recipe" --train 2000 --val 100 --seed 0 >/dev/null
mkdir -p bench/results
kdflow_json=$(mktemp)
pil_json=$(mktemp)
trap 'rm -f "$kdflow_json" "$pil_json"' EXIT
./build/release/bench/kdflow_loader_bench --folder "$folder" --recipe-folder "$recipe" --size 224 \
  --resize 256 --json "$kdflow_json" "$@" >/dev/null
/usr/bin/python3 bench/loader_peer.py --kdflow "$kdflow_json" --out "$pil_json"
"$py" bench/loader_peer_torchvision.py --kdflow "$pil_json" --out "bench/results/loader_${tag}.json"
echo "wrote bench/results/loader_${tag}.json"
