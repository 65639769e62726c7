#!/bin/bash
# LMCache for the lent GPU (issue 47), built here from PyPI: LMCache 0.5.2 and what its cache
# server and vLLM's LMCacheMPConnector import that the device image and ../shared/device's vLLM
# 0.26.0 bundle lack, as cp312 manylinux wheels in three carry folders, each small enough to
# travel beside the 22 MiB tree (64 MiB a call): .lmc1 and .lmc3, llvmlite (numba's compiler,
# 57 MiB) cut in two; .lmc2, the rest (27 MiB). Each goes to the device in a call of its own
# (`mkdir -p /tmp/lmstage && cp -r .lmcN/. /tmp/lmstage/`); h200.sh's `lmcache_install` joins
# the parts, checks every sha256 and installs the wheels the device cannot import already.
# Why 0.5.2: the release three days before vLLM 0.26.0 whose compiled ops resolve against the
# device's torch 2.11.0+cu130 (`nm -D` of its .so files against torch 2.11's libraries: no
# symbol missing; 0.5.6's cuda_ops misses one) and link libcudart.so.13 as the image has.
# Which packages: `python -c "import <server>, <connector adapter>"` in a Python 3.12 venv with
# torch 2.11.0 and lmcache 0.5.2, every top-level module it loaded, less the vLLM bundle's pins
# (.devkit/vllm_bundle_pins.txt) and torch/numpy (lmcache_pins.txt).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
PY=${PY:-python3}
rm -rf "$ROOT/.lmc1" "$ROOT/.lmc2" "$ROOT/.lmc3" /tmp/lmc-llvm
mkdir -p "$ROOT/.lmc1" "$ROOT/.lmc2" "$ROOT/.lmc3" /tmp/lmc-llvm
grep -v '^#' "$HERE/lmcache_pins.txt" | grep -v '^llvmlite' > /tmp/lmc-pins.txt
DL=(download -q --no-deps --only-binary=:all: --python-version 3.12
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
$PY -m pip "${DL[@]}" "$(grep '^llvmlite' "$HERE/lmcache_pins.txt")" -d /tmp/lmc-llvm
$PY -m pip "${DL[@]}" -r /tmp/lmc-pins.txt -d "$ROOT/.lmc2"
(cd /tmp/lmc-llvm && sha256sum ./*.whl > "$ROOT/.lmc1/SHA256SUMS.llvmlite" \
  && W=$(ls ./*.whl) && split -b 29M "$W" "$W.part-" && mv "$W".part-aa "$ROOT/.lmc1/" \
  && mv "$W".part-ab "$ROOT/.lmc3/")
(cd "$ROOT/.lmc2" && sha256sum ./*.whl > SHA256SUMS.rest)
du -sh "$ROOT/.lmc1" "$ROOT/.lmc2" "$ROOT/.lmc3"
