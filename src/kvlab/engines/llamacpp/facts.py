"""All of kvlab's knowledge of llama.cpp's llama-server: flags, slots API, timings, metrics.

Facts pinned for llama.cpp commit 0c1e570 (the llama-cpp-python 0.3.36 tree) and checked
against the binary's `--help` at plan time, since flags move between versions:
- serve flags are the seed's `llama-cache-tiers.sh serve` ones; `--cache-prompt` and `--slots`
  are defaults (passed so the run documents itself), `--metrics` is off unless passed;
- `--parallel N --ctx-size C` gives C/N tokens per slot (no `--kv-unified`);
- `POST /slots/{id}?action=save|restore` takes `{"filename": bare-name}` inside
  `--slot-save-path`; `action=erase` takes no body; every failure is a generic HTTP 400 with
  the reason only in the server log; slot ids past the last slot wrap around;
- reuse evidence per response is `timings.cache_n` (reused) vs `timings.prompt_n` (computed);
- slot files do not carry across builds, KV types, `--parallel` or flash-attention modes, and
  restore checks nothing about model identity (a foreign file restores silently).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import EngineError, RefusedError, Settings
from kvlab.engines import install, llama_build
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.records import KvType

LLAMA_CPP = "llama.cpp"  # its name in plans, records and load rows
# other spellings met at the boundary: Part 9's load-test.py takes `--engine llamacpp`
ALIASES = ("llamacpp",)
# the server's bearer key when --api-key is absent (common/arg.cpp: `--api-key`, env)
API_KEY_ENV = "LLAMA_API_KEY"
# /metrics names (counters are exported without a _total suffix on this server)
CONTEXT_FLAGS = ("--ctx-size", "-c")  # the long spelling is the one kvlab writes
PARALLEL_FLAGS = ("--parallel", "-np")
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"
PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached_total"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"

# evidence key -> (counter family, label filter); llama-server has no prefix-hit counter,
# cached prompt tokens are the nearest (and per-response timings.cache_n the best) evidence
EVIDENCE_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "prompt_tokens_total": (PROMPT_TOKENS, {}),
    "prompt_tokens_cached_total": (PROMPT_TOKENS_CACHED, {}),
    "tokens_predicted_total": (TOKENS_PREDICTED, {}),
}
EVIDENCE_GAUGES: dict[str, tuple[str, ...]] = {
    "requests_processing": (REQUESTS_PROCESSING,),
    "requests_deferred": (REQUESTS_DEFERRED,),
}

QUANTISED_KV_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
SLOT_ACTIONS = ("save", "restore", "erase")
_BARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def find_llama_server(settings: Settings) -> Path | None:
    """LLAMA_BIN/llama-server, else llama-server on PATH (the user's build, for this machine's
    accelerator: Metal, ROCm, CUDA), else kvlab's build for this machine's device (never its
    CPU build where the engines run on a GPU: `llama_build.py`)."""
    if settings.llama_bin:
        candidate = Path(settings.llama_bin).expanduser()
        candidate = candidate / "llama-server" if candidate.is_dir() else candidate
        return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None
    found = shutil.which(SERVER_BINARY)
    if found:
        return Path(found)
    return install.installed_llama_server(settings.home(), build_target(settings))


def build_target(settings: Settings) -> llama_build.Target:
    """The llama-server build this machine's device takes."""
    return llama_build.target(settings, install.isa_key())


def not_found(settings: Settings) -> str:
    """Why no llama-server runs here, and the one thing that fixes it."""
    if settings.llama_bin:
        return (f"LLAMA_BIN ({settings.llama_bin}) holds no executable llama-server: point it "
                "at the binary or the directory holding it")
    target = build_target(settings)
    if target.missing:
        return target.missing
    return (f"llama-server is not on PATH and kvlab has not built it for "
            f"{target.describe()}: `kvlab engines install --only llama` builds it, or set "
            "LLAMA_BIN to the directory holding one")


def version_note(build_info: str) -> str | None:
    """A note when the server is not the build kvlab's llama.cpp facts are pinned for (its
    /props `build_info`, e.g. "b1-0c1e570"): flags are still checked against its --help."""
    pinned = install.LLAMA_CPP_COMMIT[:7]
    if build_info in ("", "unknown") or build_info.endswith(pinned):
        return None
    return (f"llama-server {build_info} is not the build kvlab's facts are pinned for "
            f"({pinned}): flags are checked against its --help, but slot files do not carry "
            "across builds and log lines may read differently")


