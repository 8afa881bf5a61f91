#!/usr/bin/env bash
# Installs PyTorch 2.x from PyPI (pinned: scripts/requirements-torch.txt) into
# .venv-torch/, a virtual environment of its own that only the benchmarks use
# (bench/compare-pytorch.sh and bench/compare-ddp.sh call this script), then
# prints the interpreter's path on stdout; progress goes to stderr.
# Idempotent: .venv-torch is rebuilt only when the pins change. About 5.3 GB
# on disk (the Linux wheel pulls the nvidia-* CUDA wheels; it runs on CPU).
# Usage: scripts/setup-torch.sh
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=scripts/requirements-torch.txt
venv=.venv-torch
stamp=$venv/requirements-torch.txt
if [[ -x $venv/bin/python ]] && cmp -s "$requirements" "$stamp"; then
  echo "setup-torch: $venv has $(grep -m1 '^torch==' "$requirements")" >&2
else
  echo "setup-torch: installing $requirements into $venv/ (~5 GB, a few minutes)" >&2
  rm -rf "$venv"
  # Debian's interpreter, not a version manager's shim that may be first on PATH.
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --only-binary=:all: -r "$requirements" >&2
  cp "$requirements" "$stamp"
fi
echo "$PWD/$venv/bin/python"
