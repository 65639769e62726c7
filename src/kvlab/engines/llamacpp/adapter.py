"""llama.cpp's llama-server as kvlab's `Engine`: evidence tables, slot capacity, identity.

Answers come from `facts.py` (endpoints, /props keys, metric names) and the running server;
for a server on this machine, also from its command line (KV types, rope and flash-attention
flags, which /props does not name) and its GGUF's content (`engines/local.py`).
llama-server reuses a prompt prefix token by token, so its block size is 1.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import httpx

from kvlab.core import EngineError, dig, integer, integers, text
from kvlab.engines import gguf_make, install, local
from kvlab.engines.argv import argv_args, flag_value, int_value, launch_settings_from
from kvlab.engines.base import (
    PROBE_MESSAGES,
    CacheShape,
    CounterTable,
    DeviceRules,
    GaugeTable,
    Install,
    InstanceFacts,
    LaunchSettings,
    RamShape,
    TwoEndpointProof,
)
from kvlab.engines.http import get_json, post_json, post_strict, post_tokens
from kvlab.engines.llamacpp import facts, model_gguf
from kvlab.engines.llamacpp.prove import slot_store_proof
from kvlab.engines.llamacpp.selection import LlamaInstall, find_install
from kvlab.engines.plan import PlanRequest
from kvlab.records import EngineArgs, KvCapacity

if TYPE_CHECKING:
    from kvlab.core import Say, Settings
    from kvlab.engines.plan import EnginePlan
    from kvlab.observe import Snapshot

ROLE = "llama"  # `kvlab serve llama`: the seed's `llama-cache-tiers.sh serve`
NO_GGUF = ("no GGUF for llama-server: set LLAMA_MODEL to one (`LLAMA_MODEL=/path/model.gguf "
           "kvlab run all`; `kvlab models tiny` makes a tiny random-weight one), or MODEL to "
           "a Qwen3 directory kvlab makes one from")
PLAN_FIELDS = frozenset({"model", "port", "extra_args", "store_path", "slots", "kv_cache_type",
                         "host_cache_mib", "prefix_caching", "log_cache_state"})



LLAMA_CPP = facts.LLAMA_CPP


def make_from_model(settings: Settings, say: Say) -> Path | None:
    """The GGUF made from MODEL, said, where LLAMA_MODEL is unset and MODEL can be made into
    one (None: it cannot; `missing` says why); made once, kept by MODEL's content."""
    made = model_gguf.from_model(settings)
    if not isinstance(made, model_gguf.FromModel):
        return None
    if made.target.is_file():
        return made.target
    say(f"llama.cpp: making {made.words()}")
    started = time.monotonic()
    gguf_make.from_hf(made.source, made.target)
    say(f"llama.cpp: the GGUF made in {time.monotonic() - started:.0f} s "
        f"({made.target.stat().st_size / 2**30:.1f} GiB)")
    return made.target