def require_llama_server(settings: Settings) -> Path:
    binary = find_llama_server(settings)
    if binary is None:
        raise EngineError(not_found(settings))
    return binary


def help_flags(binary: Path) -> frozenset[str]:
    """Every `--flag` the binary's --help lists."""
    run = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30,
                         check=False)
    return frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", run.stdout + run.stderr))


@dataclass(frozen=True)
class LlamaOptions:
    """Per-invocation choices that are not settings."""

    model: str | None = None
    port: int | None = None
    parallel: int | None = None
    cache_type: str | None = None
    slot_save_path: str | None = None
    extra_args: tuple[str, ...] = ()
    role: str = "llama"
    cache_ram_mib: int | None = None  # --cache-ram; 0 turns the in-RAM prompt cache off
    cache_prompt: bool = True  # False: --no-cache-prompt (no request reuses a slot's prefix)
    log_verbosity: int | None = None  # -lv; DEBUG_VERBOSITY logs the RAM cache's state


def made_model(settings: Settings) -> str:
    """The GGUF kvlab made from MODEL, where LLAMA_MODEL is unset ("": none made yet)."""
    from kvlab.engines.llamacpp.model_gguf import made_path

    made = made_path(settings)
    return str(made) if made is not None and made.is_file() else ""


def plan(settings: Settings, binary: Path | str, opts: LlamaOptions | None = None) -> EnginePlan:
    """The seed's `llama-cache-tiers.sh serve` as a plan."""
    opts = opts or LlamaOptions()
    model = opts.model or settings.llama_model or made_model(settings)
    if not model:
        raise RefusedError("LLAMA_MODEL is not set in .env, and no GGUF has been made from "
                           "MODEL (kvlab makes one before it starts llama-server where MODEL "
                           "is a Qwen3 directory)")
    if not Path(model).is_file():
        raise RefusedError(f"LLAMA_MODEL ({model}) is not a file.")
    port = opts.port or settings.llama_port
    parallel = opts.parallel or settings.llama_parallel
    kv_type = opts.cache_type or settings.llama_cache_type
    slot_path = str(Path(opts.slot_save_path or settings.llama_slot_save_path).expanduser())
    flags = [
        Flag("--model", model), Flag("--alias", settings.served_name),
        Flag("--host", settings.serve_host), Flag("--port", str(port)),
        Flag(CONTEXT_FLAGS[0], str(settings.ctx)), Flag("--parallel", str(parallel)),
        Flag("--n-gpu-layers", "999"),
        Flag("--cache-prompt" if opts.cache_prompt else NO_CACHE_PROMPT_FLAG),
        Flag("--cache-type-k", kv_type), Flag("--cache-type-v", kv_type),
        Flag("--slot-save-path", slot_path), Flag("--metrics"), Flag("--slots"),
    ]
    if opts.cache_ram_mib is not None:
        flags.append(Flag("--cache-ram", str(opts.cache_ram_mib)))
    if opts.log_verbosity is not None:
        flags.append(Flag("--log-verbosity", str(opts.log_verbosity)))
    notes = []
    if kv_type in QUANTISED_KV_TYPES:
        notes.append(f"{kv_type} KV rounds the stored keys and values: outputs change, so never "
                     "compare this run against an f16 one")
    summary = (
        ("model", model), ("served as", settings.served_name),
        ("listening on", f"http://{settings.serve_host}:{port}"),
        ("context", str(settings.ctx)), ("slots", str(parallel)),
        ("tokens per slot", str(settings.ctx // parallel)),
        ("key-value type", f"{kv_type} for both keys and values"),
        ("slot save path", slot_path),
    )
    return EnginePlan(
        engine=LLAMA_CPP, role=opts.role, command=(str(binary),), flags=tuple(flags),
        extra_args=opts.extra_args, host=settings.serve_host, port=port, health_path="/health",
        private_dirs=(slot_path,), summary=summary, notes=tuple(notes),
        model=model, served_name=settings.served_name,
    )


def check_slot_filename(name: str) -> str:
    """A slot file name must be a bare name inside the slot directory (no path traversal).

    fullmatch, not match: `$` also matches before a final newline, so "a.bin\n" would pass.
    """
    if not _BARE_NAME.fullmatch(name) or ".." in name:
        raise RefusedError(
            f"slot file name {name!r} must be a bare name (letters, digits, . _ -), "
            "not a path"
        )
    return name


def slot_url(base_url: str, slot: int, action: str) -> str:
    if action not in SLOT_ACTIONS:
        raise RefusedError(f"slot action {action!r}: use one of {', '.join(SLOT_ACTIONS)}")
    if slot < 0:
        raise RefusedError(f"slot id {slot} must be 0 or more")
    return f"{base_url}/slots/{slot}?action={action}"


# ---- slots API answers, server identity, failures and KV labels ---------------------------
# (facts for the slot store, `kvlab llama` and the disk/interference experiments)

# POST /slots/{id}?action=...: the answer's (token count, byte count, server ms) keys
SLOT_RESULT_KEYS: dict[str, tuple[str, str | None, str | None]] = {
    "save": ("n_saved", "n_written", "save_ms"),        # timings.save_ms
    "restore": ("n_restored", "n_read", "restore_ms"),  # timings.restore_ms
    "erase": ("n_erased", None, None),
}
PROPS_PATH = "/props"
SLOTS_PATH = "/slots"
TOKENIZE_PATH = "/tokenize"      # {"content": str} -> {"tokens": [int]}
DETOKENIZE_PATH = "/detokenize"  # {"tokens": [int]} -> {"content": str}
# /props keys: slots of the running server (= --parallel), the GGUF it loaded, its build
PROPS_SLOTS = "total_slots"
PROPS_MODEL_PATH = "model_path"
PROPS_BUILD = "build_info"  # e.g. "b1-0c1e570"; slot files do not carry across builds
# /slots entries: per-slot context (CTX / --parallel); the prompt tokens a slot holds, listed
# only once the slot has served a request (absent after a restore into an unused slot)
SLOT_N_CTX = "n_ctx"
PROPS_SLOT_CTX = ("default_generation_settings", "n_ctx")  # /props: one slot's context
SLOT_PROMPT_TOKENS = "n_prompt_tokens"

FLASH_ATTN_FLAGS = ("-fa", "--flash-attn")
FLASH_ATTN_DEFAULT = "auto"
CACHE_RAM_DEFAULT_MIB = 8192  # --cache-ram: an in-RAM prompt cache that can fake a restore
# every failed save/restore answers HTTP 400 with this text; the reason is only in the log
GENERIC_SLOT_ERROR = "No available space in KV cache or invalid slot save file"
# log lines look like "0.14.119.644 E llama_state_seq_load_file: error ...: n_stream mismatch"
_LOG_ERROR = re.compile(r"^\s*[\d.]+\s+E\s+(.+)$")


def check_plan_flags(plan: EnginePlan, accepted: frozenset[str]) -> None:
    """Refuse a plan that passes a long flag this binary's --help does not list, naming it."""
    missing = [f.name for f in plan.flags if f.name.startswith("--") and f.name not in accepted]
    if missing:
        raise EngineError(
            f"this llama-server does not accept {', '.join(missing)} (flags change between "
            "llama.cpp versions); use a build from 2026-10 or later, or kvlab engines install"
        )


def flash_attn_mode(plan: EnginePlan) -> str:
    """The flash-attention mode a plan runs with: -fa/--flash-attn in its args, else auto."""
    args = [*(a for f in plan.flags for a in f.render()), *plan.extra_args]
    for i, arg in enumerate(args):
        if arg in FLASH_ATTN_FLAGS and i + 1 < len(args):
            return args[i + 1]
        for flag in FLASH_ATTN_FLAGS:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return FLASH_ATTN_DEFAULT


def kv_types(plan: EnginePlan) -> tuple[str, str]:
    """(K type, V type) of a plan; extra args given after `--` win, as on the command line."""
    k = plan.flag_value("--cache-type-k") or "f16"
    v = plan.flag_value("--cache-type-v") or "f16"
    args = list(plan.extra_args)
    for i, arg in enumerate(args[:-1]):
        if arg in ("-ctk", "--cache-type-k"):
            k = args[i + 1]
        elif arg in ("-ctv", "--cache-type-v"):
            v = args[i + 1]
    return k, v


def kv_label(kv_type_k: str, kv_type_v: str | None = None) -> KvType:
    """Record fields that say whether a run's KV cache was quantised (outputs then change)."""
    v = kv_type_v or kv_type_k
    quantised = kv_type_k in QUANTISED_KV_TYPES or v in QUANTISED_KV_TYPES
    return KvType(kv_cache_type=kv_type_k if kv_type_k == v else f"K {kv_type_k} / V {v}",
                  kv_quantised=quantised,
                  kv_note="quantised KV rounds the stored keys and values, so outputs change: "
                          "do not pair this run with an f16 one" if quantised else None)


def slot_failure_reason(log_text: str) -> str | None:
    """The most specific error llama-server logged (the HTTP answer only says 400)."""
    errors = [m.group(1).strip() for ln in log_text.splitlines() if (m := _LOG_ERROR.match(ln))]
    specific = [e for e in errors if GENERIC_SLOT_ERROR not in e and "send_error" not in e]
    if specific:
        return specific[-1]
    return errors[-1] if errors else None


# the startup log's slot line: "n_slots = 2, n_ctx_slot = 4096" (per-slot context)
STARTUP_SLOTS_LINE = re.compile(r"n_slots = (\d+), n_ctx_slot = (\d+)")
# the KV cache as allocated, logged at DEBUG_VERBOSITY only:
# "llama_kv_cache: size =    8.00 MiB (  4096 cells,   4 layers,  1/1 seqs), K (f16): ..."
# (cells are per stream: one stream per slot, or one for all with --kv-unified, as "2/1 seqs")
STARTUP_KV_SIZE_LINE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,[^,]*,\s*\d+/(\d+) seqs")
# the in-RAM prompt cache (`--cache-ram`), logged only at DEBUG_VERBOSITY: it is exclusive of
# the slots (a slot's prompt is saved there when another conversation takes the slot, and a
# saved prompt moves back into a slot when a request matches it better than the slot does)
DEBUG_VERBOSITY = 4
RAM_CACHE_STATE = re.compile(r"cache state: (\d+) prompts, ([\d.]+) MiB \(limits: ([\d.]+) MiB")
RAM_CACHE_SAVE = re.compile(r"prompt_save:\s+- saving prompt with length\s+(\d+)")
RAM_CACHE_LOAD = re.compile(r"load:\s+- found better prompt")
RAM_CACHE_OFF = "prompt cache is disabled"
SLOT_FILE_MAGIC = b"qsgg"  # a slot file's first 4 bytes (LLAMA_STATE_SEQ_MAGIC, little-endian)
APPLY_TEMPLATE_PATH = "/apply-template"  # {"messages": [...]} -> {"prompt": templated text}
PROPS_FTYPE = "model_ftype"  # /props: the weights' type, e.g. "F16", "Q8_0"

# read from a running server's command line (`kvlab check`): /props names neither its KV type
# nor its rope settings
SERVER_BINARY = "llama-server"
# short spellings of the flags kvlab compares, as their long ones (common/arg.cpp)
FLAG_ALIASES = {"-c": "--ctx-size", "-np": "--parallel", "-ctk": "--cache-type-k",
                "-ctv": "--cache-type-v", "-fa": "--flash-attn", "-m": "--model",
                "-ngl": "--n-gpu-layers", "-t": "--threads", "-b": "--batch-size",
                "-ub": "--ubatch-size", "-a": "--alias", "-kvu": "--kv-unified",
                "-no-kvu": "--no-kv-unified", "-cram": "--cache-ram"}
# where two compared servers may differ: where they listen and the tiers kvlab varies
VARIABLE_ARGS = frozenset({"host", "port", "slot_save_path", "cache_ram"})
CACHE_TYPE_K_FLAGS = ("-ctk", "--cache-type-k")
NO_CACHE_PROMPT_FLAG = "--no-cache-prompt"
CACHE_TYPE_V_FLAGS = ("-ctv", "--cache-type-v")
NUMERICS_FLAGS = (("--rope-scaling",), ("--rope-scale",), ("--rope-freq-base",),
                  ("--rope-freq-scale",), ("--yarn-orig-ctx",), ("--yarn-ext-factor",),
                  FLASH_ATTN_FLAGS)


def tokenize_text_body(text: str) -> dict[str, object]:
    """/tokenize of plain text without the BOS token ("add_special" defaults to false)."""
    return {"content": text, "add_special": False}


def detokenize_body(tokens: list[int]) -> dict[str, object]:
    """/detokenize of token ids: {"content": text} back."""
    return {"tokens": tokens}


# a request longer than a slot's context answers 400 "the request exceeds the available context
# size, try increasing it" (type exceed_context_size_error)
PROMPT_TOO_LONG = ("exceeds the available context size",)
