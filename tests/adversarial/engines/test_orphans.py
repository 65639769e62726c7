"""Engines are never orphaned (issue 14, items 18-20), with real processes.

`kvlab serve` runs a site's wrapper script as VLLM_CMD: a shell script that prints its
arguments (as engines do) and execs another program, the fake engine, which serves /health
and keeps a helper process in its group. llama-server itself is used for one SIGTERM test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from children import running, spawn, stop
from kvlab.core.settings import Settings
from kvlab.engines import install, ports, process, process_groups, strays
from kvlab.engines.cleanup import clean
from kvlab.engines.models import TinyModels
from kvlab.engines.plan import EnginePlan

FAKE = Path(__file__).parents[2] / "fakes" / "fake_engine.py"
START_S = 60.0
WRAPPER = """#!/bin/sh
# a site's vllm: prints its arguments, as engines do, then execs another program
echo "non-default args: $*"
port=""
while [ $# -gt 0 ]; do
  case "$1" in --port) port="$2"; shift;; esac
  shift
done
exec "{python}" "{fake}" "$port" --child
"""


def fake_vllm(directory: Path) -> Path:
    """A wrapper-script `vllm` that ends up running the fake engine on the --port it is given."""
    path = directory / "vllm"
    path.write_text(WRAPPER.format(python=sys.executable, fake=FAKE), encoding="utf-8")
    path.chmod(0o755)
    return path


def kvlab_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a kvlab run with its own KVLAB_HOME and the wrapper as VLLM_CMD."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    return {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "KVLAB_PROFILE": "none",
            "VLLM_CMD": str(fake_vllm(bin_dir)), "LABBOOK": str(tmp_path / "labbook.md"),
            **extra}


def kvlab(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)


@dataclass
class Served:
    """A running `kvlab serve`, its output files and the engine's PID record."""

    proc: subprocess.Popen[bytes]
    home: Path
    port: int
    out: Path
    err: Path

    def engine(self) -> dict[str, object]:
        records = list((self.home / "run" / "pids").glob("*.json"))
        assert len(records) == 1, records
        return dict(json.loads(records[0].read_text(encoding="utf-8")))

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def stdout(self) -> str:
        return self.out.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(encoding="utf-8", errors="replace")


@contextmanager
def serving(tmp_path: Path, env: dict[str, str], *args: str,
            command: tuple[str, ...] = ("serve", "baseline")) -> Iterator[Served]:
    """`kvlab serve ...` started and ready (its startup line written); always torn down."""
    port = ports.free_port()
    out, err = tmp_path / "serve.out", tmp_path / "serve.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = spawn([sys.executable, "-m", "kvlab", *command, "--port", str(port), *args],
                     stdout=o, stderr=e, env=env)
    served = Served(proc, Path(env["KVLAB_HOME"]), port, out, err)
    try:
        _wait_ready(served, Path(env["LABBOOK"]))
        yield served
    finally:
        _tear_down(served)


def _wait_ready(served: Served, labbook: Path) -> None:
    deadline = time.monotonic() + START_S
    while not (labbook.is_file() and '"startup"' in labbook.read_text(encoding="utf-8")):
        if served.proc.poll() is not None:
            pytest.fail(f"kvlab serve exited {served.proc.returncode}: {served.stderr()}")
        if time.monotonic() > deadline:
            pytest.fail(f"kvlab serve not ready after {START_S} s: {served.stderr()}")
        time.sleep(0.1)


def _tear_down(served: Served) -> None:
    stop(served.proc, None)  # SIGTERM, SIGKILL, and whatever it started
    for record in (served.home / "run" / "pids").glob("*.json"):
        process_groups.stop_group(int(json.loads(record.read_text(encoding="utf-8"))["pid"]), 1.0)


