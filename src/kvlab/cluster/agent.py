"""The agent on one node: a Ray actor pinned to that node that runs its engines.

It runs the same engine plans kvlab runs locally, through the same `EngineProcess`: each
engine in its own process group, its log in the node's KVLAB_HOME (`run/<run id>/on-node`;
the driver ships a copy into its own `run/<run id>/logs`), a PID record there for
`kvlab clean`. Between starts it answers what the driver asks: the
node's facts (host name, machine id, interfaces and their speeds), which of a list of paths
are missing there, a free port on the node's address, a probe file written or read in a store
directory, the node's interface, RDMA and store counters, an engine's status and log (secrets
redacted, as the local path shows them).

Engines never outlive their agent: the actor is synchronous, so Ray runs every call on the
worker's main thread, and an engine spawned there gets Linux's parent-death signal (SIGTERM
when the actor's process dies, even by SIGKILL, `engines/process_groups.py`); a graceful end of the
actor (atexit, `__del__`) stops every process group it started. The driver owns the actor
(not detached), so when the driver dies Ray ends the actor, and with it the engines.

The agent writes no notebook line: only the driver does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.core import VERSION, Settings, store_size
from kvlab.engines import EnginePlan, EngineProcess, make_private_dir, port_in_use, stop_group

if TYPE_CHECKING:
    from kvlab.observe import RdmaPort

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
STOP_ALL_GRACE_S = 5.0
UNKNOWN_ENGINE = -1000  # poll(): no engine by that key (stopped, or never started here)


def machine_id() -> str | None:
    """This machine's id (systemd's machine-id), the same for every Ray node on it."""
    for name in MACHINE_ID_FILES:
        with contextlib.suppress(OSError):
            text = Path(name).read_text(encoding="utf-8").strip()
            if text:
                return text
    return None


def link_speeds() -> dict[str, int | None]:
    """Each interface's link speed in Mb/s as the kernel reports it (None: not reported)."""
    import psutil

    return {name: (int(s.speed) or None) for name, s in psutil.net_if_stats().items()}


@dataclass(frozen=True)
class Counters:
    """One node's byte counters at one moment (Ray pickles it back to the driver)."""

    iface: str
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rdma: dict[str, RdmaPort] = field(default_factory=dict)
    store_bytes: int | None = None


@dataclass(frozen=True)
class NodeFacts:
    """What a node's agent reports about its node when a run joins it."""

    node_id: str
    hostname: str
    machine_id: str | None
    interfaces: dict[str, list[str]]  # name -> addresses
    speeds: dict[str, int | None]  # name -> Mb/s
    kvlab_version: str
    pid: int
    home: str
    gpus: str | None  # the GPUs Ray gave this node's agent, which its engines inherit

    def iface_of(self, address: str) -> str | None:
        """The interface holding `address`, if this node has one."""
        return next((n for n, held in sorted(self.interfaces.items()) if address in held), None)

    def addresses(self) -> list[str]:
        return sorted({a for held in self.interfaces.values() for a in held})


