"""ExampleConnector's entry names (#46: its matching rule, checked on a store's own entries)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from kvlab.engines import store_for
from kvlab.engines.vllm.store import entry_name


def md5_of(ids: list[int]) -> str:
    return hashlib.md5(struct.pack(f"<{len(ids)}q", *ids), usedforsecurity=False).hexdigest()


def test_a_prompt_is_stored_under_its_whole_blocks_and_looks_for_one_token_less() -> None:
    prompt = list(range(1, 300))  # 299 tokens, 128-token blocks
    assert entry_name(prompt, 128, lookup=False) == md5_of(prompt[:256])
    assert entry_name(prompt, 128, lookup=True) == md5_of(prompt[:256])
    # the identical prompt finds its own entry, and so does one a token longer
    assert entry_name([*prompt, 7], 128, lookup=True) == entry_name(prompt, 128, lookup=False)
    # at a block boundary the lookup keeps a block less than the store wrote
    edge = list(range(1, 258))  # 257 tokens
    assert entry_name(edge, 128, lookup=False) == md5_of(edge[:256])
    assert entry_name(edge, 128, lookup=True) == md5_of(edge[:128])
    # a conversation that grew by a block never finds its first turn
    grown = prompt + list(range(1000, 1130))
    assert entry_name(grown, 128, lookup=True) != entry_name(prompt, 128, lookup=False)


def test_the_store_is_matched_on_its_own_entries(tmp_path: Path) -> None:
    store = store_for("shared")
    assert store is not None
    turn1, turn2 = list(range(1, 300)), list(range(1, 300)) + list(range(500, 700))
    entry = tmp_path / entry_name(turn1, 128, lookup=False)
    entry.mkdir()
    (entry / "model.layers.0.self_attn.attn.safetensors").write_bytes(b"")
    found = store.match(tmp_path, [turn1, turn2], 128)
    assert found.entries == [entry.name] and found.held(0) and found.found(0)
    assert not found.held(1) and not found.found(1)
    assert store.match(tmp_path / "absent", [turn1], 128).entries == []