def gone(pgid: int, port: int, timeout: float = 10) -> bool:
    """Whether the group has no process left and nothing serves the port, within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not strays.group_members(pgid) and not ports.port_in_use("127.0.0.1", port):
            return True
        time.sleep(0.1)
    return False


# ---- 18: SIGTERM and SIGHUP stop the engine, kvlab exits with its status --------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_a_signal_to_serve_stops_the_engine_group(tmp_path: Path, signum: int) -> None:
    env = kvlab_env(tmp_path)
    with serving(tmp_path, env) as served:
        pgid = int(str(served.engine()["pid"]))
        assert len(strays.group_members(pgid)) == 2  # the engine and its helper
        served.proc.send_signal(signum)
        code = served.wait()
        assert gone(pgid, served.port, timeout=2)
        # the fake engine does not catch SIGTERM: it dies of it, and kvlab says so
        assert code == 128 + signal.SIGTERM
        name = signal.Signals(signum).name
        assert f"stopped on {name}: vllm (baseline) ended (killed by SIGTERM)" in served.stdout()
    with serving(tmp_path, env, "--port", str(served.port)) as again:  # the port is free
        assert again.proc.poll() is None


@pytest.mark.llama
def test_sigterm_stops_a_real_llama_server(tmp_path: Path, tiny_models: TinyModels) -> None:
    binary = install.installed_llama_server(Settings().home())
    if binary is None:
        pytest.fail("llama-server is not built: run `kvlab engines install` (make test does)")
    env = kvlab_env(tmp_path, LLAMA_BIN=str(binary.parent),
                    LLAMA_MODEL=str(tiny_models.gguf),
                    LLAMA_SLOT_SAVE_PATH=str(tmp_path / "slots"), CTX="512")
    with serving(tmp_path, env, "--json", command=("llama", "serve")) as served:
        pgid = int(str(served.engine()["pid"]))
        served.proc.send_signal(signal.SIGTERM)
        code = served.wait()
        result = json.loads(served.stdout())
        assert gone(pgid, served.port, timeout=2)
    assert result["stopped_by"] == "SIGTERM" and result["exit_status"] == code
    assert code in (0, 128 + signal.SIGTERM)  # llama-server stops cleanly on SIGTERM


# ---- 18: an engine does not outlive a kvlab killed outright ----------------------------------

def test_serve_killed_by_sigkill_leaves_no_engine_serving(tmp_path: Path) -> None:
    env = kvlab_env(tmp_path)
    with serving(tmp_path, env) as served:
        record = served.engine()
        pgid = int(str(record["pid"]))
        served.proc.kill()
        served.wait()
        deadline = time.monotonic() + 10
        while ports.port_in_use("127.0.0.1", served.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not ports.port_in_use("127.0.0.1", served.port)  # the parent-death signal
        # what the engine left (its helper) is `kvlab clean`'s, identified by its group
        result = kvlab(env, "clean", "--json")
        assert result.returncode == 0, result.stderr
        stopped = json.loads(result.stdout)["stopped"]
        assert [r["pid"] for r in stopped] == [pgid]
        assert gone(pgid, served.port, timeout=2)


KILLED_SUITE = """
import asyncio, sys
from kvlab.engines.plan import EnginePlan
from kvlab.engines.process import EngineProcess

async def main():
    port = int(sys.argv[1])
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, sys.argv[2]),
                      positional=(str(port),), port=port)
    async with EngineProcess(plan, __import__("pathlib").Path(sys.argv[3])):
        print("ready", flush=True)
        await asyncio.sleep(300)

asyncio.run(main())
"""


def test_a_test_suite_killed_from_outside_leaves_no_engine(tmp_path: Path) -> None:
    port = ports.free_port()
    # what a failed assertion leaves running is stopped by `running`: the engine, and its
    # helper, carry the suite's marker
    with running([sys.executable, "-c", KILLED_SUITE, str(port), str(FAKE),
                  str(tmp_path / "engine.log")], stdout=subprocess.PIPE) as suite:
        assert suite.stdout is not None and suite.stdout.readline() == b"ready\n"
        pgid = os.getpgid(listener_pid(port))
        assert pgid != suite.pid  # the engine runs in its own session
        suite.kill()
        suite.wait(timeout=10)
        assert gone(pgid, port, timeout=10)


def listener_pid(port: int) -> int:
    """The process listening on a loopback port."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port \
                and conn.pid:
            return int(conn.pid)
    raise AssertionError(f"nothing listens on port {port}")


# ---- 19: `kvlab clean` proves an engine is its own without argv0 ------------------------------

def test_clean_stops_a_detached_engine_started_through_a_wrapper(tmp_path: Path) -> None:
    env = kvlab_env(tmp_path)
    port = ports.free_port()
    started = kvlab(env, "serve", "baseline", "--port", str(port), "--detach", "--json")
    assert started.returncode == 0, started.stderr
    pgid = int(json.loads(started.stdout)["pid"])
    try:
        assert ports.port_in_use("127.0.0.1", port)  # left running, as asked
        import psutil

        assert Path(psutil.Process(pgid).cmdline()[1]).name == FAKE.name  # not "vllm"
        result = kvlab(env, "clean", "--json")
        assert result.returncode == 0, result.stderr
        stopped = json.loads(result.stdout)["stopped"]
        assert [(r["pid"], r["identified_by"]) for r in stopped] == [(pgid, "start time")]
        assert gone(pgid, port, timeout=2)
    finally:
        process_groups.stop_group(pgid, 1.0)