class NodeAgent:
    """One node's engines and facts; made a Ray actor by `remote_class()`."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.paths = Settings().paths()  # this node's KVLAB_HOME
        self.procs: dict[str, EngineProcess] = {}
        atexit.register(self.stop_all)

    def facts(self) -> NodeFacts:
        import ray

        from kvlab.observe import netdev

        return NodeFacts(
            node_id=ray.get_runtime_context().get_node_id(), hostname=socket.gethostname(),
            machine_id=machine_id(),
            interfaces={k: list(v) for k, v in netdev.iface_addresses().items()},
            speeds=link_speeds(), kvlab_version=VERSION, pid=os.getpid(),
            home=str(self.paths.home),
            gpus=os.environ.get("CUDA_VISIBLE_DEVICES") if ray.get_gpu_ids() else None)

    def missing(self, paths: dict[str, str]) -> dict[str, str]:
        """Those of `paths` (what -> path) that do not exist on this node."""
        return {what: path for what, path in paths.items() if not Path(path).exists()}

    def free_port(self, host: str) -> int:
        """A port free on `host`, one of this node's addresses, right now."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])

    def make_store(self, path: str) -> None:
        """The KV store directory, private, created here if it is not there yet."""
        make_private_dir(Path(path))

    def write_probe(self, path: str, name: str, token: str) -> None:
        probe = Path(path) / name
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(token)

    def read_probe(self, path: str, name: str) -> str | None:
        try:
            return (Path(path) / name).read_text(encoding="utf-8")
        except OSError:
            return None

    def remove(self, path: str, parent_too: bool = False) -> None:
        """Remove a file or directory this run made (a store: it holds prompts)."""
        target = Path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
        if parent_too:
            with contextlib.suppress(OSError):
                target.parent.rmdir()

    def start(self, key: str, plan: EnginePlan, secret_env: dict[str, str], log_name: str,
              ready_timeout_s: float) -> int:
        """Spawn the engine (its own process group, tied to this actor); its PID."""
        if key in self.procs:
            raise RuntimeError(f"an engine {key} is already running on this node")
        # beside, not into, the run's logs/ where the driver ships copies: on one machine the
        # driver's run directory and the node's are the same
        proc = EngineProcess(plan, self.paths.run / self.run_id / "on-node" / log_name,
                             run_dir=self.paths.run, secret_env=secret_env,
                             ready_timeout_s=ready_timeout_s)
        proc.start()
        self.procs[key] = proc
        return int(proc.pid or 0)

    def wait_ready(self, key: str) -> float:
        """Seconds until the engine answered its health URL (EngineError if it did not)."""
        return asyncio.run(self.procs[key].wait_ready())

    def poll(self, key: str) -> int | None:
        """The engine's exit code, None while it runs (-1000: this agent never started it)."""
        proc = self.procs.get(key)
        return proc.returncode if proc is not None else UNKNOWN_ENGINE

    def status(self, key: str) -> dict[str, object]:
        proc = self.procs.get(key)
        if proc is None:
            return {"returncode": None, "healthy": False, "known": False}
        return {"returncode": proc.returncode, "healthy": asyncio.run(proc.healthy()),
                "known": True}

    def log_text(self, key: str) -> str:
        proc = self.procs.get(key)
        return proc.log_text() if proc is not None else ""

    def log_since(self, key: str, offset: int) -> tuple[str, int]:
        """The (redacted) log from `offset` on, and where it ends now."""
        text = self.log_text(key)
        return text[offset:], len(text)

    def log_path(self, key: str) -> str:
        proc = self.procs.get(key)
        return str(proc.log_path) if proc is not None else ""

    def port_in_use(self, host: str, port: int) -> bool:
        return port_in_use(host, port)

    def counters(self, iface: str, store: str) -> Counters:
        """This node's byte counters: the interface, every RDMA port, the store's size."""
        from kvlab.observe import netdev

        found = netdev.read_iface(iface)
        return Counters(iface=iface, rx_bytes=found.rx_bytes if found else None,
                        tx_bytes=found.tx_bytes if found else None,
                        rdma=netdev.read_rdma(),
                        store_bytes=store_size(store) if store else None)

    def stop(self, key: str, grace_s: float) -> tuple[int | None, str]:
        """Stop one engine's process group (TERM, grace, KILL); its exit code and whole log."""
        proc = self.procs.pop(key, None)
        if proc is None:
            return None, ""
        code = asyncio.run(proc.stop(grace_s))
        return code, proc.log_text()

    def stop_all(self) -> None:
        """Stop every engine this agent started (its end, however it comes)."""
        procs, self.procs = list(self.procs.values()), {}
        for proc in procs:
            if proc.pid is not None:
                stop_group(proc.pid, STOP_ALL_GRACE_S)

    def __del__(self) -> None:
        if getattr(self, "procs", None):
            self.stop_all()


def remote_class() -> Any:
    """`NodeAgent` as a Ray actor class: no CPU of its own (the engines are not Ray tasks),
    never restarted (a restarted agent would not know its engines)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
