#!/usr/bin/env bash
# Installs every Debian package dtrain needs to build, test and run its
# examples, then ONNX Runtime, onnx and TensorBoard from PyPI into the
# project's virtual environment .venv/ (pinned: scripts/requirements.txt),
# which the ONNX export's tests and benchmarks run models with and the
# TensorBoard tests read event files with. Idempotent: packages already
# present are left as they are, and .venv is rebuilt only when the pins change.
# Usage: scripts/setup.sh [--bench]   (--bench adds what bench/'s PyTorch comparisons
# need beyond the tests' PyTorch)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  # build
  cmake ninja-build g++ pkg-config
  # libraries (README.md says why each is here)
  protobuf-compiler libprotobuf-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libdnnl-dev zlib1g-dev
  libboost-dev libgloo-dev openmpi-bin libopenmpi-dev
  # ONNX export (export/): protobuf classes, checker, shape inference
  libonnx-dev
  # .venv/ for ONNX Runtime and TensorBoard
  python3-venv
  # tests: a real Slurm cluster (tests/cluster), network namespaces, and PyTorch
  # for dtrain-launch's torchrun contract (tests/integration/test_launch_torchrun.cpp)
  # and the decoder's PyTorch reference (tests/integration/test_reference_pytorch.cpp)
  slurm-wlm munge iproute2 python3-torch
  # dtrain-launch --rdzv-backend etcd: the tests start a 3-member cluster of their own
  etcd-server etcd-client
  # data the examples train on
  dataset-fashion-mnist fortunes
  # scripts/plot.sh
  gnuplot-nox
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(libopenblas0-pthread)
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

# Package lists first, so a fresh machine installs current versions.
$SUDO apt-get update -qq

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Debian's interpreter, not a version manager's shim that may be first on PATH.
requirements=scripts/requirements.txt
stamp=.venv/requirements.txt
if [[ -x .venv/bin/python ]] && cmp -s "$requirements" "$stamp"; then
  echo "setup: .venv has its pinned packages ($(grep -m1 '^onnxruntime==' "$requirements"), $(grep -m1 '^tensorboard==' "$requirements"))"
else
  echo "setup: installing $requirements into .venv/"
  /usr/bin/python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    -r "$requirements"
  cp "$requirements" "$stamp"
fi
