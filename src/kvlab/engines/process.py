"""Running an engine process properly: own session, ready check, clean stop, log file.

- start: a new session (so the engine's helper processes share its process group), output to
  a log file, a PID record under KVLAB_HOME/run so `kvlab clean` can find strays;
- ready: the health URL answers 200 AND the process is alive, within a monotonic deadline; a
  process that exits during start raises with the tail of its log;
- stop: SIGTERM to the whole group, a grace period, then SIGKILL; always, via `async with`.

This module knows no engine: the plan says what to run and where health is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

import httpx

from kvlab.core.errors import EngineError
from kvlab.engines.plan import EnginePlan

DEFAULT_READY_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0


def port_in_use(host: str, port: int) -> bool:
    """Whether something already accepts connections on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A port the kernel says is free right now on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EngineProcess:
    """One engine started from a plan; use `async with` so it is always stopped."""

    def __init__(
        self,
        plan: EnginePlan,
        log_path: Path,
        *,
        run_dir: Path | None = None,
        secret_env: dict[str, str] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        stop_grace_s: float = STOP_GRACE_S,
        echo: TextIO | None = None,
    ) -> None:
        self.plan = plan
        self.log_path = log_path
        self.run_dir = run_dir
        self._secret_env = secret_env or {}
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._echo = echo
        self._proc: subprocess.Popen[bytes] | None = None
        self._echo_task: asyncio.Task[None] | None = None
        self.ready_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def start(self) -> None:
        """Spawn the process (its own session), after checking the port is free."""
        if port_in_use(self.plan.client_host, self.plan.port):
            raise EngineError(
                f"port {self.plan.port} on {self.plan.client_host} is already in use; stop what "
                f"listens there or choose another port for the {self.plan.role} instance"
            )
        for d in self.plan.private_dirs:
            make_private_dir(Path(d))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.plan.env, **self._secret_env, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    self.plan.argv(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                )
            except OSError as exc:
                raise EngineError(
                    f"cannot run {self.plan.argv()[0]} for the {self.plan.role} instance: {exc}"
                ) from None
        self._record_pid()

    async def wait_ready(self) -> float:
        """Seconds until health answered; raises if the process dies or the deadline passes."""
        assert self._proc is not None, "start() first"
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise EngineError(
                        f"{self.plan.engine} ({self.plan.role}) exited with code {code} during "
                        f"start; {self.log_path}: {self.log_tail(3)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.get(self.plan.health_url)
                    if response.status_code == 200 and self._proc.poll() is None:
                        self.ready_s = time.monotonic() - started
                        return self.ready_s
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"{self.plan.engine} ({self.plan.role}) not ready after "
                        f"{self.ready_timeout_s:.0f} s at {self.plan.health_url}; "
                        f"{self.log_path}: {self.log_tail(3)}"
                    )
                await asyncio.sleep(0.25)

    async def stop(self, grace_s: float | None = None) -> int | None:
        """TERM the process group, wait up to the grace period, then KILL; the exit code."""
        if self._echo_task is not None:
            self._echo_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._echo_task
            self._echo_task = None
        proc = self._proc
        if proc is None:
            return None
        grace = self.stop_grace_s if grace_s is None else grace_s
        await asyncio.to_thread(stop_group, proc.pid, grace, proc.poll)
        code = await asyncio.to_thread(proc.wait)
        self._forget_pid()
        return code

    async def healthy(self) -> bool:
        """Alive and answering its health URL with 200 right now."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
                return (await client.get(self.plan.health_url)).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_exit(self) -> int:
        """Wait for the process to exit by itself (it runs in the foreground)."""
        assert self._proc is not None, "start() first"
        return await asyncio.to_thread(self._proc.wait)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        tail = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) if tail else "(empty log)"

    def echo_log(self, out: TextIO) -> None:
        """Copy the log to `out` as it grows (foreground `kvlab serve`)."""
        self._echo_task = asyncio.get_running_loop().create_task(self._tail_to(out))

    async def _tail_to(self, out: TextIO) -> None:
        # a local log file read a line at a time: not worth a thread
        with open(self.log_path, encoding="utf-8", errors="replace") as f:  # noqa: ASYNC230
            while True:
                line = f.readline()
                if line:
                    out.write(line)
                    out.flush()
                else:
                    await asyncio.sleep(0.1)

    async def __aenter__(self) -> EngineProcess:
        self.start()
        try:
            if self._echo is not None:
                self.echo_log(self._echo)
            await self.wait_ready()
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.shield(self.stop())

    def _pid_file(self) -> Path | None:
        if self.run_dir is None or self._proc is None:
            return None
        return self.run_dir / "pids" / f"{self._proc.pid}.json"

    def _record_pid(self) -> None:
        path = self._pid_file()
        if path is None or self._proc is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"pid": self._proc.pid, "engine": self.plan.engine, "role": self.plan.role,
                  "port": self.plan.port, "argv0": self.plan.argv()[0],
                  "started": time.time(), "log": str(self.log_path)}
        path.write_text(json.dumps(record) + "\n", encoding="utf-8")

    def _forget_pid(self) -> None:
        path = self._pid_file()
        if path is not None:
            path.unlink(missing_ok=True)


def make_private_dir(path: Path) -> None:
    """Create `path` (and parents) readable by this account only: it will hold prompts."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(PermissionError):
        path.chmod(0o700)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float = STOP_GRACE_S,
               reap: Callable[[], object] | None = None) -> None:
    """SIGTERM a process group, wait for it to empty, SIGKILL what is left (blocking).

    `reap` collects the leader's exit status when it is our child (a zombie leader would keep
    the group looking alive); by default a plain waitpid is tried.
    """
    collect = reap or (lambda: _waitpid(pgid))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        collect()
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        collect()
        if not group_alive(pgid):
            return
        time.sleep(0.1)


def _waitpid(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stray_records(run_dir: Path) -> list[dict[str, Any]]:
    """PID records of engines kvlab started that were not stopped through kvlab."""
    out = []
    for path in sorted((run_dir / "pids").glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            path.unlink(missing_ok=True)
            continue
        record["_file"] = str(path)
        out.append(record)
    return out


def stop_strays(run_dir: Path, grace_s: float = 5.0) -> list[dict[str, Any]]:
    """Stop every recorded engine group still alive; remove the records. Returns those stopped."""
    stopped = []
    for record in stray_records(run_dir):
        pid = int(record["pid"])
        if group_alive(pid) and _is_same_program(pid, str(record.get("argv0", ""))):
            stop_group(pid, grace_s)
            stopped.append(record)
        Path(record["_file"]).unlink(missing_ok=True)
    return stopped


def _is_same_program(pid: int, argv0: str) -> bool:
    """Guard against a recycled PID: a live group leader must still run the recorded program.

    A group whose leader has exited but which still has members is ours: the kernel does not
    reuse a PID while a process group of that id exists.
    """
    import psutil

    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    return bool(argv0) and any(Path(part).name == Path(argv0).name for part in cmd[:2])
