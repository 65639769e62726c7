"""The slot store against planted files and doctored manifests (issue 14, items 14-17).

Names with a trailing newline, symlinks planted in the store, a world-writable or foreign
slot directory, a same-size file with its mtime set back, manifests that lie about their
counts or their file, and manifests nested 100,000 levels deep. Properties (hypothesis) pin
the slot-name rule and the manifest reader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.errors import InputError, RefusedError
from kvlab.engines import llamacpp, ports, process
from kvlab.engines.llamacpp.client import SlotOp
from kvlab.engines.llamacpp.slotmanifest import MANIFEST_SUFFIX, Manifest
from kvlab.engines.llamacpp.slotstore import SlotStore
from kvlab.engines.plan import EnginePlan
from slots import MAGIC, fake_model, identity

EXAMPLES = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return fake_model(tmp_path)


@pytest.fixture
def store(tmp_path: Path, model: Path) -> SlotStore:
    """A store holding a.bin, saved as the server would write it and recorded by kvlab."""
    store = SlotStore(tmp_path / "slots")
    store.ensure()
    (store.directory / "a.bin").write_bytes(MAGIC + b"kv" * 100)
    store.record(SlotOp("save", 0, "a.bin", 1200, 208, 1.5, 2.5), identity(model), None)
    return store


def outside_file(tmp_path: Path) -> Path:
    """A file outside the store that looks like a slot file (someone's data)."""
    target = tmp_path / "elsewhere" / "victim.bin"
    target.parent.mkdir()
    target.write_bytes(MAGIC + b"kv" * 100)
    target.chmod(0o644)
    return target


# ---- 14: slot names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a.bin\n", "a.bin\r", "a\nb", "a.bin\x00", "a.bin ",
                                  "../a.bin", "/etc/passwd", ".hidden", "a/b", ""])
def test_a_slot_name_that_is_not_a_bare_name_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(RefusedError, match="must be a bare name"):
        SlotStore(tmp_path).slot_path(name)


_NAME_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"


@EXAMPLES
@given(name=st.text(max_size=210))
def test_an_accepted_slot_name_always_stays_inside_the_store(tmp_path: Path, name: str) -> None:
    try:
        path = SlotStore(tmp_path / "slots").slot_path(name)
    except RefusedError as exc:
        assert "\n" not in str(exc)
        return
    assert set(name) <= set(_NAME_CHARS) and name[0] not in "._-" and ".." not in name
    assert path.parent == tmp_path / "slots" and path.name == name


@EXAMPLES
@given(first=st.sampled_from(_NAME_CHARS[:62]), rest=st.text(alphabet=_NAME_CHARS, max_size=150))
def test_every_bare_name_is_accepted(tmp_path: Path, first: str, rest: str) -> None:
    name = first + rest
    if ".." in name or name.endswith(MANIFEST_SUFFIX):
        return
    assert llamacpp.check_slot_filename(name) == name


# ---- 15: symlinks are refused, never followed -------------------------------------------------

def test_a_planted_symlink_is_neither_chmod_ed_nor_hashed_on_save(tmp_path: Path, model: Path,
                                                                  store: SlotStore) -> None:
    victim = outside_file(tmp_path)
    (store.directory / "evil.bin").symlink_to(victim)
    op = SlotOp("save", 0, "evil.bin", 1200, 208, 1.5, 2.5)
    with pytest.raises(RefusedError, match="symbolic link"):
        store.record(op, identity(model), None)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not store.manifest_path("evil.bin").exists()


def test_a_file_swapped_for_a_symlink_after_save_is_not_restorable(
        tmp_path: Path, model: Path, store: SlotStore) -> None:
    victim = outside_file(tmp_path)  # the same bytes as a.bin: only the link gives it away
    (store.directory / "a.bin").unlink()
    (store.directory / "a.bin").symlink_to(victim)
    with pytest.raises(RefusedError, match="symbolic link"):
        store.check_restorable("a.bin", identity(model))
    assert [e.filename for e in store.entries()] == []


def test_a_symlinked_manifest_is_refused(tmp_path: Path, model: Path, store: SlotStore) -> None:
    real = tmp_path / "kept.json"
    shutil.move(store.manifest_path("a.bin"), real)
    store.manifest_path("a.bin").symlink_to(real)
    with pytest.raises(RefusedError, match="symbolic link"):
        store.check_restorable("a.bin", identity(model))


# ---- 16: a directory kvlab did not create keeps its mode ---------------------------------------

def world_writable(tmp_path: Path) -> Path:
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp is
    return shared