class LlamaCppEngine:
    name = LLAMA_CPP
    aliases: tuple[str, ...] = facts.ALIASES
    roles: tuple[str, ...] = (ROLE,)
    titles: Mapping[str, str] = MappingProxyType({ROLE: "llama-server with its cache tiers"})
    plan_fields = PLAN_FIELDS
    metric_namespace = "llamacpp"
    counters = facts.EVIDENCE_COUNTERS
    gauges = facts.EVIDENCE_GAUGES
    api_key_env = facts.API_KEY_ENV
    address_env: tuple[str, ...] = ()
    variable_args = facts.VARIABLE_ARGS

    def __init__(self) -> None:
        self.transfer_counters: CounterTable = {}  # llama-server moves no KV between instances
        self.tier_gauges: GaugeTable = {}  # its RAM cache's state is in its log, not /metrics
        # two llama-servers share KV only through a slot file moved between them
        self.two_endpoint_proof: TwoEndpointProof | None = slot_store_proof

    def install(self, settings: Settings) -> Install:
        return find_install(settings)

    def prepare(self, settings: Settings, say: Say) -> None:
        """Without LLAMA_MODEL, the GGUF made from MODEL (once: kept by its content); then
        llama-server built from the pinned tree for this machine's device, where none is on
        LLAMA_BIN or PATH."""
        if not settings.llama_model:
            make_from_model(settings, say)
        if facts.find_llama_server(settings) is not None or settings.llama_bin:
            return
        target = facts.build_target(settings)
        if target.missing:
            say(f"llama-server: {target.missing}; its rows are recorded as not run")
            return
        try:
            install.build_llama_server(settings.home(), say, target=target)
        except EngineError as exc:
            raise EngineError(f"building llama-server for {target.describe()} failed: {exc}; "
                              "or set LLAMA_BIN to a llama-server built for this machine") \
                from exc

    short = "llama"

    def build(self, settings: Settings, say: Say, asked: bool) -> Path | None:
        """llama-server for this machine's device, never the wrong one's."""
        return install.build_llama_server(settings.home(), say,
                                          target=facts.build_target(settings))

    def missing(self, settings: Settings) -> str | None:
        if settings.llama_model:
            return None
        made = model_gguf.from_model(settings)
        return None if isinstance(made, model_gguf.FromModel) else f"{NO_GGUF}; and {made}"

    def device_rules(self, settings: Settings) -> DeviceRules | None:
        return None  # it sizes its own cache

    def memory_failure(self, log_text: str) -> str | None:
        return None  # no planned cache to retry with

    def plan(self, settings: Settings, role: str, install: Install,
             request: PlanRequest | None = None) -> EnginePlan:
        r = request or PlanRequest()
        binary = install.program if isinstance(install, LlamaInstall) else None
        opts = facts.LlamaOptions(
            model=r.model, port=r.port, parallel=r.slots, cache_type=r.kv_cache_type,
            slot_save_path=r.store_path, extra_args=r.extra_args, role=role,
            cache_ram_mib=r.host_cache_mib, cache_prompt=r.prefix_caching,
            log_verbosity=facts.DEBUG_VERBOSITY if r.log_cache_state else None)
        return facts.plan(settings, binary or facts.SERVER_BINARY, opts)

    def resettable(self, plan: EnginePlan) -> bool:
        """An erase empties its slots; prompts moved to the RAM cache earlier would stay."""
        return plan.flag_value("--cache-ram") == "0"

    def poolable(self, plan: EnginePlan) -> EnginePlan:
        return plan

    async def cached_probe(self, client: httpx.AsyncClient, plan: EnginePlan,
                           prompt: str) -> tuple[int, int]:
        body = {"prompt": prompt, "n_predict": 1, "cache_prompt": True, "temperature": 0}
        timings = dig(await post_strict(client, "/completion", body), "timings")
        cached = integer(dig(timings, "cache_n")) or 0
        return (integer(dig(timings, "prompt_n")) or 0) + cached, cached

    async def reset_cache(self, client: httpx.AsyncClient, plan: EnginePlan) -> str:
        slots = (await client.get(facts.SLOTS_PATH)).raise_for_status().json()
        ids = [int(s["id"]) for s in slots if isinstance(s, dict) and "id" in s]
        for slot in ids:
            (await client.post(facts.slot_url(plan.base_url, slot, "erase"))).raise_for_status()
        return f"POST /slots/ID?action=erase, each of {len(ids)} slot(s)"

    async def tokenize_chat(self, client: httpx.AsyncClient, root: str, model: str,
                            messages: list[dict[str, str]]) -> list[int] | None:
        return await tokenize_chat(client, root, messages)

    async def cache_shape(self, client: httpx.AsyncClient, root: str,
                          snap: Snapshot | None) -> CacheShape | None:
        props = await get_json(client, root + facts.PROPS_PATH)
        slots = integer(dig(props, facts.PROPS_SLOTS))
        if not slots:
            return None
        argv = local.listening_argv(root)
        if argv is None:
            return CacheShape("slots", "the server's /props (total_slots)", slots=slots,
                              ram_unknown="its command line could not be read here (not a "
                              "local process), so its --cache-ram is not known")
        per_slot = integer(dig(props, *facts.PROPS_SLOT_CTX))
        return CacheShape("slots", "the server's /props (total_slots) and command line "
                          "(--cache-ram, --kv-unified, --cache-idle-slots)", slots=slots,
                          ram=ram_shape(argv, slots, per_slot or 0,
                                        text(dig(props, facts.PROPS_MODEL_PATH))))

    def capacity(self, plan: EnginePlan, log_text: str) -> KvCapacity:
        m = facts.STARTUP_SLOTS_LINE.search(log_text)
        if m is None:
            return KvCapacity()
        slots, per_slot = int(m.group(1)), int(m.group(2))
        found = KvCapacity(slots=slots, tokens_per_slot=per_slot,
                           kv_cache_tokens=slots * per_slot, lines=[m.group(0)])
        size = facts.STARTUP_KV_SIZE_LINE.search(log_text)
        if size is not None:  # the cells allocated (per stream), and their bytes
            found.kv_cache_bytes = round(float(size.group(1)) * 2**20)
            found.kv_cache_tokens = int(size.group(2)) * int(size.group(3))
            found.lines.append(size.group(0))
        return found

    def launch_settings(self, argv: list[str]) -> LaunchSettings:
        return launch_settings_from(argv, facts.CONTEXT_FLAGS, None,  # no memory fraction
                                    slot_flags=facts.PARALLEL_FLAGS)

    def effective_args(self, log_text: str | None, argv: list[str] | None) -> EngineArgs | None:
        # llama-server logs no summary of its arguments: its argv is the statement
        if not argv or Path(argv[0]).name != facts.SERVER_BINARY:
            return None
        return EngineArgs(values=argv_args(argv[1:], facts.FLAG_ALIASES),
                          source="command line", detail="llama-server's argv")

    def unread_content(self, root: str) -> dict[tuple[str, str], str]:
        return {}  # the GGUF holds all it reads

    def connector_of(self, args: EngineArgs) -> tuple[str, str | None]:
        return "none", None  # two llama-servers share KV only through slot files

    def block_size(self, platform: str) -> int:
        return 1

    async def version(self, client: httpx.AsyncClient, root: str) -> str | None:
        props = await get_json(client, root + facts.PROPS_PATH)
        return str(props.get(facts.PROPS_BUILD, "unknown")) if props else None

    def version_note(self, version: str) -> str | None:
        return facts.version_note(version)

    async def describe(self, client: httpx.AsyncClient, root: str, facts_out: InstanceFacts,
                       snap: Snapshot | None) -> bool:
        out = facts_out
        props = await get_json(client, root + facts.PROPS_PATH)
        if not props:
            return False
        out.engine = LLAMA_CPP
        out.version = str(props.get(facts.PROPS_BUILD, "unknown"))
        out.root = str(props.get(facts.PROPS_MODEL_PATH, out.root))
        slot_ctx = integer(dig(props, "default_generation_settings", facts.SLOT_N_CTX))
        out.max_model_len = slot_ctx or out.max_model_len
        out.block_size = 1
        out.prefix_caching = True
        out.dtype = str(props[facts.PROPS_FTYPE]) if props.get(facts.PROPS_FTYPE) else None
        out.template_tokens = await _template_tokens(client, root)
        out.content_digest = local.content_digest(out.root)
        argv = local.listening_argv(root, out.notes)
        if argv and Path(argv[0]).name == facts.SERVER_BINARY:
            argv_facts(argv, out)
        return True

    def cache_size(self, snap: Snapshot) -> int | None:
        return None  # /metrics names no cache size; /slots gives each slot's n_ctx

    async def tokenize(self, client: httpx.AsyncClient, root: str, text: str) -> list[int] | None:
        return await post_tokens(client, root + facts.TOKENIZE_PATH,
                                 facts.tokenize_text_body(text))

    async def detokenize(self, client: httpx.AsyncClient, root: str, model: str,
                         tokens: list[int]) -> str | None:
        body = await post_json(client, root + facts.DETOKENIZE_PATH,
                               facts.detokenize_body(tokens))
        return text(dig(body, "content"))


