"""The slot store without a server: manifests, refusals naming the field, privacy, clean."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvlab.core.errors import InputError, RefusedError
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import SlotOp
from kvlab.engines.llamacpp.slotfiles import file_sha256
from kvlab.engines.llamacpp.slotmanifest import Manifest
from kvlab.engines.llamacpp.slotstore import SlotStore
from slots import MAGIC, fake_model, identity


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return fake_model(tmp_path)


@pytest.fixture
def saved(tmp_path: Path, model: Path) -> tuple[SlotStore, Manifest]:
    """A store holding a.bin (as the server would write it) recorded by kvlab."""
    store = SlotStore(tmp_path / "slots")
    store.ensure()
    (store.directory / "a.bin").write_bytes(MAGIC + b"kv" * 100)
    (store.directory / "a.bin").chmod(0o644)  # the server's umask
    op = SlotOp("save", 0, "a.bin", 1200, 208, 1.5, 2.5)
    return store, store.record(op, identity(model), None)


def test_record_makes_file_and_manifest_private(saved: tuple[SlotStore, Manifest]) -> None:
    store, manifest = saved
    assert store.directory.stat().st_mode & 0o777 == 0o700
    assert (store.directory / "a.bin").stat().st_mode & 0o777 == 0o600
    mpath = store.manifest_path("a.bin")
    assert mpath.name == "a.bin.kvlab.json" and mpath.stat().st_mode & 0o777 == 0o600
    raw = json.loads(mpath.read_text())
    assert raw["n_tokens"] == 1200 and raw["parallel"] == 2 and raw["kvlab_version"]
    assert store.read_manifest("a.bin") == manifest


def test_a_stale_file_is_not_taken_for_a_fresh_save(saved: tuple[SlotStore, Manifest],
                                                     model: Path) -> None:
    store, _ = saved
    os.utime(store.directory / "a.bin", ns=(1, 1))  # written long ago, not by this save
    op = SlotOp("save", 0, "a.bin", 1200, 208, 1.5, 2.5)
    with pytest.raises(RefusedError, match="another --slot-save-path"):
        store.record(op, identity(model), None, not_before_ns=10**18)
    with pytest.raises(RefusedError, match="another --slot-save-path"):
        store.record(SlotOp("save", 0, "a.bin", 1200, 999, 1.5, 2.5), identity(model), None)


def test_matching_server_may_restore(saved: tuple[SlotStore, Manifest], model: Path) -> None:
    store, manifest = saved
    assert store.check_restorable("a.bin", identity(model)) == manifest


@pytest.mark.parametrize(("field", "value", "words"), [
    ("model_sha256", "0" * 64, "another model"),
    ("n_stream", "4", "n_stream mismatch"),
    ("kv_type_k", "f16", "-ctk"),
    ("kv_type_v", "q4_0", "-ctv"),
    ("flash_attn", "off", "flash attention"),
    ("server_build", "b0-unknown", "builds"),
])
def test_mismatch_is_refused_naming_the_field(saved: tuple[SlotStore, Manifest], model: Path,
                                              field: str, value: object, words: str) -> None:
    store, _ = saved
    with pytest.raises(RefusedError) as err:
        store.check_restorable("a.bin", identity(model, **{field: value}))
    message = str(err.value)
    assert f"{field} differs" in message and words in message and "\n" not in message


def test_every_differing_field_is_listed(saved: tuple[SlotStore, Manifest], model: Path) -> None:
    store, _ = saved
    with pytest.raises(RefusedError, match=r"n_stream differs \(also flash_attn\)"):
        store.check_restorable("a.bin", identity(model, n_stream="1", flash_attn="off"))


def test_a_file_too_big_for_the_slot_is_refused(saved: tuple[SlotStore, Manifest],
                                                model: Path) -> None:
    store, _ = saved
    with pytest.raises(RefusedError, match="tokens_per_slot"):
        store.check_restorable("a.bin", identity(model, tokens_per_slot=1024))


def test_a_file_changed_after_save_is_refused(saved: tuple[SlotStore, Manifest],
                                              model: Path) -> None:
    store, _ = saved
    path = store.directory / "a.bin"
    path.write_bytes(MAGIC + b"xy" * 100)  # same size, other bytes: another server saved over
    os.utime(path, ns=(1, 1))
    with pytest.raises(RefusedError, match="changed after kvlab saved it"):
        store.check_restorable("a.bin", identity(model))


def test_a_copied_file_with_new_mtime_but_same_bytes_is_fine(
        saved: tuple[SlotStore, Manifest], model: Path) -> None:
    store, manifest = saved
    os.utime(store.directory / "a.bin", ns=(5, 5))
    assert store.check_restorable("a.bin", identity(model)) == manifest


def test_missing_file_and_missing_manifest(saved: tuple[SlotStore, Manifest]) -> None:
    store, _ = saved
    with pytest.raises(InputError, match=r"slot file nope.bin is not in .*kvlab llama slots"):
        store.read_manifest("nope.bin")
    (store.directory / "raw.bin").write_bytes(MAGIC)
    with pytest.raises(RefusedError, match="has no kvlab manifest"):
        store.read_manifest("raw.bin")


@pytest.mark.parametrize("name", ["../x.bin", "/etc/passwd", "a/b.bin", "x.bin.kvlab.json"])
def test_names_must_be_bare(saved: tuple[SlotStore, Manifest], name: str) -> None:
    store, _ = saved
    with pytest.raises(RefusedError, match=r"bare name|may not end"):
        store.slot_path(name)


def test_malformed_manifest_names_the_field(saved: tuple[SlotStore, Manifest]) -> None:
    store, _ = saved
    mpath = store.manifest_path("a.bin")
    raw = json.loads(mpath.read_text())
    raw["parallel"] = "2"
    mpath.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="parallel should be a whole number"):
        store.read_manifest("a.bin")
    del raw["model_sha256"]
    mpath.write_text(json.dumps(raw))
    with pytest.raises(InputError, match="lacks model_sha256"):
        store.read_manifest("a.bin")


def test_model_hash_is_cached_by_path_size_and_mtime(tmp_path: Path, model: Path) -> None:
    cache = tmp_path / "cache" / "sha.json"
    first = file_sha256(model, cache)
    assert cache.stat().st_mode & 0o777 == 0o600
    key = next(iter(json.loads(cache.read_text())))
    cache.write_text(json.dumps({key: "remembered"}))
    assert file_sha256(model, cache) == "remembered"  # not read again
    os.utime(model, ns=(7, 7))
    assert file_sha256(model, cache) == first  # mtime changed: hashed again


def test_entries_list_files_with_their_manifests(saved: tuple[SlotStore, Manifest]) -> None:
    store, manifest = saved
    (store.directory / "raw.bin").write_bytes(MAGIC)
    (store.directory / "notes.txt").write_text("not a slot file")
    entries = {e.filename: e for e in store.entries()}
    assert set(entries) == {"a.bin", "raw.bin"}
    assert entries["a.bin"].manifest == manifest and entries["raw.bin"].manifest is None


def test_clean_removes_slot_files_and_manifests_only(saved: tuple[SlotStore, Manifest]) -> None:
    store, _ = saved
    (store.directory / "notes.txt").write_text("the user's own file")
    dry = slotstore.clean(store.directory, dry_run=True)
    assert sorted(dry.removed) == ["a.bin", "a.bin.kvlab.json"] and dry.kept == ["notes.txt"]
    assert (store.directory / "a.bin").exists()
    done = slotstore.clean(store.directory)
    assert sorted(done.removed) == ["a.bin", "a.bin.kvlab.json"] and done.bytes_freed > 200
    assert not done.directory_removed and (store.directory / "notes.txt").exists()
    (store.directory / "notes.txt").unlink()
    (store.directory / "b.bin").write_bytes(MAGIC)
    last = slotstore.clean(store.directory)
    assert last.removed == ["b.bin"] and last.directory_removed
    assert not store.directory.exists()
    assert slotstore.clean(store.directory).removed == []