def test_clean_leaves_a_process_that_reused_a_recorded_pid(tmp_path: Path) -> None:
    with running([sys.executable, "-c", "import time; time.sleep(60)"]) as stranger:
        settings = Settings(kvlab_home=str(tmp_path / "home"),
                            llama_slot_save_path=str(tmp_path / "slots"))
        pids = settings.paths().run / "pids"
        pids.mkdir(parents=True)
        started = time.time() - 3600  # kvlab's engine of that PID started an hour ago
        (pids / f"{stranger.pid}.json").write_text(json.dumps({
            "pid": stranger.pid, "pgid": stranger.pid, "port": ports.free_port(),
            "argv0": sys.executable, "started": started, "create_time": started}))
        assert clean(settings, dry_run=True).stopped == []
        assert clean(settings).stopped == []
        assert stranger.poll() is None  # alive: it is not kvlab's
        assert not list(pids.glob("*.json"))  # the stale record is gone


async def test_a_detached_engine_process_is_left_running_with_its_record(
        tmp_path: Path) -> None:
    port = ports.free_port()
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, str(FAKE)),
                      positional=(str(port),), port=port)
    run = tmp_path / "run"
    async with process.EngineProcess(plan, tmp_path / "e.log", run_dir=run,
                                     detached=True) as proc:
        pgid = proc.pid
    assert pgid is not None
    try:
        assert process_groups.group_alive(pgid)
        assert [r.pid for r in strays.live_strays(run)] == [pgid]
    finally:
        assert [r.pid for r in strays.stop_strays(run)] == [pgid]
    assert gone(pgid, port, timeout=2)
    assert proc.returncode is not None  # reaped by `stop_strays`


async def test_clean_leaves_the_engines_of_a_kvlab_still_running(tmp_path: Path) -> None:
    # found from outside (2026-12-07): a second kvlab's `kvlab clean` killed the engine a
    # running `kvlab run all` had just started; an engine whose kvlab lives is not a stray
    port = ports.free_port()
    plan = EnginePlan(engine="fake", role="test", command=(sys.executable, str(FAKE)),
                      positional=(str(port),), port=port)
    run = tmp_path / "run"
    async with process.EngineProcess(plan, tmp_path / "e.log", run_dir=run) as proc:
        assert strays.live_strays(run) == [] and strays.stop_strays(run) == []
        assert await proc.healthy()  # still serving this kvlab
        (kept,) = strays.owned_elsewhere(run)
        assert kept.pid == proc.pid and kept.owner == os.getpid()
    assert strays.stray_records(run) == []  # stopped by its own kvlab, record gone


# ---- 20: exit codes say what happened ---------------------------------------------------------

def test_serve_reports_an_engine_that_died_with_its_status(tmp_path: Path) -> None:
    env = kvlab_env(tmp_path)
    with serving(tmp_path, env) as served:
        pgid = int(str(served.engine()["pid"]))
        os.kill(pgid, signal.SIGKILL)  # the engine dies (the OOM killer, a crash)
        code = served.wait()
        assert code == 128 + signal.SIGKILL
        assert "vllm (baseline) was killed by SIGKILL from outside kvlab (status 137)" in \
            served.stdout()
        assert gone(pgid, served.port, timeout=2)  # its helper was stopped too


@contextmanager
def failing_engine() -> Iterator[str]:
    """The fake engine, listening (it answers every POST with 501); its /v1 URL."""
    port = ports.free_port()
    with running([sys.executable, str(FAKE), str(port)], stdout=subprocess.DEVNULL):
        deadline = time.monotonic() + 30
        while not ports.port_in_use("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1"


def test_run_load_fails_when_every_request_failed(tmp_path: Path) -> None:
    with failing_engine() as url:
        env = kvlab_env(tmp_path, REQUESTS="2", CONCURRENCY="1")
        result = kvlab(env, "run-load", "x", url, "--no-metrics", "--no-progress",
                       "--timeout", "5")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "every request failed" in result.stderr


def test_load_fails_when_every_request_failed(tmp_path: Path) -> None:
    """`kvlab load` as `run-load` does: it exited 0 with every request failed."""
    with failing_engine() as url:
        result = kvlab(kvlab_env(tmp_path), "load", "--base-url", url, "--model", "x",
                       "--requests", "2", "--concurrency", "1", "--no-progress",
                       "--timeout", "5")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "every request failed" in result.stderr
