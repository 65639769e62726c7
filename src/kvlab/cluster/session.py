"""One run's connection to a Ray cluster: its agents, their facts, the checks before anything
starts, the run's API key.

`open()` joins the cluster (`ray.init(address=...)`: kvlab never starts or stops one), lists
its nodes, resolves every name the placement uses to one node (refused, naming the host and
listing the nodes, before anything starts), puts one agent on each node used, and asks each
for its facts: host name, machine id, interfaces and their speeds, kvlab's version (refused
when it differs from the driver's). Then, still before any engine starts:

- `check_paths`: each plan's engine command and model path exist on the node it goes to;
- `check_shared`: a KV store directory is one directory for the nodes that use it (a probe
  file written on the writer's node is read back on each other node's).

Engines on a cluster listen on their node's address, beyond loopback, so a run has an API key:
the one LOADTEST_API_KEY_ENV names, or one generated for the run and put, while the session is
open, in that variable of this process (the seed's place for it), so the load generator, the
proxy and every step read it as they read a key the user set. Engines get it in their
environment (the variable their engine reads), never in argv; it is never written down.
`close()` stops what the agents still run, ends them, leaves the cluster, and takes the
generated key out of the environment.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from kvlab.cluster import nodes
from kvlab.cluster.agent import NodeFacts, machine_id, remote_class
from kvlab.cluster.placement import Placement
from kvlab.core import (
    VERSION,
    EngineError,
    KvlabError,
    RefusedError,
    Say,
    SettingError,
    Settings,
    quiet,
)
from kvlab.engines import EnginePlan
from kvlab.loadgen import topology
from kvlab.records import NodeInfo, Where

PROBE = ".kvlab-shared-probe-"
REACH_TIMEOUT_S = 5.0  # a GCS that does not answer a connect by then is not there
DEFAULT_KEY_VAR = "LOADTEST_API_KEY"  # the seed's name, when LOADTEST_API_KEY_ENV is empty


@dataclass
class Placed:
    """A node a run uses: how it was named, its agent, what the agent said about it."""

    resolved: nodes.Resolved
    agent: Any  # the Ray actor handle
    facts: NodeFacts | None = None  # once joined

    @property
    def name(self) -> str:
        return self.resolved.node.name

    @property
    def address(self) -> str:
        """Where this node's engines listen (the cable's address for a -direct name)."""
        return self.resolved.bind

    @property
    def iface(self) -> str | None:
        """The node's interface holding that address."""
        return self.facts.iface_of(self.address) if self.facts else None

    def describe(self) -> NodeInfo:
        """What every row records about the node."""
        iface, facts = self.iface, self.facts
        return NodeInfo(node=self.name, node_id=self.resolved.node.node_id,
                        hostname=facts.hostname if facts else self.resolved.node.hostname,
                        address=self.address, machine_id=facts.machine_id if facts else None,
                        iface=iface,
                        link_speed_mbps=facts.speeds.get(iface) if facts and iface else None,
                        named_by=f"{self.resolved.setting}={self.resolved.name} "
                                 f"({self.resolved.matched_by})",
                        gpus=facts.gpus if facts else None)


