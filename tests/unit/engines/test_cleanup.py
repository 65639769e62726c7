"""`kvlab clean` removes what holds prompts under KVLAB_HOME, and a killed proxy's leftovers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from kvlab.core.paths import PROXY_METRICS_PREFIX
from kvlab.core.settings import Settings
from kvlab.engines.cleanup import clean


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_clean_removes_stores_scratch_and_dead_proxies_metrics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(kvlab_home=str(tmp_path / "home"),
                        llama_slot_save_path=str(tmp_path / "slots"))
    paths = settings.paths()
    store = paths.store("r1", "shared")
    scratch = paths.scratch / "interference-slots"
    for d in (store, scratch):
        d.mkdir(parents=True)
        (d / "f").write_bytes(b"prompt")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    dead = temp / f"{PROXY_METRICS_PREFIX}{_dead_pid()}-abc"
    alive = temp / f"{PROXY_METRICS_PREFIX}{os.getpid()}-def"
    for d in (dead, alive):
        d.mkdir()

    would = clean(settings, dry_run=True)
    assert {str(store.parent), str(paths.scratch / "interference-slots"), str(dead)} <= set(
        would.removed)
    assert store.exists() and dead.exists()

    done = clean(settings)
    assert not store.parent.exists() and not scratch.exists() and not dead.exists()
    assert alive.exists()  # its proxy still runs
    assert done.bytes_freed >= 12


def test_clean_leaves_the_stores_of_a_kvlab_still_running(tmp_path: Path) -> None:
    # a run's stores hold what its engines write now: another kvlab's `kvlab clean` must not
    # remove them under it (found from outside, 2026-12-07, with the engines themselves)
    from kvlab.engines.strays import claim, release

    settings = Settings(kvlab_home=str(tmp_path / "home"),
                        llama_slot_save_path=str(tmp_path / "slots"))
    live = settings.paths().store("live-run", "shared")
    live.mkdir(parents=True)
    (live / "entry").write_bytes(b"prompt")
    claim(live.parent)  # this process is the kvlab running it
    done = clean(settings)
    assert live.exists() and str(live.parent) not in done.removed
    assert any(str(live.parent) in k and f"pid {os.getpid()}" in k for k in done.kept)
    release(live.parent)  # its run is over: now it is a leftover
    assert str(live.parent) in clean(settings).removed and not live.exists()
