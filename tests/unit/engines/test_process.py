"""Engine processes: ready means health AND alive; a death during start names the log; the
whole group is stopped (TERM, then KILL); a busy port is refused; strays are found."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from children import running
from kvlab.core.errors import EngineError
from kvlab.engines import ports, process, process_groups, strays
from kvlab.engines.plan import EnginePlan

FAKE = Path(__file__).parents[2] / "fakes" / "fake_engine.py"


def fake_plan(port: int, *flags: str) -> EnginePlan:
    return EnginePlan(engine="fake", role="test", command=(sys.executable, str(FAKE)),
                      positional=(str(port), *flags), port=port, health_path="/health")


async def test_ready_then_stop_leaves_no_process(tmp_path: Path) -> None:
    port = ports.free_port()
    proc = process.EngineProcess(fake_plan(port, "--child"), tmp_path / "e.log",
                                 run_dir=tmp_path / "run")
    async with proc:
        assert proc.ready_s is not None and proc.returncode is None
        pgid = proc.pid
        assert pgid is not None and process_groups.group_alive(pgid)
        assert len(strays.stray_records(tmp_path / "run")) == 1
    assert not process_groups.group_alive(pgid)
    assert strays.stray_records(tmp_path / "run") == []


async def test_death_during_start_reports_the_log_tail(tmp_path: Path) -> None:
    proc = process.EngineProcess(fake_plan(ports.free_port(), "--die"), tmp_path / "e.log")
    with pytest.raises(EngineError) as err:
        async with proc:
            pass
    message = str(err.value)
    assert "exited with code 3 during start" in message and "no model here" in message
    assert "\n" not in message


async def test_term_ignored_falls_back_to_kill(tmp_path: Path) -> None:
    proc = process.EngineProcess(fake_plan(ports.free_port(), "--ignore-term"),
                                 tmp_path / "e.log", stop_grace_s=1.0)
    async with proc:
        pgid = proc.pid
    assert proc.returncode is not None and proc.returncode < 0
    assert pgid is not None and not process_groups.group_alive(pgid)


async def test_deadline(tmp_path: Path) -> None:
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, "-c",
                      "import time; time.sleep(60)"), port=ports.free_port())
    proc = process.EngineProcess(plan, tmp_path / "e.log", ready_timeout_s=1.0)
    with pytest.raises(EngineError, match="not ready after 1 s"):
        async with proc:
            pass
    assert proc.returncode is not None


async def test_busy_port_is_refused(tmp_path: Path) -> None:
    port = ports.free_port()
    async with process.EngineProcess(fake_plan(port), tmp_path / "a.log"):
        second = process.EngineProcess(fake_plan(port), tmp_path / "b.log")
        with pytest.raises(EngineError, match=f"port {port}"):
            second.start()


async def test_private_dirs_are_created_0700(tmp_path: Path) -> None:
    store = tmp_path / "store" / "kv"
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, str(FAKE)),
                      positional=(str(ports.free_port()),), port=0,
                      private_dirs=(str(store),))
    plan = EnginePlan(**{**plan.__dict__, "port": int(plan.positional[0])})
    async with process.EngineProcess(plan, tmp_path / "e.log"):
        assert (store.stat().st_mode & 0o777) == 0o700


def test_stop_strays_stops_a_recorded_group(tmp_path: Path) -> None:
    import json

    with running([sys.executable, "-c", "import time; time.sleep(60)"]) as child:
        pids = tmp_path / "run" / "pids"
        pids.mkdir(parents=True)
        (pids / f"{child.pid}.json").write_text(json.dumps({  # a record as kvlab 0.1 wrote it
            "pid": child.pid, "argv0": sys.executable, "started": time.time()}))
        stopped = strays.stop_strays(tmp_path / "run")
        assert [r.pid for r in stopped] == [child.pid]
        assert child.wait(timeout=5) is not None
    assert not list(pids.glob("*.json"))
    assert os.getpgid(os.getpid()) != child.pid


def test_free_port_never_hands_out_the_same_port_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Found in CI: two vLLM plans made back to back got the same port from the kernel, both
    'started', and each one's readiness probe was answered by the other."""
    offered = iter([41001, 41001, 41001, 41002])

    class Kernel:
        def __init__(self, *_: object) -> None:
            self.port = next(offered)

        def __enter__(self) -> Kernel:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def bind(self, _: object) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ports.socket, "socket", Kernel)
    monkeypatch.setattr(ports, "_GIVEN", set())
    assert [ports.free_port(), ports.free_port()] == [41001, 41002]