class ClusterSession:
    """The cluster side of one `kvlab run` or `kvlab serve --node`."""

    def __init__(self, placement: Placement, settings: Settings, run_id: str,
                 say: Say = quiet) -> None:
        self.placement, self.settings, self.run_id, self.say = placement, settings, run_id, say
        self.by_name: dict[tuple[str, str], Placed] = {}
        self.key_var = settings.loadtest_api_key_env or DEFAULT_KEY_VAR
        self.api_key = settings.api_key() or secrets.token_urlsafe(32)
        self._key_set = not settings.api_key()  # generated: in the environment while open
        self.stores: list[tuple[Placed, str]] = []
        self._joined = False

    async def open(self) -> None:
        """Join the cluster, resolve every name, start and ask one agent per node used."""
        if self._key_set:
            os.environ[self.key_var] = self.api_key
            self.say(f"    API key: generated for this run (in {self.key_var} while it runs; "
                     "never written)")
        self._joined = join(self.placement, f"kvlab-{self.run_id}")
        listed = nodes.from_ray(ray.nodes())  # type: ignore[no-untyped-call]
        where = self.placement.cluster
        resolved = [nodes.resolve(setting, name, listed, where)
                    for setting, name in self.placement.targets()]
        agents: dict[str, Placed] = {}
        for r in resolved:  # one agent per node, however many names point at it
            if r.node.node_id not in agents:
                agents[r.node.node_id] = Placed(r, self._agent(r.node))
            self.by_name[(r.setting, r.name)] = Placed(r, agents[r.node.node_id].agent)
        facts: dict[str, NodeFacts] = {nid: await self.call(p, "facts")
                                       for nid, p in agents.items()}
        for placed in self.by_name.values():
            placed.facts = facts[placed.resolved.node.node_id]
            self._check_node(placed)
        for role in (*self.placement.split_roles(), "proxy"):
            if (p := self.where(role)) is not None:
                self.say(f"    {role}: node {p.name} at {p.address} "
                         f"({p.resolved.setting}={p.resolved.name})")

    def _agent(self, node: nodes.Node) -> Any:
        """The node's agent, holding all of the node's GPUs: Ray then sets CUDA_VISIBLE_DEVICES
        to them for the agent and its engines (an actor that asks for none sees none)."""
        strategy = NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
        return remote_class().options(scheduling_strategy=strategy,
                                      num_gpus=node.gpus).remote(self.run_id)

    def _check_node(self, placed: Placed) -> None:
        version = placed.facts.kvlab_version if placed.facts else None
        if version != VERSION:
            raise RefusedError(f"node {placed.name} runs kvlab {version}, this machine "
                               f"{VERSION}: install the same kvlab on every node")
        if placed.iface is None:
            held = placed.facts.addresses() if placed.facts else []
            raise RefusedError(
                f"{placed.resolved.setting}={placed.resolved.name}: node {placed.name} holds "
                f"no interface with address {placed.address} (it has {', '.join(held)}); name "
                "the node by an address it holds")

    def where(self, role: str) -> Placed | None:
        """The node `role` goes to; None: where kvlab runs."""
        target = self.placement.target(role)
        return self.by_name[target] if target is not None else None

    def node_facts(self, role: str) -> NodeInfo:
        """What rows record about where `role` ran: its node, or where kvlab runs (always so
        for `client`, the load generator)."""
        placed = None if role == "client" else self.where(role)
        if placed is not None:
            return placed.describe()
        return NodeInfo(node="where kvlab runs", hostname=socket.gethostname(),
                        address="127.0.0.1", machine_id=machine_id())

    def same_machine(self, a: str, b: str) -> bool | None:
        """Whether roles `a` and `b` run on one machine (by machine id, else by address;
        None: not known)."""
        return topology.same_machine(self.node_facts(a), self.node_facts(b))

    def split_topology(self, connector: str, how: str) -> Where:
        """The topology fields of a split placed on this cluster."""
        nodes = {r: self.node_facts(r) for r in ("prefill", "decode", "proxy")}
        return topology.ray_split(connector, nodes, how)

    def instance_topology(self, role: str, how: str) -> Where:
        """The topology fields of one engine (`role`) on this cluster, loaded from here."""
        nodes = {"instance": self.node_facts(role), "client": self.node_facts("client")}
        return topology.ray_instance(nodes, how)

    def placed(self, roles: tuple[str, ...]) -> dict[str, Placed]:
        """The nodes `roles` run on, by role (a role that runs where kvlab runs has none)."""
        return {r: p for r in roles if (p := self.where(r)) is not None}

    async def call(self, placed: Placed, method: str, *args: Any) -> Any:
        """One call to a node's agent; its errors as kvlab's, naming the node."""
        try:
            return await getattr(placed.agent, method).remote(*args)
        except RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, KvlabError):
                raise type(cause)(f"node {placed.name}: {cause}") from None
            raise EngineError(f"node {placed.name}: the kvlab agent failed in {method}: "
                              f"{_first_line(cause or exc)}") from None
        except RayActorError as exc:
            raise EngineError(f"node {placed.name}: its kvlab agent is gone (the node or its "
                              f"Ray worker died): {_first_line(exc)}") from None

    async def check_paths(self, plans: list[EnginePlan]) -> None:
        """Refuse a plan whose engine or model is missing on its node, naming both."""
        for plan in plans:
            placed = self.where(plan.role)
            if placed is None:
                continue
            # paths only: a model id (Qwen/Qwen3-8B) or a command on PATH is not checked
            wanted = {k: v for k, v in (("the engine", plan.command[0]),
                                        ("the model", plan.model)) if v.startswith("/")}
            missing = await self.call(placed, "missing", wanted)
            for what, path in missing.items():
                raise RefusedError(
                    f"node {placed.name} ({plan.role}): {what} {path} does not exist there; "
                    "install kvlab's engines and models at the same paths on every node "
                    "(`kvlab engines install`, `kvlab models tiny`), or set MODEL/SMALL_MODEL "
                    "and VLLM_CMD to paths every node has")

    async def check_shared(self, store: Path, writer: str, readers: tuple[str, ...]) -> None:
        """Refuse a store that is not one directory for the writer's and readers' nodes."""
        first = self.where(writer)
        if first is None:
            return
        await self.call(first, "make_store", str(store))
        self.stores.append((first, str(store)))
        name, token = PROBE + uuid.uuid4().hex[:8], uuid.uuid4().hex
        await self.call(first, "write_probe", str(store), name, token)
        try:
            for role in readers:
                other = self.where(role)
                if other is None or other.resolved.node.node_id == first.resolved.node.node_id:
                    continue
                if await self.call(other, "read_probe", str(store), name) != token:
                    raise RefusedError(
                        f"the KV store {store} is not shared: a probe file written there on "
                        f"node {first.name} ({writer}) is not there on node {other.name} "
                        f"({role}); set KV_SHARED_PATH to a directory on a mount both nodes "
                        "see (the run makes its store inside it)")
        finally:
            await self.call(first, "remove", str(store / name))

    def track_stores(self, placed: Placed, paths: list[str]) -> None:
        """Stores of the run an engine on `placed` creates there: removed there at the end."""
        for path in paths:
            known = {(p.resolved.node.node_id, s) for p, s in self.stores}
            if (placed.resolved.node.node_id, path) not in known:
                self.stores.append((placed, path))

    async def close(self) -> None:
        """Remove the run's stores, stop what the agents run, end them, leave the cluster."""
        agents = {p.resolved.node.node_id: p for p in self.by_name.values()}
        for placed, path in self.stores:
            await self._quietly(placed, "remove", path, True)
        for placed in agents.values():
            await self._quietly(placed, "stop_all")
            ray.kill(placed.agent, no_restart=True)
        self.by_name.clear()
        if self._joined:
            ray.shutdown()
            self._joined = False
        if self._key_set and os.environ.get(self.key_var) == self.api_key:
            del os.environ[self.key_var]

    async def _quietly(self, placed: Placed, method: str, *args: Any) -> None:
        try:
            await self.call(placed, method, *args)
        except (KvlabError, RayError) as exc:  # cleanup goes on; the agent's end stops engines
            self.say(f"    node {placed.name}: {method} failed at the end: {exc}")


