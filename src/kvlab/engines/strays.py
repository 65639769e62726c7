"""Engines kvlab started and did not stop: their PID records, and the proof they are ours.

When kvlab starts an engine it writes a PID record under KVLAB_HOME/run/pids (process group,
start time, port); `kvlab clean` reads them back. A recorded group is stopped only when kvlab
can prove it is the one it started (the leader's start time, or members that serve the port
or started after it), never by argv0, which a wrapper script (`VLLM_CMD`) changes.

Deliberately not here: writing the record when an engine starts (`process.py`), stopping a
group (`process_groups.py`), and what `kvlab clean` reports (`cleanup.py`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvlab.engines.process_groups import stop_group

if TYPE_CHECKING:
    import psutil

_START_SLACK_S = 2.0  # a recorded start time against psutil's (clock ticks, rounding)


class PidRecord(BaseModel):
    """What kvlab writes under KVLAB_HOME/run/pids when it starts an engine, so `kvlab clean`
    can find it if kvlab did not stop it. Older kvlabs wrote fewer keys (pid, argv0,
    started); keys this one does not know are ignored."""

    model_config = ConfigDict(extra="ignore")

    pid: int
    pgid: int | None = None  # the group the engine leads (its pid)
    engine: str = ""
    role: str = ""
    port: int = 0
    argv0: str = ""
    started: float | None = None  # time.time() when spawned
    create_time: float | None = None  # the kernel's, through psutil
    detached: bool = False
    log: str = ""
    identified_by: str | None = None  # set when found running: how it was proven ours
    file: str = Field("", exclude=True)  # where the record was read from

    @property
    def group(self) -> int:
        return self.pgid if self.pgid is not None else self.pid

    @property
    def start(self) -> float | None:
        return self.create_time or self.started

def stray_records(run_dir: Path) -> list[PidRecord]:
    """PID records of engines kvlab started that were not stopped through kvlab (an
    unreadable one is removed: it can prove nothing)."""
    out = []
    for path in sorted((run_dir / "pids").glob("*.json")):
        try:
            record = PidRecord.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            path.unlink(missing_ok=True)
            continue
        record.file = str(path)
        out.append(record)
    return out


def live_strays(run_dir: Path) -> list[PidRecord]:
    """The recorded engines still running, each proven to be the one kvlab started."""
    found = [(r, identify(r)) for r in stray_records(run_dir)]
    return [r.model_copy(update={"identified_by": how}) for r, how in found if how is not None]


def stop_strays(run_dir: Path, grace_s: float = 5.0) -> list[PidRecord]:
    """Stop every recorded engine group still alive; remove the records. Returns those stopped."""
    stopped = []
    for record in stray_records(run_dir):
        how = identify(record)
        if how is not None:
            stop_group(record.pid, grace_s)
            stopped.append(record.model_copy(update={"identified_by": how}))
        Path(record.file).unlink(missing_ok=True)
    return stopped


def identify(record: PidRecord) -> str | None:
    """How a PID record is proven to still be kvlab's engine group, or None (gone, or the PID
    now belongs to another program).

    The process group id is the leader's PID. While the leader lives, its start time must
    equal the recorded one. Once it has exited, the kernel does not reuse its PID while group
    members remain, and those members must serve the recorded port or have started after the
    engine did. argv0 proves nothing: a wrapper script (`VLLM_CMD`) execs another program.
    """
    import psutil

    pgid, started = record.group, record.start
    try:
        leader = psutil.Process(pgid)
        if leader.status() != psutil.STATUS_ZOMBIE:
            same = started is not None and abs(leader.create_time() - started) <= _START_SLACK_S
            return "start time" if same else None
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return None
    members = group_members(pgid)
    if not members:
        return None
    if any(_serves_port(m, record.port) for m in members):
        return "process group and port"
    if started is not None and all(_created(m) >= started - _START_SLACK_S
                                   for m in members):
        return "process group and start time"
    return None


def group_members(pgid: int) -> list[psutil.Process]:
    """The live processes of a process group."""
    import psutil

    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def _serves_port(proc: psutil.Process, port: int) -> bool:
    import psutil

    if port <= 0:
        return False
    try:
        conns = proc.net_connections(kind="inet")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in conns)


def _created(proc: psutil.Process) -> float:
    import psutil

    try:
        return float(proc.create_time())
    except psutil.Error:
        return 0.0
