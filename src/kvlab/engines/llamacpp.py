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

from kvlab.engines import install
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.errors import EngineError, RefusedError
from kvlab.settings import Settings

# /metrics names (counters are exported without a _total suffix on this server)
PROMPT_TOKENS = "llamacpp:prompt_tokens_total"
PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached_total"
PROMPT_SECONDS = "llamacpp:prompt_seconds_total"
TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"

QUANTISED_KV_TYPES = frozenset({"q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"})
SLOT_ACTIONS = ("save", "restore", "erase")
_BARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")

# the flags kvlab passes, each of which must appear in `llama-server --help`
REQUIRED_FLAGS = ("--model", "--alias", "--host", "--port", "--ctx-size", "--parallel",
                  "--n-gpu-layers", "--cache-prompt", "--cache-type-k", "--cache-type-v",
                  "--slot-save-path", "--metrics", "--slots")


def find_llama_server(settings: Settings) -> Path | None:
    """LLAMA_BIN/llama-server, else kvlab's build, else llama-server on PATH."""
    if settings.llama_bin:
        candidate = Path(settings.llama_bin).expanduser()
        candidate = candidate / "llama-server" if candidate.is_dir() else candidate
        return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None
    built = install.installed_llama_server(settings.home())
    if built is not None:
        return built
    found = shutil.which("llama-server")
    return Path(found) if found else None


def require_llama_server(settings: Settings) -> Path:
    binary = find_llama_server(settings)
    if binary is None:
        where = f"LLAMA_BIN ({settings.llama_bin})" if settings.llama_bin else "PATH"
        raise EngineError(
            f"llama-server is not in {where} and kvlab has not built it: run "
            "`kvlab engines install` or set LLAMA_BIN to the directory holding it"
        )
    return binary


def help_flags(binary: Path) -> frozenset[str]:
    """Every `--flag` the binary's --help lists."""
    run = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30,
                         check=False)
    return frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", run.stdout + run.stderr))


def check_flags(accepted: frozenset[str]) -> None:
    """Refuse a build that lacks a flag kvlab relies on, naming the flag."""
    missing = [f for f in REQUIRED_FLAGS if f not in accepted]
    if missing:
        raise EngineError(
            f"this llama-server does not accept {', '.join(missing)} (flags change between "
            "llama.cpp versions); use a build from 2026-10 or later, or kvlab engines install"
        )


def version(binary: Path) -> str:
    """The binary's version line, e.g. '0.5.0-dev (build 1, commit 0c1e570)'."""
    run = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30,
                         check=False)
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.startswith("version")]
    return lines[0].removeprefix("version:").strip() if lines else "unknown"


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


def plan(settings: Settings, binary: Path | str, opts: LlamaOptions | None = None) -> EnginePlan:
    """The seed's `llama-cache-tiers.sh serve` as a plan."""
    opts = opts or LlamaOptions()
    model = opts.model or settings.llama_model
    if not model:
        raise RefusedError("LLAMA_MODEL is not set in .env.")
    if not Path(model).is_file():
        raise RefusedError(f"LLAMA_MODEL ({model}) is not a file.")
    port = opts.port or settings.llama_port
    parallel = opts.parallel or settings.llama_parallel
    kv_type = opts.cache_type or settings.llama_cache_type
    slot_path = str(Path(opts.slot_save_path or settings.llama_slot_save_path).expanduser())
    flags = [
        Flag("--model", model), Flag("--alias", settings.served_name),
        Flag("--host", settings.serve_host), Flag("--port", str(port)),
        Flag("--ctx-size", str(settings.ctx)), Flag("--parallel", str(parallel)),
        Flag("--n-gpu-layers", "999"), Flag("--cache-prompt"),
        Flag("--cache-type-k", kv_type), Flag("--cache-type-v", kv_type),
        Flag("--slot-save-path", slot_path), Flag("--metrics"), Flag("--slots"),
    ]
    if opts.cache_ram_mib is not None:
        flags.append(Flag("--cache-ram", str(opts.cache_ram_mib)))
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
        engine="llama.cpp", role=opts.role, command=(str(binary),), flags=tuple(flags),
        extra_args=opts.extra_args, host=settings.serve_host, port=port, health_path="/health",
        private_dirs=(slot_path,), summary=summary, notes=tuple(notes), label_hint=opts.role,
        model=model, served_name=settings.served_name,
    )


def check_slot_filename(name: str) -> str:
    """A slot file name must be a bare name inside the slot directory (no path traversal)."""
    if not _BARE_NAME.match(name) or ".." in name:
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
