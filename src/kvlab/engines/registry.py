"""Which engine is which: the adapters by name, the engine a /metrics scrape is from, a plan
for a role, and the store a connector keeps on disk.

The only module that imports the engine packages' adapters, so `base.py` (the protocol the
adapters implement) imports none. A new engine is its package and one line in `ENGINES`.
"""

from __future__ import annotations

from pathlib import Path

from kvlab.core import RefusedError, SettingError, Settings, connectors
from kvlab.engines.base import Engine, Install, KvStore
from kvlab.engines.llamacpp import facts as llamacpp_facts
from kvlab.engines.llamacpp.adapter import LLAMA_CPP_ENGINE
from kvlab.engines.mlx.adapter import MLX_ENGINE
from kvlab.engines.plan import EnginePlan, PlanRequest
from kvlab.engines.vllm import facts as vllm_facts
from kvlab.engines.vllm import lmcache
from kvlab.engines.vllm.adapter import VLLM_ENGINE
from kvlab.engines.vllm.store import EXAMPLE_STORE
from kvlab.observe import Snapshot, metrics
from kvlab.records import Deltas

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM_ENGINE, LLAMA_CPP_ENGINE, MLX_ENGINE)}
NAMES = tuple(ENGINES)


def canonical_name(name: str) -> str:
    """The one spelling of an engine name given in any accepted spelling."""
    return next((e.name for e in ENGINES.values() if name in e.aliases), name)


def engine_for(name: str) -> Engine:
    """The adapter for an engine name as plans and records spell it."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; kvlab knows {', '.join(NAMES)}") from None


def known_engine(name: str) -> Engine | None:
    """The adapter for `name`, or None for a process that is no engine (kvlab's own proxy)."""
    return engine_for(name) if name in NAMES else None


CACHE_SERVER_TITLES = {lmcache.ENGINE: "LMCache server"}
"""The processes kvlab starts beside an engine to hold its KV (a plan's companion), each in a
reader's words: they write startup lines but are no engine."""


def cache_server_title(name: str) -> str | None:
    """`name`'s words if it names a cache server kvlab starts beside an engine, else None."""
    return CACHE_SERVER_TITLES.get(name)


def all_engines() -> list[Engine]:
    return [engine_for(name) for name in NAMES]


def install_of(settings: Settings, name: str) -> Install:
    """The build of engine `name` this machine runs, or why there is none."""
    return engine_for(name).install(settings)


def make_plan(settings: Settings, name: str, role: str, install: Install | None = None,
         request: PlanRequest | None = None) -> EnginePlan:
    """Engine `name`'s plan for `role`; RefusedError for a role it does not play or a request
    field it does not honour (the request would be silently ignored otherwise)."""
    engine = engine_for(name)
    if role not in engine.roles:
        raise RefusedError(f"{name} plays no role {role!r}; it plays {', '.join(engine.roles)}")
    unused = sorted((request or PlanRequest()).set_fields() - engine.plan_fields)
    if unused:
        raise RefusedError(f"{name} has no equivalent of {', '.join(unused)} in its plans")
    return engine.plan(settings, role, install or engine.install(settings), request)


PATH_LIKE = ("/", "~", "./", "../")  # a model given so is a path: a Hub id never starts so
MODEL_KEYS = ("model", "small_model", "llama_model")  # the settings a plan's model comes from


def refuse_missing_model(settings: Settings, plan: EnginePlan) -> None:
    """SettingError when the plan's model is a path that does not exist on this machine: the
    engine would take it for a Hub id and fail offline, long after the plan said nothing."""
    path = Path(plan.model).expanduser()
    if not plan.model.startswith(PATH_LIKE) or path.exists():
        return
    if path.is_relative_to(settings.home()):  # kvlab's own models, made before a start
        return
    key = next((k.upper() for k in MODEL_KEYS if getattr(settings, k) == plan.model), "MODEL")
    raise SettingError(f"{key}={plan.model}: no such file or directory on this machine; set "
                       f"{key} to an existing model directory (or GGUF file) or to a Hugging "
                       "Face id such as Qwen/Qwen3-8B")


def engine_of_role(role: str) -> Engine:
    """The engine that plays `role` (`kvlab serve ROLE`)."""
    found = next((e for e in all_engines() if role in e.roles), None)
    if found is None:
        raise RefusedError(f"no engine plays the role {role!r}")
    return found


def store_for(connector: str | None) -> KvStore | None:
    """The on-disk store a connector keeps, where it keeps one (vLLM's ExampleConnector
    directory for the shared connector; None for the others, vLLM's fs tier's block files
    included, and for none)."""
    return EXAMPLE_STORE if connectors.is_shared_store(connector) else None


def source_of(snap: Snapshot | None) -> Engine | None:
    """The engine whose namespace a /metrics scrape uses (None: no engine kvlab knows)."""
    if snap is None:
        return None
    prefixes = snap.namespaces
    return next((e for e in all_engines()
                 if e.metric_namespace and e.metric_namespace in prefixes), None)


def evidence_deltas(before: Snapshot | None, after: Snapshot | None) -> Deltas:
    """The reuse counters' increases between two scrapes of one engine, by the evidence keys
    its adapter names (empty when either scrape is missing or no engine kvlab knows)."""
    return metrics.evidence_deltas(before, after, source_of(after))


def transfer_deltas(before: Snapshot | None, after: Snapshot | None) -> dict[str, float]:
    """KV moved between instances over two scrapes (NIXL's counters), by evidence key."""
    return metrics.transfer_deltas(before, after, source_of(after))


def failure_meaning(detail: str) -> str | None:
    """What an engine's error answer to a request means, in a few words, where its wording is
    one kvlab knows (None: say the engine's own words)."""
    if any(p in detail for p in (*vllm_facts.PROMPT_TOO_LONG, *llamacpp_facts.PROMPT_TOO_LONG)):
        return "the prompt exceeds the context"
    return None
