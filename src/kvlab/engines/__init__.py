"""Engines behind one adapter: `base` is the protocol (`Engine`, `Install`), `registry` the one
list of engines (vLLM, llama.cpp's llama-server, mlx-lm), one package per engine holds all its
knowledge; `plan` is the shared data shape, `process` runs any plan, `host` starts and always
stops a run's engines, `install` and `prepare` put them on a machine.

This module is the package's surface: other packages import engines' names from here; an
engine's own package is imported outside `engines/` only by a module named for that engine.
"""

from kvlab.engines import copyrate, install, local, startup
from kvlab.engines.base import (
    DISK_TIER,
    HOST_TIER,
    PROBE_MESSAGES,
    CacheShape,
    DeviceRules,
    Engine,
    Install,
    InstanceFacts,
    KvStore,
    LaunchSettings,
    RamShape,
    Room,
    StoreMatch,
    Support,
    TwoEndpointProof,
    token_digest,
)
from kvlab.engines.cleanup import clean
from kvlab.engines.host import (
    EngineHost,
    LocalHost,
    Running,
    Scope,
    death_cause,
    labels_for,
    record_ready,
)
from kvlab.engines.install import EngineStatus
from kvlab.engines.llamacpp.facts import LLAMA_CPP
from kvlab.engines.mlx.server import MLX_LM
from kvlab.engines.models import KNOWN_SHAPES, hf_config, make_tiny, prose, write_shaped_config
from kvlab.engines.plan import EnginePlan, Flag, PlanRequest, client_host
from kvlab.engines.ports import free_port, port_in_use
from kvlab.engines.prepare import (
    prepare_engines,
    prepare_for,
)
from kvlab.engines.private_dirs import make_private_dir
from kvlab.engines.process import DEFAULT_READY_TIMEOUT_S, EngineProcess, StartFailed
from kvlab.engines.process_groups import stop_group
from kvlab.engines.registry import (
    NAMES,
    all_engines,
    cache_server_title,
    canonical_name,
    engine_for,
    evidence_deltas,
    failure_meaning,
    install_of,
    known_engine,
    make_plan,
    refuse_missing_model,
    source_of,
    store_for,
    transfer_deltas,
)
from kvlab.engines.reuse import EnginePool
from kvlab.engines.roles import ENGINE_ROLES, TITLES, as_started, plan_for_role
from kvlab.engines.strays import claim as claim_dir
from kvlab.engines.strays import release as release_dir
from kvlab.engines.vllm.facts import VLLM
from kvlab.engines.vllm.lmcache import held_by as cache_server_held

__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "DISK_TIER",
    "ENGINE_ROLES",
    "HOST_TIER",
    "KNOWN_SHAPES",
    "LLAMA_CPP",
    "MLX_LM",
    "NAMES",
    "PROBE_MESSAGES",
    "TITLES",
    "VLLM",
    "CacheShape",
    "DeviceRules",
    "Engine",
    "EngineHost",
    "EnginePlan",
    "EnginePool",
    "EngineProcess",
    "EngineStatus",
    "Flag",
    "Install",
    "InstanceFacts",
    "KvStore",
    "LaunchSettings",
    "LocalHost",
    "PlanRequest",
    "RamShape",
    "Room",
    "Running",
    "Scope",
    "StartFailed",
    "StoreMatch",
    "Support",
    "TwoEndpointProof",
    "all_engines",
    "as_started",
    "cache_server_held",
    "cache_server_title",
    "canonical_name",
    "claim_dir",
    "clean",
    "client_host",
    "copyrate",
    "death_cause",
    "engine_for",
    "evidence_deltas",
    "failure_meaning",
    "free_port",
    "hf_config",
    "install",
    "install_of",
    "known_engine",
    "labels_for",
    "local",
    "make_plan",
    "make_private_dir",
    "make_tiny",
    "plan_for_role",
    "port_in_use",
    "prepare_engines",
    "prepare_for",
    "prose",
    "record_ready",
    "refuse_missing_model",
    "release_dir",
    "source_of",
    "startup",
    "stop_group",
    "store_for",
    "token_digest",
    "transfer_deltas",
    "write_shaped_config",
]
