"""Running an engine process properly: own session, ready check, clean stop, log file.

- start: a new session (so the engine's helper processes share its process group), output to
  a log file, a PID record under KVLAB_HOME/run (process group, start time, port) so
  `kvlab clean` can find strays; on Linux the engine gets SIGTERM when kvlab dies, even by
  SIGKILL (the parent-death signal), unless it was started detached;
- ready: the health URL answers 200 AND the process is alive, within a monotonic deadline; a
  process that exits during start raises `StartFailed` with the tail of its log (and the whole
  log, for the caller that asks its engine why);
- stop: SIGTERM to the whole group, a grace period, then SIGKILL; always, via `async with`;
- strays: a recorded group is stopped only when kvlab can prove it is the one it started (the
  leader's start time, or members that serve the port or started after it), never by argv0,
  which a wrapper script (`VLLM_CMD`) changes.

The engine is spawned with the plan's real argv (`exec_argv`); what this module shows (the
log echoed, a log tail in an error) has the plan's secrets redacted. This module knows no
engine: the plan says what to run and where health is.

This module owns `EngineProcess` (start, ready, stop, health, log) and writes its PID record.
Deliberately not here: the port check and free ports (`ports.py`), private directories
(`private_dirs.py`), stopping a process group and the parent-death signal
(`process_groups.py`), and the PID records read back and strays proven and stopped
(`strays.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import TextIO

import httpx

from kvlab.core import EngineError, redact_text
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import port_in_use
from kvlab.engines.private_dirs import make_private_dir
from kvlab.engines.process_groups import STOP_GRACE_S, parent_death_signal, stop_group
from kvlab.engines.strays import PidRecord

DEFAULT_READY_TIMEOUT_S = 600.0


class StartFailed(EngineError):
    """An engine that exited before it was ready: its engine's name, its role and its log,
    for the caller that asks the engine why (`Engine.memory_failure`)."""

    def __init__(self, message: str, *, engine: str, role: str, log: str) -> None:
        super().__init__(message)
        self.engine, self.role, self.log = engine, role, log


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
        detached: bool = False,
    ) -> None:
        self.plan = plan
        self.log_path = log_path
        self.run_dir = run_dir
        self._secret_env = secret_env or {}
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self._echo = echo
        # detached: may outlive kvlab (no parent-death signal; left running on a clean exit)
        self.detached = detached
        self._shown_secrets = plan.secrets() | set((secret_env or {}).values())
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
        preexec = None if self.detached else parent_death_signal()
        # the engine writes its own log and may print its arguments: this account only
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    self.plan.exec_argv(), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                    preexec_fn=preexec,  # one prctl call, bound before the fork
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
                    raise StartFailed(
                        f"{self.plan.engine} ({self.plan.role}) exited with code {code} during "
                        f"start; {self.log_path}: {self.log_tail(3)}",
                        engine=self.plan.engine, role=self.plan.role, log=self.log_text())
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
        await self._stop_echo()
        proc = self._proc
        if proc is None:
            return None
        grace = self.stop_grace_s if grace_s is None else grace_s
        await asyncio.to_thread(stop_group, proc.pid, grace, proc.poll)
        code = await asyncio.to_thread(proc.wait)
        self._forget_pid()
        return code

    async def release(self) -> None:
        """Leave a detached engine running: stop echoing its log, keep its PID record for
        `kvlab clean`."""
        await self._stop_echo()

    async def _stop_echo(self) -> None:
        if self._echo_task is not None:
            self._echo_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._echo_task
            self._echo_task = None

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
        """The engine's log so far, with the plan's secrets redacted (engines print their
        arguments, `--api-key` included)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return redact_text(text, self._shown_secrets)

    def log_tail(self, lines: int = 3) -> str:
        tail = [ln.strip() for ln in self.log_text().splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) if tail else "(empty log)"

    def echo_log(self, out: TextIO) -> None:
        """Copy the log to `out` as it grows (foreground `kvlab serve`)."""
        self._echo_task = asyncio.get_running_loop().create_task(self._tail_to(out))

    async def _tail_to(self, out: TextIO) -> None:
        # a local log file read a line at a time: not worth a thread
        with open(self.log_path, encoding="utf-8", errors="replace") as f:  # noqa: ASYNC230
            pending = ""  # a line the engine has not finished writing: a secret may span it
            while True:
                pending += f.readline()
                if pending.endswith("\n"):
                    out.write(redact_text(pending, self._shown_secrets))
                    out.flush()
                    pending = ""
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
        if self.detached and exc_type is None and self.returncode is None:
            await self.release()
            return
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
        record = PidRecord(pid=self._proc.pid, pgid=self._proc.pid, engine=self.plan.engine,
                           role=self.plan.role, port=self.plan.port, argv0=self.plan.argv()[0],
                           started=time.time(), create_time=_create_time(self._proc.pid),
                           detached=self.detached, log=str(self.log_path),
                           owner=None if self.detached else os.getpid(),
                           owner_start=None if self.detached else _create_time(os.getpid()))
        path.write_text(record.model_dump_json(exclude_none=True) + "\n", encoding="utf-8")

    def _forget_pid(self) -> None:
        path = self._pid_file()
        if path is not None:
            path.unlink(missing_ok=True)


def orphan_note(proc: EngineProcess, system: str = sys.platform) -> str:
    """Said where an engine would outlive a killed kvlab: no parent-death signal on this
    system (PR_SET_PDEATHSIG is Linux's); "" where there is one, or for a detached engine."""
    if proc.detached or system.startswith("linux"):
        return ""
    return (f"{system} has no parent-death signal (Linux's PR_SET_PDEATHSIG): if kvlab is "
            "killed, this engine keeps running; `kvlab clean` stops it")


def _create_time(pid: int) -> float | None:
    """The process's start time as psutil reports it (seconds since the epoch)."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None
