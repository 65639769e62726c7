"""Slot manifests state the server's facts, read from the server (#35, finding 6): its log,
else its command line, else "unknown", which refuses nothing; and a tampered file is hashed
however its and its manifest's mtimes were set.

The log lines are llama-server 0c1e570's (default verbosity 3; the KV cache and flash-attention
lines appear at -lv 4)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvlab.core.errors import RefusedError
from kvlab.engines.llamacpp import slotfacts
from kvlab.engines.llamacpp.client import SlotOp
from kvlab.engines.llamacpp.slotfacts import UNKNOWN
from kvlab.engines.llamacpp.slotstore import Manifest, SlotStore
from slots import MAGIC, fake_model, identity

NP2 = ("0.00.290.040 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, "
       "kv_unified = 'false'\n")
NP2_KVU = NP2.replace("n_ctx_slot = 1024", "n_ctx_slot = 2048").replace("'false'", "'true'")
DEBUG = ("llama_kv_cache: size =    8.00 MiB (  4096 cells,   4 layers,  2/2 seqs), K (q8_0):"
         "    4.00 MiB, V (q8_0):    4.00 MiB\n"
         "sched_reserve: Flash Attention was auto, set to enabled\n")


def test_the_log_states_streams_types_and_the_resolved_flash_attention() -> None:
    assert slotfacts.from_log(NP2) == {"kv_unified": "false"}
    facts = slotfacts.read(NP2 + DEBUG, None, 2)
    assert (facts.kv_type_k, facts.kv_type_v, facts.flash_attn, facts.kv_unified,
            facts.n_stream) == ("q8_0", "q8_0", "on", "false", "2")
    assert slotfacts.read(NP2_KVU, None, 2).n_stream == "1"
    assert slotfacts.read(NP2, None, 2).kv_type_k == UNKNOWN  # not logged at verbosity 3
    assert facts.source == "read from its log"


def test_the_command_line_fixes_what_it_states_and_no_more() -> None:
    argv = ["llama-server", "-m", "m.gguf", "--parallel", "2", "-ctk", "q8_0"]
    assert slotfacts.from_argv(argv, 2) == {"kv_type_k": "q8_0", "kv_type_v": "f16",
                                            "kv_unified": "false", "n_stream": "2"}
    assert slotfacts.from_argv([*argv, "-kvu"], 2)["n_stream"] == "1"
    assert slotfacts.from_argv(["llama-server", "-m", "m.gguf"], 4)["n_stream"] == "1"
    assert "flash_attn" not in slotfacts.from_argv([*argv, "-fa", "auto"], 2)  # the build's
    assert slotfacts.from_argv([*argv, "--flash-attn", "on"], 2)["flash_attn"] == "on"
    both = slotfacts.read(NP2, argv, 2)
    assert both.kv_type_k == "q8_0" and both.source == "read from its log and its command line"
    nothing = slotfacts.read(None, None, 2)
    assert nothing.known() == {} and "nothing readable" in nothing.source


@pytest.fixture
def store(tmp_path: Path) -> SlotStore:
    found = SlotStore(tmp_path / "slots")
    found.ensure()
    return found


def save(store: SlotStore, model: Path, **facts: object) -> Manifest:
    (store.directory / "a.bin").write_bytes(MAGIC + b"kv" * 100)
    op = SlotOp("save", 0, "a.bin", 1200, 208, 1.5, 2.5)
    return store.record(op, identity(model, **facts), None)


def test_unknown_on_either_side_refuses_nothing(tmp_path: Path, store: SlotStore) -> None:
    model = fake_model(tmp_path)
    save(store, model, flash_attn=UNKNOWN, kv_type_k=UNKNOWN)
    store.check_restorable("a.bin", identity(model, flash_attn="on", kv_type_k="f16"))
    with pytest.raises(RefusedError, match=r"n_stream differs: the file was saved with "
                                           r"n_stream 2, this server has n_stream 1 \(read "):
        store.check_restorable("a.bin", identity(model, n_stream="1", kv_unified="true"))
    save(store, model)
    store.check_restorable("a.bin", identity(model, n_stream=UNKNOWN))


def test_a_schema_1_manifest_took_types_from_settings_and_is_not_refused_on_them(
        tmp_path: Path, store: SlotStore) -> None:
    model = fake_model(tmp_path)
    manifest = save(store, model)
    path = store.manifest_path("a.bin")
    raw = json.loads(path.read_text())
    for added in ("kv_unified", "n_stream", "file_inode", "file_ctime_ns", "schema"):
        raw.pop(added)
    raw |= {"kv_type_k": "q8_0", "flash_attn": "auto"}  # what settings said
    path.write_text(json.dumps(raw))
    old = store.read_manifest("a.bin")
    assert (old.kv_type_k, old.flash_attn, old.n_stream, old.file_inode) == \
        (UNKNOWN, UNKNOWN, UNKNOWN, 0)
    # an f16 server: no false alarm on the settings' q8_0; the file is hashed (no inode)
    assert store.check_restorable("a.bin", identity(model, kv_type_k="f16")).file_sha256 == \
        manifest.file_sha256


def test_flipped_bytes_are_found_whatever_the_mtimes_say(tmp_path: Path,
                                                          store: SlotStore) -> None:
    """The bypass: flip bytes (same size), set the file's mtime back to the saved one and the
    manifest's forward; the old shortcut (same mtime, ctime not after the manifest's mtime)
    took it for untouched."""
    model = fake_model(tmp_path)
    manifest = save(store, model)
    path = store.directory / "a.bin"
    path.write_bytes(MAGIC + b"xy" * 100)
    os.utime(path, ns=(manifest.file_mtime_ns, manifest.file_mtime_ns))
    later = path.stat().st_ctime_ns + 10**12
    os.utime(store.manifest_path("a.bin"), ns=(later, later))
    with pytest.raises(RefusedError, match="changed after kvlab saved it"):
        store.check_restorable("a.bin", identity(model))
