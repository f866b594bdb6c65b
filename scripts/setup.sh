#!/usr/bin/env bash
# Installs everything kdflow needs on Debian 12 (as root, or with sudo): Debian packages, and a
# Python virtual environment (Debian's /usr/bin/python3) holding the PyPI LibTorch, oneDNN (TBB
# runtime) and oneTBB. Idempotent: a second run checks and returns in seconds.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
deps=${KDFLOW_DEPS:-$HOME/.cache/kdflow}
venv=$deps/venv
stamp_version=8   # bump when the package lists below change

apt_packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  python3 python3-venv python3-pip
  libhwloc-dev hwloc
  libgloo-dev  # the headers c10d's ProcessGroupGloo header includes (LibTorch holds the code)
  libprotobuf-dev protobuf-compiler
  libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libboost-dev libreaderwriterqueue-dev relacy-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev zlib1g-dev
  clang-14 libclang-rt-14-dev  # the fuzz preset: clang's libFuzzer and sanitizer runtimes
  dataset-fashion-mnist gnuplot-nox
  pybind11-dev python3-dev  # kdflow's Python module (python/), for the venv's python (3.11)
  python3-pil python3-numpy  # the loader benchmark's peer, for Debian's /usr/bin/python3
)
# oneDNN 3.2 built for the TBB CPU runtime needs oneTBB 2021.x and the Intel compiler runtime
# (libimf, libintlc) it was built with; both come from PyPI so that the
# process holds exactly one libtbb. torch 2.11.0 matches the lent GPU machines (CUDA 13.0).
pip_packages=(
  torch==2.11.0 torchvision==0.26.0 pillow
  onednn-devel-cpu-tbb==2023.2.0 onednn-cpu-tbb==2023.2.0
  tbb-devel==2021.13.1 tbb==2021.13.1 intel-cmplr-lib-rt==2023.2.0
  numpy onnxruntime
  # The teacher reads ONNX through this onnx's onnx.proto (compiled into kdflow; Debian's libonnx
  # 1.12 stops at IR 8, opset 17); onnxscript is what torch.onnx.export's default exporter needs.
  onnx==1.23.2 onnxscript==0.7.2
  # timm: the image families of the teacher-coverage run (scripts/teacher_zoo.py), random weights.
  timm==1.0.20
  # tensorboard: its event.proto descriptors (the run folder's event files are compiled from
  # them) and its EventAccumulator, which the tests read those files back with.
  tensorboard==2.21.0
  # pytest: the Python module's tests (tests/python, the ctest python_module).
  pytest==9.2.0
)

sudo_=""
[ "$(id -u)" -eq 0 ] || sudo_=sudo

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The PyPI LibTorch is a CUDA build: its CMake config needs a CUDA toolkit (nvcc, headers) even to
# build for the CPU. This project's machines ship CUDA 13 in /usr/local/cuda.
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: no CUDA toolkit found (nvcc on PATH or /usr/local/cuda/bin/nvcc); the CUDA LibTorch" \
       "wheel (torch==2.11.0) needs one to configure. Install CUDA 13.0 and run again." >&2
  exit 1
fi

stamp=$venv/.kdflow-setup-$stamp_version
if [ ! -f "$stamp" ]; then
  echo "setup: creating $venv with ${pip_packages[*]}"
  mkdir -p "$deps"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "${pip_packages[@]}"
  touch "$stamp"
fi

# CMake reads this file to find the venv (so a plain `cmake -S . -B build` needs no flags).
printf '%s\n' "$venv" > "$here/.kdflow-venv"
echo "setup: ok (venv $venv)"
