"""Faults of a run on a Ray cluster, on a real two-node cluster on this machine (Ray's own
`cluster_utils`, each node named by its kvlab-host label) with a fake engine (a small HTTP
server: the fault is the point, not the engine): a host that matches no node and a model
missing on a node are refused before anything starts; an engine lost mid-run ends the run
with one line naming node and role, everything else stopped; a driver killed mid-run leaves
no engine running 30 s later; `kvlab serve --node` serves on its node until stopped, and
refuses to serve there without a key. A store the nodes do not share, and a model missing on
one node only, cannot happen on one machine's one filesystem: those checks run against two
fake nodes whose filesystems are two directories."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from children import running
from kvlab.cluster import nodes
from kvlab.cluster.agent import NodeAgent
from kvlab.cluster.placement import Placement
from kvlab.cluster.session import ClusterSession, Placed
from kvlab.core.errors import EngineError, RefusedError, SettingError
from kvlab.core.settings import Settings
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.engines.ports import port_in_use
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.serve import serve_on_node
from kvlab.records import notebook
from kvlab.records.models import StartupRecord

pytestmark = pytest.mark.cluster

FAKE_ENGINE = """
import sys, http.server
a = sys.argv
host, port = a[a.index("--host") + 1], int(a[a.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
print("fake engine listening on", host, port, flush=True)
http.server.HTTPServer((host, port), H).serve_forever()
"""
DRIVER = """
import asyncio, json, sys
from kvlab.cluster.placement import Placement
from kvlab.core.settings import Settings
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.experiments.lab import Lab, engines
address, fake = sys.argv[1], sys.argv[2]
def plan(role):
    return EnginePlan(engine="fake-engine", role=role, command=(sys.executable, "-c", fake),
                      flags=(Flag("--host", "127.0.0.1"), Flag("--port", "0")))
async def main():
    where = Placement(cluster=address, origin="--cluster", prefill_host="node-a",
                      decode_host="node-b")
    lab = Lab(Settings(), placement=where)
    async with lab.placed(), engines(lab, [plan("prefill"), plan("decode")],
                                         labels=["prefill", "decode"]) as procs:
        print(json.dumps([p.pid for p in procs]), flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two Ray nodes on this machine, one CPU each, named node-a and node-b by label; their
    agents keep logs and PID records in a KVLAB_HOME of their own (the nodes' environment)."""
    import ray
    from ray.cluster_utils import Cluster

    home = os.environ.get("KVLAB_HOME")
    os.environ["KVLAB_HOME"] = str(tmp_path_factory.mktemp("node-home"))
    try:
        c = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "labels": {nodes.LABEL: "node-a"}})
        c.add_node(num_cpus=1, labels={nodes.LABEL: "node-b"})
    finally:
        if home is None:
            del os.environ["KVLAB_HOME"]
        else:
            os.environ["KVLAB_HOME"] = home
    ray.init(address=c.address, log_to_driver=False, logging_level=logging.WARNING)
    yield c.address
    ray.shutdown()
    c.shutdown()


def fake_plan(role: str, model: str = "", python: str = sys.executable) -> EnginePlan:
    return EnginePlan(engine="fake-engine", role=role, command=(python, "-c", FAKE_ENGINE),
                      flags=(Flag("--host", "127.0.0.1"), Flag("--port", "0")), model=model)


def _lab(address: str, prefill: str = "node-a", decode: str = "node-b") -> Lab:
    return Lab(Settings(), placement=Placement(cluster=address, origin="--cluster",
                                               prefill_host=prefill, decode_host=decode))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _lines() -> list[Any]:
    path = Path(Settings().labbook)
    return notebook.read(path).records if path.exists() else []


async def test_a_host_that_matches_no_node_is_refused_before_anything_starts(
        cluster: str) -> None:
    lab = _lab(cluster, prefill="node-c")
    with pytest.raises(RefusedError) as caught:
        async with lab.placed():
            pytest.fail("the run started")
    message = str(caught.value)
    assert message.startswith(f"PREFILL_HOST=node-c matches no node of the Ray cluster at "
                              f"{cluster}; its nodes: ")
    assert "kvlab-host=node-a" in message and "kvlab-host=node-b" in message
    assert lab.cluster is None and _lines() == []


async def test_a_model_missing_on_its_node_is_refused_naming_node_and_path(
        cluster: str) -> None:
    lab = _lab(cluster)
    async with lab.placed():
        with pytest.raises(RefusedError) as caught:
            async with engines(lab, [fake_plan("prefill"),
                                     fake_plan("decode", "/nonexistent/kvlab-model")],
                               labels=["prefill", "decode"]):
                pytest.fail("an engine started")
    assert str(caught.value).startswith("node node-b [")
    assert "(decode): the model /nonexistent/kvlab-model does not exist there" in str(
        caught.value)
    assert _lines() == []  # no startup line: nothing started


async def test_an_engine_lost_mid_run_ends_it_naming_node_and_role(cluster: str) -> None:
    lab = _lab(cluster)
    async with lab.placed():
        started = time.monotonic()
        with pytest.raises(EngineError) as caught:
            async with engines(lab, [fake_plan("prefill"), fake_plan("decode")],
                                     labels=["prefill", "decode"]) as procs:
                prefill, decode = procs
                assert {p.plan.host for p in procs} == {lab.cluster.where("decode").address}
                os.kill(int(decode.pid or 0), signal.SIGKILL)
                await asyncio.sleep(120)  # the step would go on; the watcher ends it
        message = str(caught.value)
        assert time.monotonic() - started < 60
        assert message.startswith("fake-engine (decode) on node node-b [")
        assert "stopped serving during the run (exit -9)" in message and "\n" not in message
        assert "fake engine listening on" in message  # its log, shipped back
        assert _gone(int(prefill.pid or 0))  # everything else stopped
    assert [r.record for r in _lines()] == ["startup", "startup"]


def test_a_killed_driver_leaves_no_engine_running(cluster: str) -> None:
    with running([sys.executable, "-c", DRIVER, cluster, FAKE_ENGINE],
                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as driver:
        try:
            assert driver.stdout is not None
            pids = json.loads(driver.stdout.readline() or "[]")
            assert len(pids) == 2 and not any(_gone(p) for p in pids)
        finally:
            driver.kill()  # SIGKILL: no handler of kvlab's runs
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.5)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


class _Remote:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args)
        return call()


class FakeNode:
    """A node whose filesystem is the directory `root`: every path is looked up under it."""

    def __init__(self, root: Path) -> None:
        self.root, self.real = root, NodeAgent("test")

    def _at(self, path: str) -> str:
        return str(self.root / path.lstrip("/"))

    def __getattr__(self, name: str) -> _Remote:
        calls: dict[str, Callable[..., Any]] = {
            "missing": lambda paths: {k: v for k, v in paths.items()
                                      if not Path(self._at(v)).exists()},
            "make_store": lambda path: self.real.make_store(self._at(path)),
            "write_probe": lambda p, n, t: self.real.write_probe(self._at(p), n, t),
            "read_probe": lambda p, n: self.real.read_probe(self._at(p), n),
            "remove": lambda path, *rest: self.real.remove(self._at(path), *rest)}
        return _Remote(calls[name])


def _session(roots: tuple[Path, Path]) -> ClusterSession:
    where = Placement(cluster="fake:6379", origin="--cluster", prefill_host="a",
                      decode_host="b")
    session = ClusterSession(where, Settings(), "test")
    for setting, name, root, machine in (("PREFILL_HOST", "a", roots[0], "m1"),
                                         ("DECODE_HOST", "b", roots[1], "m2")):
        node = nodes.Node(name * 12, "10.0.0.1", name, {nodes.LABEL: name})
        session.by_name[(setting, name)] = Placed(
            nodes.Resolved(setting, name, node, "10.0.0.1", "its label"), FakeNode(root),
            {"machine_id": machine})
    return session


async def test_a_store_the_nodes_do_not_share_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "kv" / "pd"
    apart = _session((tmp_path / "a", tmp_path / "b"))
    with pytest.raises(RefusedError) as caught:
        await apart.check_shared(store, "prefill", ("decode",))
    assert str(caught.value) == (
        f"the KV store {store} is not shared: a probe file written there on node a "
        f"[aaaaaaaa] (prefill) is not there on node b [bbbbbbbb] (decode); set KV_SHARED_PATH "
        "to a directory on a mount both nodes see (the run makes its store inside it)")
    together = _session((tmp_path / "c", tmp_path / "c"))
    await together.check_shared(store, "prefill", ("decode",))  # one filesystem: accepted
    assert list((tmp_path / "c" / str(store).lstrip("/")).iterdir()) == []  # probe removed


async def test_a_model_on_one_node_only_is_refused_naming_the_other(tmp_path: Path) -> None:
    model = "/models/tiny"
    (tmp_path / "a" / "models" / "tiny").mkdir(parents=True)
    session = _session((tmp_path / "a", tmp_path / "b"))
    prefill, decode = (fake_plan(r, model, python="python3") for r in ("prefill", "decode"))
    await session.check_paths([prefill])  # there on a
    with pytest.raises(RefusedError, match=r"^node b \[bbbbbbbb\] \(decode\): the model "
                                           r"/models/tiny does not exist there; "):
        await session.check_paths([prefill, decode])


async def test_serve_on_a_node_runs_there_until_stopped(
        cluster: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import ray

    where = Placement(cluster=cluster, origin="--cluster", node="node-b")
    with pytest.raises(SettingError, match="export the key its clients will send in "
                                           "LOADTEST_API_KEY"):
        await serve_on_node(Settings(), fake_plan("decode"), where)
    monkeypatch.setenv("LOADTEST_API_KEY", "serve-test-key-3141")
    address = ray.nodes()[0]["NodeManagerAddress"]
    port = NodeAgent("test").free_port(address)
    plan = EnginePlan(**{**fake_plan("decode").__dict__, "port": port,
                         "flags": (Flag("--host", "127.0.0.1"), Flag("--port", str(port)))})
    capsys.readouterr()  # the node's log is echoed to stderr from here on
    task = asyncio.create_task(serve_on_node(Settings(), plan, where))
    for _ in range(180):  # until its startup line is written (90 s at most)
        if _lines() or task.done():
            break
        await asyncio.sleep(0.5)
    (line,) = _lines()
    assert isinstance(line, StartupRecord) and line.node is not None
    assert str(line.node.node).startswith("node-b [") and line.base_url.endswith(f":{port}")
    assert port_in_use(address, port)
    await asyncio.sleep(1.5)  # one round of the log's echo
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "fake engine listening on" in capsys.readouterr().err
    assert not port_in_use(address, port)


async def test_the_run_key_reaches_engines_and_proxy_by_environment_only(
        tmp_path: Path) -> None:
    from kvlab.cluster.runner import place, secret_env

    session = _session((tmp_path, tmp_path))
    session.placement = Placement(cluster="fake:6379", prefill_host="a", decode_host="b",
                                  proxy_node="a")
    session.by_name[("--proxy-node", "a")] = session.by_name[("PREFILL_HOST", "a")]
    free = {"free_port": lambda host: 41000}
    for placed in session.by_name.values():
        placed.agent = type("Ports", (), {"__getattr__": lambda self, n: _Remote(free[n])})()
    engine = EnginePlan(engine="vllm", role="decode", command=("vllm", "serve"),
                        flags=(Flag("--host", "127.0.0.1"), Flag("--port", "8200")))
    proxy = EnginePlan(engine="kvlab-proxy", role="proxy", command=("python", "-m", "kvlab"),
                       flags=(Flag("--host", "127.0.0.1"), Flag("--port", "8000")))
    placed_engine, _ = await place(session, engine)
    placed_proxy, _ = await place(session, proxy)
    assert placed_engine.base_url == placed_proxy.base_url == "http://10.0.0.1:41000"
    assert secret_env(Settings(), placed_engine, session) == {"VLLM_API_KEY": session.api_key}
    assert secret_env(Settings(), placed_proxy, session) == {"LOADTEST_API_KEY":
                                                             session.api_key}
    # a proxy on a node asks its clients for the key too; the plans name variables, no key
    assert placed_proxy.env == {"LOADTEST_API_KEY_ENV": "LOADTEST_API_KEY",
                                "PROXY_API_KEY_ENV": "LOADTEST_API_KEY"}
    assert session.api_key not in json.dumps([placed_engine.as_dict(), placed_proxy.as_dict()])
    assert len(session.api_key) >= 32


async def test_a_placed_engine_advertises_its_own_nodes_address_to_its_peer(
        tmp_path: Path) -> None:
    """NIXL's handshake address (planned as 127.0.0.1) becomes the node's address when the
    engine is placed; the port and the other variables stay."""
    from kvlab.cluster.runner import place

    session = _session((tmp_path, tmp_path))
    for placed in session.by_name.values():
        placed.agent = type("Ports", (), {
            "__getattr__": lambda self, n: _Remote(lambda host: 41000)})()
    engine = EnginePlan(engine="vllm", role="decode", command=("vllm", "serve"),
                        flags=(Flag("--host", "127.0.0.1"), Flag("--port", "8200")),
                        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                             "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "UCX_TLS": "tcp"})
    placed_engine, _ = await place(session, engine)
    assert placed_engine.env == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.1",
                                 "VLLM_NIXL_SIDE_CHANNEL_PORT": "5601", "UCX_TLS": "tcp"}