def test_a_world_writable_slot_directory_is_refused_and_left_alone(tmp_path: Path) -> None:
    shared = world_writable(tmp_path)
    with pytest.raises(RefusedError, match="writable by every user"):
        SlotStore(shared).ensure()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_a_symlink_to_a_world_writable_directory_is_refused(tmp_path: Path) -> None:
    shared = world_writable(tmp_path)
    (tmp_path / "slots").symlink_to(shared)
    with pytest.raises(RefusedError, match="writable by every user"):
        SlotStore(tmp_path / "slots").ensure()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_an_engine_is_not_started_on_a_world_writable_private_dir(tmp_path: Path) -> None:
    shared = world_writable(tmp_path)
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, "-c", "pass"),
                      port=ports.free_port(), private_dirs=(str(shared),))
    with pytest.raises(RefusedError, match="choose a new path"):
        process.EngineProcess(plan, tmp_path / "e.log").start()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_foreign_owned_slot_directory_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "theirs"
    foreign.mkdir(mode=0o755)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(RefusedError, match="belongs to another account"):
        SlotStore(foreign).ensure()
    assert stat.S_IMODE(foreign.stat().st_mode) == 0o755


def test_an_existing_own_directory_is_used_as_it_is(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o750)
    mine.chmod(0o750)
    SlotStore(mine).ensure()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o750  # not kvlab's to change


def test_a_directory_kvlab_creates_is_private_whatever_the_umask(tmp_path: Path) -> None:
    before = os.umask(0o277)  # would leave the owner without write or search
    try:
        SlotStore(tmp_path / "new" / "slots").ensure()
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "new" / "slots").stat().st_mode) == 0o700


# ---- 17: the manifest check ---------------------------------------------------------------------

def test_a_same_size_file_with_its_mtime_set_back_is_refused(model: Path,
                                                            store: SlotStore) -> None:
    manifest = store.read_manifest("a.bin")
    path = store.directory / "a.bin"
    path.write_bytes(MAGIC + b"xy" * 100)  # another server saved over it: same size
    os.utime(path, ns=(manifest.file_mtime_ns, manifest.file_mtime_ns))
    assert path.stat().st_size == manifest.file_bytes
    with pytest.raises(RefusedError, match="changed after kvlab saved it"):
        store.check_restorable("a.bin", identity(model))


def test_an_untouched_file_still_restores(model: Path, store: SlotStore) -> None:
    assert store.check_restorable("a.bin", identity(model)).filename == "a.bin"


def rewrite_manifest(store: SlotStore, name: str, **changes: object) -> None:
    path = store.manifest_path(name)
    raw = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**raw, **changes}), encoding="utf-8")


@pytest.mark.parametrize(("field", "value"), [
    ("n_tokens", -5), ("file_bytes", -1), ("saved_from_slot", -2), ("parallel", -4),
])
def test_a_negative_count_in_a_manifest_is_refused(model: Path, store: SlotStore, field: str,
                                                   value: int) -> None:
    rewrite_manifest(store, "a.bin", **{field: value})
    with pytest.raises(InputError, match=f"{field} is {value}, below 0"):
        store.check_restorable("a.bin", identity(model))


def test_a_manifest_for_another_file_is_refused(model: Path, store: SlotStore) -> None:
    shutil.copy(store.directory / "a.bin", store.directory / "b.bin")
    shutil.copy(store.manifest_path("a.bin"), store.manifest_path("b.bin"))
    with pytest.raises(InputError, match="describes another file"):
        store.check_restorable("b.bin", identity(model))
    rewrite_manifest(store, "a.bin", filename="../../etc/passwd")
    with pytest.raises(InputError, match="describes another file"):
        store.read_manifest("a.bin")


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a":' * 100_000, "{" * 100_000 + "}",
                                  '{"n": ' + "[" * 50_000 + "]" * 50_000 + "}"],
                         ids=["list", "object", "unbalanced", "balanced"])
def test_a_deeply_nested_manifest_is_a_clean_error(model: Path, store: SlotStore,
                                                   text: str) -> None:
    store.manifest_path("a.bin").write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as err:
        store.check_restorable("a.bin", identity(model))
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_huge_manifest_is_refused_unread(model: Path, store: SlotStore) -> None:
    store.manifest_path("a.bin").write_text(" " * (2 << 20) + "{}", encoding="utf-8")
    with pytest.raises(InputError, match="larger than any kvlab manifest"):
        store.read_manifest("a.bin")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10)


@EXAMPLES
@given(changes=st.dictionaries(st.sampled_from([f.name for f in dataclasses.fields(Manifest)]),
                               json_values, max_size=4))
def test_a_doctored_manifest_is_read_or_refused_never_a_crash(
        tmp_path: Path, model: Path, changes: dict[str, object]) -> None:
    store = SlotStore(tmp_path / "prop-slots")
    store.ensure()
    (store.directory / "a.bin").write_bytes(MAGIC + b"kv" * 100)
    saved = store.record(SlotOp("save", 0, "a.bin", 12, 208, 1.5, 2.5), identity(model), None)
    rewrite_manifest(store, "a.bin", **changes)
    try:
        read = store.read_manifest("a.bin")
    except (InputError, RefusedError) as exc:
        assert "\n" not in str(exc)
        return
    assert read.filename == "a.bin" and read.n_tokens >= 0 and read.file_bytes >= 0
    assert all(getattr(read, k) == v for k, v in changes.items()) or read == saved