def argv_facts(argv: list[str], out: InstanceFacts) -> None:
    """What a llama-server's command line says about its KV types and numerics flags."""
    k = flag_value(argv, *facts.CACHE_TYPE_K_FLAGS) or "f16"
    v = flag_value(argv, *facts.CACHE_TYPE_V_FLAGS) or "f16"
    out.cache_dtype = k if k == v else f"K {k} / V {v}"
    numerics = [f"{names[-1]} {value}" for names in facts.NUMERICS_FLAGS
                if (value := flag_value(argv, *names))]
    out.numerics_flags = "; ".join(numerics) or "defaults"
    if facts.NO_CACHE_PROMPT_FLAG in argv:  # /props does not say whether prompts are cached
        out.prefix_caching = False
    out.connector = "none"
    out.notes.append("KV types, numerics flags and prompt caching read from the command line "
                     "of the process listening on this port")


async def _template_tokens(client: httpx.AsyncClient, root: str) -> list[int] | None:
    return await tokenize_chat(client, root, PROBE_MESSAGES)


async def tokenize_chat(client: httpx.AsyncClient, root: str,
                        messages: list[dict[str, str]]) -> list[int] | None:
    """A chat request's tokens as this server counts them (its template applied through
    /apply-template, then /tokenize with special tokens parsed), or None."""
    template = await post_json(client, root + facts.APPLY_TEMPLATE_PATH, {"messages": messages})
    prompt = text(dig(template, "prompt"))
    if prompt is None:
        return None
    tokens = await post_json(client, root + facts.TOKENIZE_PATH,
                             {"content": prompt, "parse_special": True})
    return integers(dig(tokens, "tokens"))


def ram_shape(argv: list[str], slots: int, per_slot_ctx: int,
              model_path: str | None = None) -> RamShape | None:
    """The RAM prompt cache a llama-server's command line sets (None: `--cache-ram 0`), by
    its defaults where a flag is absent (`facts.CACHE_RAM_DEFAULT_MIB`, idle slots saved, a
    unified KV cache only when --parallel is not given); the model file from the command
    line, else /props's `model_path`."""
    args = argv_args(argv[1:], facts.FLAG_ALIASES)
    mib = int_value(args.get("cache_ram"))
    if mib is None:
        mib = facts.CACHE_RAM_DEFAULT_MIB
    if mib == 0:
        return None
    unified = args.get("kv_unified", "True" if "parallel" not in args else "False") == "True"
    return RamShape(
        limit_bytes=max(0, mib) * 2**20,
        limit_tokens=per_slot_ctx if unified else per_slot_ctx * slots,
        save_idle=args.get("cache_idle_slots", "True") == "True", unified=unified,
        model_file=args.get("model") or model_path,
        kv_types=(args.get("cache_type_k", "f16"), args.get("cache_type_v", "f16")))


async def slot_count(client: httpx.AsyncClient, root: str) -> int | None:
    """How many slots the server runs (/props total_slots), or None."""
    return integer(dig(await get_json(client, root + facts.PROPS_PATH), facts.PROPS_SLOTS))


LLAMA_CPP_ENGINE = LlamaCppEngine()
