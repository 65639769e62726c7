"""The connector table: every name has one entry, and what the plans, the proxy and the checks
ask of a connector comes from it."""

from __future__ import annotations

from typing import get_args

import pytest

from kvlab.core import SettingError, connectors


def test_every_name_has_exactly_one_entry() -> None:
    assert get_args(connectors.ConnectorName) == connectors.NAMES
    assert tuple(connectors.CONNECTORS) == (*connectors.NAMES, *connectors.STORE_ONLY)
    assert connectors.DEFAULT in connectors.NAMES


def test_an_unknown_name_is_refused_naming_the_choices() -> None:
    with pytest.raises(SettingError, match=r"CONNECTOR='p2pnccl' .* shared, nixl, mooncake"):
        connectors.get("p2pnccl")
    assert connectors.known("p2pnccl") is None and connectors.known(connectors.NONE) is None


def test_the_store_path_goes_only_where_the_connector_has_a_store() -> None:
    shared = connectors.SHARED.kv_transfer_config(connectors.PRODUCER, "/s")
    assert shared == {"kv_connector": "ExampleConnector", "kv_role": "kv_producer",
                      "kv_connector_extra_config": {"shared_storage_path": "/s"}}
    nixl = connectors.NIXL.kv_transfer_config(connectors.CONSUMER, "/s")
    assert nixl == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


@pytest.mark.parametrize("name", connectors.NAMES)
def test_a_class_read_back_from_a_command_line_is_the_labs_name(name: str) -> None:
    assert connectors.by_class(connectors.get(name).vllm_class) == name
    assert connectors.by_class(None) == connectors.NONE
    assert connectors.by_class("P2pNcclConnector") == "P2pNcclConnector"


def test_only_the_example_connector_is_the_whole_prompt_store() -> None:
    assert [n for n in connectors.NAMES if connectors.is_shared_store(n)] == ["shared"]
    assert connectors.get("lmcache").prefix_match


def test_roles_say_who_writes_and_who_reads() -> None:
    assert connectors.pair_role("prefill") == connectors.PRODUCER
    assert connectors.writes(connectors.PRODUCER) and not connectors.reads(connectors.PRODUCER)
    assert connectors.reads(connectors.CONSUMER) and not connectors.writes(connectors.CONSUMER)
    assert connectors.writes(connectors.BOTH) and connectors.reads(connectors.BOTH)
    assert not connectors.writes(None)


def test_the_transport_is_said_only_for_nixl() -> None:
    assert connectors.NIXL.transport({"UCX_TLS": "tcp"}) == "UCX_TLS=tcp"
    assert "unset" in (connectors.NIXL.transport({}) or "")
    assert connectors.SHARED.transport({"UCX_TLS": "tcp"}) is None


def test_the_host_tier_backends() -> None:
    native = connectors.offload_config(1.5, "native")
    assert native["kv_connector"] == "OffloadingConnector"
    assert native["kv_connector_extra_config"] == {"cpu_bytes_to_use": int(1.5 * 2**30)}
    # LMCache: vLLM's connector to a server whose memory is the tier (the size is the
    # server's: vLLM passes none), pointed at it where kvlab started one
    lm = connectors.offload_config(1.5, "lmcache", {"lmcache.mp.port": 7001})
    assert lm == {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                  "kv_connector_extra_config": {"lmcache.mp.port": 7001}}


def test_the_tier_words_name_their_backend_and_who_holds_it() -> None:
    words = connectors.tier_words(1.0, "lmcache")
    assert words == "host memory 1 GiB, backend lmcache"
    assert connectors.tier_backend(words) == "lmcache" and connectors.tier_by_server(words)
    assert connectors.backend_title(words) == "LMCache"
    native = connectors.tier_words(8, "native")
    assert connectors.tier_backend(native) == "native" and not connectors.tier_by_server(native)
    assert connectors.backend_title(native) == "vLLM's own host tier"
    for none in (None, "", "none: device memory only", "host memory 1 GiB, backend other"):
        assert connectors.tier_backend(none) is None and connectors.backend_title(none) is None
    assert connectors.LMCACHE.called == "LMCache" and connectors.SHARED.called == "ExampleConnector"


def test_the_tier_words_say_how_the_tier_finds_a_prefix() -> None:
    # LMCache's in 256-token chunks from the first token (the oracle models them so)
    assert connectors.tier_chunk_tokens(connectors.tier_words(1.0, "lmcache")) == 256
    for blocks in (connectors.tier_words(8, "native"), None, "none: device memory only"):
        assert connectors.tier_chunk_tokens(blocks) == 0


def test_the_fs_tier_is_vllms_offloading_connector_with_a_secondary_fs_tier() -> None:
    fs = connectors.CONNECTORS["fs"]
    assert fs.needs_store and fs.prefix_match and fs.store_bytes and fs.store_files == "*.bin"
    assert fs.hash_seed == "0"  # block file names are hashes seeded per process otherwise
    assert "fs" not in connectors.NAMES  # a store and a tier, not the split's CONNECTOR
    config = fs.kv_transfer_config(connectors.BOTH, "/store", host_bytes=3 * 2**30)
    assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {
                          "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 3 * 2**30,
                          "secondary_tiers": [{"type": "fs", "root_dir": "/store"}]}}
    with pytest.raises(SettingError, match="KV_OFFLOAD_GB"):  # its CPU tier is required
        fs.kv_transfer_config(connectors.BOTH, "/store")
    # read back from a command line: the class alone is the host tier, with an fs tier it is fs
    assert connectors.by_class("OffloadingConnector") == "OffloadingConnector"
    assert connectors.by_class("OffloadingConnector", "fs") == "fs"
    assert connectors.SHARED.store_files == "*.safetensors"


def test_the_host_tier_with_a_disk_tier_under_it() -> None:
    disk = connectors.offload_config(2, "native", disk_path="/d")
    assert disk["kv_connector_extra_config"] == {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 2 * 2**30,
        "secondary_tiers": [{"type": "fs", "root_dir": "/d"}]}
