#!/usr/bin/env bash
# The GPU check in two halves, because the GPU machine reaches no package registry:
#   bash bench/gpu_check.sh prepare   # here: wheels for the GPU machine's Python 3.12 into .wheels/
#   bash bench/gpu_check.sh run       # there (device tool, carry [".wheels"]): install offline, run
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(dask distributed ipython ipykernel ipywidgets anywidget cloudpickle cryptography psutil
          jupyter_core nvidia-ml-py msgpack toolz tornado)
case "${1:-}" in
  prepare)
    rm -rf .wheels
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
      -d .wheels "${PACKAGES[@]}"
    du -sh .wheels ;;
  run)
    python3 -m pip install -q --no-index --find-links .wheels "${PACKAGES[@]}"
    # nbcluster from this tree; the absolute path reaches the worker processes too.
    PYTHONPATH="$PWD" timeout 280 python3 bench/gpu_check.py ;;
  *) echo "usage: bash bench/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