def join(placement: Placement, namespace: str = "kvlab") -> bool:
    """Join the placement's cluster (never start one); whether this call joined (False: a
    caller, a test or a notebook, had joined already). An address that does not answer a
    connect within REACH_TIMEOUT_S is refused at once: Ray itself would wait minutes."""
    if ray.is_initialized():
        return False
    why = _unreachable(placement.cluster)
    term = signal.getsignal(signal.SIGTERM)
    try:
        if why:
            raise ConnectionError(why)
        ray.init(address=placement.cluster, log_to_driver=False,
                 logging_level=logging.WARNING, namespace=namespace)
        # Ray's crash handler takes SIGTERM and dies on it: give it back to whoever had it
        # (`kvlab serve --node` stops its engine on SIGTERM, as `kvlab serve` does)
        if term is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, term)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise SettingError(
            f"cannot join the Ray cluster at {placement.cluster} (from {placement.origin}): "
            f"{str(exc).splitlines()[0][:200]}; start it with `ray start --head` on one "
            "machine and `ray start --address HEAD:6379` on the others (kvlab never starts "
            "one)") from None
    return True


def _unreachable(address: str) -> str:
    """Why a HOST:PORT address cannot be joined ("" when it answers, or is not of that form:
    `auto`, `ray://...`, which Ray resolves itself)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in address:
        return ""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), REACH_TIMEOUT_S):
            return ""
    except OSError as exc:
        return f"no answer at {address} ({exc.strerror or 'timed out'})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
