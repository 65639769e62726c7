#!/bin/bash
# LMCache for the lent GPU (issue 47), built here from PyPI: LMCache 0.5.2 and what its cache
# server and vLLM's LMCacheMPConnector import that the device image and ../shared/device's vLLM
# 0.26.0 bundle lack, as cp312 manylinux wheels in two carry folders (each under 64 MiB):
#   .lmc1: llvmlite (numba's compiler, 57 MiB), .lmc2: the rest (27 MiB) and lmcache_pins.txt.
# Why 0.5.2: the release three days before vLLM 0.26.0 whose compiled ops resolve against the
# device's torch 2.11.0+cu130 (`nm -D` of its .so files against torch 2.11's libraries: no
# symbol missing; 0.5.6's cuda_ops misses one) and link libcudart.so.13 as the image has.
# Which packages: `python -c "import <server>, <connector adapter>"` in a Python 3.12 venv with
# torch 2.11.0 and lmcache 0.5.2, every top-level module it loaded, less the vLLM bundle's pins
# (.devkit/vllm_bundle_pins.txt) and torch/numpy; the device installs only those it cannot
# import already (h200.sh, `lmcache_install`).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
PY=${PY:-python3}
rm -rf "$ROOT/.lmc1" "$ROOT/.lmc2"; mkdir -p "$ROOT/.lmc1" "$ROOT/.lmc2"
grep -v '^#' "$HERE/lmcache_pins.txt" | grep -v '^llvmlite' > /tmp/lmc-pins.txt
DL=(download -q --no-deps --only-binary=:all: --python-version 3.12
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
$PY -m pip "${DL[@]}" "$(grep '^llvmlite' "$HERE/lmcache_pins.txt")" -d "$ROOT/.lmc1"
$PY -m pip "${DL[@]}" -r /tmp/lmc-pins.txt -d "$ROOT/.lmc2"
(cd "$ROOT/.lmc1" && sha256sum *.whl > SHA256SUMS); (cd "$ROOT/.lmc2" && sha256sum *.whl > SHA256SUMS)
du -sh "$ROOT/.lmc1" "$ROOT/.lmc2"
