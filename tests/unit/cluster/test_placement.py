"""Placement on a Ray cluster, without a cluster: names resolved to nodes (or refused naming the
host and listing the nodes), where each role goes, a plan bound to its node, the topology two
Ray nodes record, the report's row for them, and the single-machine path never importing Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvlab.cluster import nodes, placement
from kvlab.cluster.nodes import Node
from kvlab.core.errors import RefusedError, SettingError
from kvlab.core.settings import Settings
from kvlab.engines.plan import EnginePlan, Flag
from kvlab.loadgen import topology
from kvlab.proxy import ProxyArgs
from kvlab.records import notebook
from kvlab.records.evidence import NodeInfo, Percentiles, Where
from kvlab.records.models import LoadRecord, NotRunRecord
from kvlab.report import build as report

DOCS = Path(__file__).resolve().parents[3] / "docs" / "validation"
LAB = notebook.LAB_PD
A = Node("0c9ff01aba76d4896e637fae", "10.0.0.1", "node-a.home.arpa", {"kvlab-host": "pre"})
B = Node("83f2f3dcfc8df69ea8f4f7b8", "10.0.0.2", "node-b")
ONE_BOX = [Node("aaaaaaaa1111", "192.0.2.2", "vm", {"kvlab-host": "node-a"}),
           Node("bbbbbbbb2222", "192.0.2.2", "vm", {"kvlab-host": "node-b"})]


def _lookup(table: dict[str, tuple[str, ...]]) -> nodes.Lookup:
    return lambda name: table.get(name, ())


def test_a_name_matches_a_node_by_label_host_name_address_or_node_id() -> None:
    none = _lookup({})
    assert nodes.resolve("PREFILL_HOST", "pre", [A, B], "head:6379", none).node == A
    assert nodes.resolve("X", "node-a", [A, B], "h", none).matched_by == "its host name"
    assert nodes.resolve("X", "node-a.home.arpa", [A, B], "h", none).node == A
    assert nodes.resolve("X", "10.0.0.2", [A, B], "h", none).node == B
    assert nodes.resolve("X", "83f2f3", [A, B], "h", none).node == B  # an id prefix of 6
    by_dns = nodes.resolve("X", "b.lan", [A, B], "h", _lookup({"b.lan": ("10.0.0.2",)}))
    assert (by_dns.node, by_dns.bind, by_dns.direct) == (B, "10.0.0.2", False)
    # two nodes on one machine: their labels tell them apart
    assert nodes.resolve("DECODE_HOST", "node-b", ONE_BOX, "h", none).node == ONE_BOX[1]


def test_a_direct_name_chooses_the_cable_address() -> None:
    found = nodes.resolve("PREFILL_HOST", "node-a-direct.home.arpa", [A, B], "h",
                          _lookup({"node-a-direct.home.arpa": ("10.9.9.1",)}))
    assert (found.node, found.bind, found.direct) == (A, "10.9.9.1", True)
    with pytest.raises(RefusedError, match="does not resolve to an address here"):
        nodes.resolve("PREFILL_HOST", "node-a-direct", [A, B], "h", _lookup({}))


def test_no_node_or_several_are_refused_naming_the_host_and_listing_the_nodes() -> None:
    with pytest.raises(RefusedError) as caught:
        nodes.resolve("DECODE_HOST", "node-c", [A, B], "10.0.0.1:6379", _lookup({}))
    message = str(caught.value)
    assert message.startswith("DECODE_HOST=node-c matches no node of the Ray cluster at "
                              "10.0.0.1:6379")
    assert "node-a.home.arpa 10.0.0.1 [0c9ff01a], kvlab-host=pre" in message
    assert "node-b 10.0.0.2 [83f2f3dc]" in message and "\n" not in message
    with pytest.raises(RefusedError, match="matches 2 nodes"):
        nodes.resolve("PREFILL_HOST", "vm", ONE_BOX, "h", _lookup({}))
    dead = Node(B.node_id, B.address, B.hostname, alive=False)
    with pytest.raises(RefusedError, match=r"\(dead\)"):
        nodes.resolve("DECODE_HOST", "node-b", [A, dead], "h", _lookup({}))


def test_ray_nodes_entries_are_read_as_listed() -> None:
    entry = {"NodeID": "ff" * 28, "NodeManagerAddress": "192.0.2.2", "Alive": True,
             "NodeManagerHostname": "vm", "Labels": {"ray.io/node-id": "x", "kvlab-host": "a"}}
    (node,) = nodes.from_ray([entry])
    assert (node.hostname, node.labels, node.name) == ("vm", {"kvlab-host": "a"},
                                                       "a [ffffffff]")


def test_where_each_role_goes() -> None:
    s = Settings(prefill_host="node-a", decode_host="node-b")
    assert placement.from_options(s, environ={}) == placement.LOCAL
    split = placement.from_options(s, "head:6379", proxy_node="node-c", environ={})
    assert [split.target(r) for r in ("prefill", "shared-a", "decode", "baseline", "proxy")] \
        == [("PREFILL_HOST", "node-a"), ("PREFILL_HOST", "node-a"), ("DECODE_HOST", "node-b"),
            ("DECODE_HOST", "node-b"), ("--proxy-node", "node-c")]
    one = placement.from_options(Settings(), node="gpu-box",
                                 environ={placement.RAY_ADDRESS: "head:6379"})
    assert (one.origin, one.target("offload"), one.target("proxy")) == (
        "RAY_ADDRESS", ("--node", "gpu-box"), None)
    assert one.targets() == [("--node", "gpu-box")]


def test_a_cluster_run_that_cannot_say_where_is_refused() -> None:
    with pytest.raises(SettingError, match=r"set both .*or pass --node NAME"):
        placement.from_options(Settings(prefill_host="a"), "head:6379", environ={})
    with pytest.raises(SettingError, match="--node names a Ray node, and no cluster is given"):
        placement.from_options(Settings(), node="a", environ={})


def test_a_plan_is_bound_to_its_node_address() -> None:
    plan = EnginePlan(engine="vllm", role="decode", command=("vllm", "serve"),
                      flags=(Flag("--host", "127.0.0.1"), Flag("--port", "8200"), Flag("--x")),
                      summary=(("listening on", "http://127.0.0.1:8200"),), port=8200)
    bound = placement.rebind(plan, "10.0.0.2", 41000)
    assert bound.argv() == ["vllm", "serve", "--host", "10.0.0.2", "--port", "41000", "--x"]
    assert bound.base_url == "http://10.0.0.2:41000"
    assert dict(bound.summary)["listening on"] == "http://10.0.0.2:41000"


def _node(name: str, machine: str, address: str = "192.0.2.2", **more: Any) -> NodeInfo:
    return NodeInfo.model_validate({"node": name, "node_id": name * 4, "hostname": "vm",
                                    "address": address, "machine_id": machine, "iface": "eth0",
                                    "link_speed_mbps": 10000, **more})


def test_two_ray_nodes_on_one_machine_are_one_machine_by_machine_id() -> None:
    proxy = _node("here", "m1", "127.0.0.1", node_id=None)
    one = topology.ray_split("shared", {"prefill": _node("a", "m1"), "decode": _node("b", "m1"),
                                        "proxy": proxy}, "placed")
    assert (one.topology, one.single_machine, one.same_machine, one.link,
            one.placement, one.link_speed_mbps) == (
        topology.LOOPBACK, True, True, topology.LOOPBACK, "ray", None)
    assert one.topology_from == "placed: two Ray nodes on one machine"
    assert one.model_fields_set == set(topology.FIELDS)  # every topology field stated
    two = topology.ray_split("shared", {"prefill": _node("a", "m1", "10.0.0.1"),
                                        "decode": _node("b", "m2", "10.0.0.2"),
                                        "proxy": proxy}, "placed")
    assert (two.topology, two.single_machine, two.same_machine, two.link,
            two.link_speed_mbps) == (topology.TWO_MACHINES, False, False, "eth0", 10000)
    unknown = topology.ray_split("shared", {"prefill": _node("a", "", "10.0.0.1"),
                                            "decode": _node("b", "m", "10.0.0.2"),
                                            "proxy": proxy}, "placed")
    assert (unknown.topology, unknown.same_machine) == (topology.UNKNOWN, None)


def test_two_ray_nodes_at_one_address_are_one_machine_without_machine_ids() -> None:
    """The x2 H200 has no /etc/machine-id: its two Ray nodes (one per GPU) were recorded as
    'topology unknown' (docs/validation/h200-x2-ray). Their recorded node facts now say one
    machine, two GPUs; a loopback address alone proves nothing."""
    text = (DOCS / "h200-x2-ray" / "notebook.jsonl").read_text().splitlines()
    line = next(json.loads(t) for t in text
                if '"record": "link"' in t and "disagg-nixl-ray-ipc" in t)
    nodes = line["nodes"]
    assert nodes["prefill"]["machine_id"] is None and line["topology"] == topology.UNKNOWN
    now = topology.ray_split("nixl", {role: NodeInfo.model_validate(n)
                                      for role, n in nodes.items()}, "placed")
    assert (now.topology, now.same_machine, now.link) == (
        topology.LOOPBACK, True, topology.LOOPBACK)
    assert now.topology_from == "placed: two Ray nodes on one machine, GPU 0 and GPU 1"
    veth = topology.ray_split("nixl", {"prefill": _node("a", "m1", "10.77.0.1", iface="kv0"),
                                       "decode": _node("b", "m1", "10.77.0.2", iface="kv0"),
                                       "proxy": NodeInfo()}, "placed")
    assert (veth.same_machine, veth.link) == (True, "kv0")  # two namespaces, one link
    here = _node("a", "", "127.0.0.1")
    assert topology.same_machine(here, here.model_copy(update={"node": "b"})) is None


def _rows(label: str, ttft: float, where: Where) -> list[LoadRecord]:
    return [LoadRecord(label=label, lab=LAB, concurrency=c, requests=4, ok=4, failed=0,
                       model="m", prompt_set="shared-prefix", max_tokens=8,
                       ttft_s=Percentiles(p50=ttft), tpot_s=Percentiles(p50=0.01),
                       output_tokens_per_s=50.0).overlay(where) for c in (1, 4)]


def test_the_report_puts_two_ray_nodes_on_one_machine_under_one_machine(tmp_path: Path) -> None:
    proxy = _node("here", "m1", "127.0.0.1", node_id=None)
    where = topology.ray_split("shared", {"prefill": _node("node-a", "m1"),
                                          "decode": _node("node-b", "m1"), "proxy": proxy},
                               "kvlab placed them")
    book = tmp_path / "labbook.md"
    for row in _rows("disagg", 0.2, where):
        notebook.append(book, row)
    table = {row[0]: row for row in report(book).tables[1].rows}
    loop = table["Two processes on one device"]
    assert loop[2].startswith("0.200")
    assert "topology: one machine, two Ray nodes on one machine (prefill node node-a " \
           "(192.0.2.2), decode node node-b (192.0.2.2))" in loop[9]
    assert "two machines" not in loop[9]
    assert table["Two machines, shared-directory connector"][2].startswith("not measured")


def test_the_single_machine_path_never_imports_ray(tmp_path: Path) -> None:
    """With Ray made unimportable, `kvlab run disagg --dry-run` still plans, and nothing
    kvlab imported on the way asked for Ray."""
    code = ("import sys; sys.modules['ray'] = None\n"
            "import json, kvlab.cli\n"
            "try:\n"
            "    kvlab.cli.main(['run', 'disagg', '--dry-run', '--json'])\n"
            "except SystemExit as exc:\n"
            "    assert not exc.code, exc.code\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('ray', "
            "'kvlab.cluster.')) and sys.modules[m] is not None)), file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != placement.RAY_ADDRESS}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    plans = json.loads(done.stdout)["plans"]
    assert [p["label"] for p in plans][:3] == ["prefill", "decode", "proxy"]
    imported = json.loads(done.stderr.strip().splitlines()[-1])
    assert imported == ["kvlab.cluster.placement"]  # data only: no Ray, no agent, no session


def _kvlab(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != placement.RAY_ADDRESS}
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, timeout=120, check=False, env={**base, **env}, cwd=cwd)


def test_a_cluster_dry_run_places_each_plan_on_its_node(tmp_path: Path) -> None:
    """What `kvlab run disagg --cluster ADDRESS --dry-run` prints, from the nodes a survey of
    the cluster found (`test_cluster_live` reads them from a real cluster): prefill on
    PREFILL_HOST's node, decode and the baseline on DECODE_HOST's, each listening on its
    node's address; the proxy where kvlab runs, sending to those addresses; the store inside
    KV_SHARED_PATH, one path for both nodes. It failed before: the plans said 127.0.0.1 and a
    store in /tmp, the single-machine plan."""
    import io

    from rich.console import Console

    from kvlab.cluster.survey import Survey
    from kvlab.experiments import disagg
    from kvlab.experiments.lab import Lab
    from kvlab.report import console_run

    where = placement.Placement(cluster="10.0.0.1:6379", origin="--cluster", prefill_host="pre",
                                decode_host="node-b")
    listed = [A, B]
    survey = Survey(where, (A, B), {t: nodes.resolve(*t, listed, where.cluster, _lookup({}))
                                    for t in where.targets()})
    lab = Lab(Settings(kv_shared_path=str(tmp_path / "mnt"), labbook=str(tmp_path / "book")),
              run_id="<run id>", placement=where, survey=survey)
    found = disagg.dry_run(lab, disagg.DisaggSpec())
    plans = {str(p["label"]): p for p in found}
    store = f"{tmp_path}/mnt/kvlab-<run id>/pd"
    assert plans["prefill"]["node"] == "pre [0c9ff01a] at 10.0.0.1"
    assert plans["decode"]["node"] == plans["baseline"]["node"] == "node-b [83f2f3dc] at 10.0.0.2"
    assert "--host 10.0.0.1 " in str(plans["prefill"]["shell"]) and store in str(
        plans["prefill"]["shell"]) and store in str(plans["decode"]["shell"])
    assert "--host 10.0.0.2 " in str(plans["decode"]["shell"])
    assert '"prefill":["http://10.0.0.1:' in str(plans["proxy"]["shell"])  # its arguments
    assert not (tmp_path / "mnt").exists()  # named, not made
    out = Console(file=io.StringIO(), width=300)
    console_run.plans(out, found)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    lines = text.splitlines()
    assert lines[0] == "==> placement on the Ray cluster at 10.0.0.1:6379 (from --cluster)"
    assert lines[1].startswith("    prefill   pre [0c9ff01a] at 10.0.0.1, http://10.0.0.1:")
    assert lines[1].endswith(" (PREFILL_HOST=pre: its kvlab-host label)")
    assert lines[2].startswith("    decode    node-b [83f2f3dc] at 10.0.0.2, http://10.0.0.2:")
    assert lines[3].startswith("    proxy     where kvlab runs, http://127.0.0.1:")
    assert lines[5] == (f"    store     {store} on pre [0c9ff01a] at 10.0.0.1 and node-b "
                        "[83f2f3dc] at 10.0.0.2: a directory of the run's own inside "
                        "KV_SHARED_PATH")
    assert lines[6] == "    nodes     node-a.home.arpa 10.0.0.1 [0c9ff01a], kvlab-host=pre; " \
        "node-b 10.0.0.2 [83f2f3dc]"
    assert "checked by the run's agents, before any engine starts" in lines[7]
    assert "==> prefill (on pre [0c9ff01a] at 10.0.0.1)" in text


def test_a_cluster_dry_run_refuses_a_cluster_that_is_not_there(tmp_path: Path) -> None:
    """A dry run reads the cluster's nodes, so an address where no cluster answers is refused
    at once, as a run would be (Ray itself would wait minutes)."""
    from kvlab.engines.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    done = _kvlab(["run", "disagg", "--dry-run", "--cluster", address], tmp_path,
                  PREFILL_HOST="node-a", DECODE_HOST="node-b")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot join the Ray cluster at {address} (from --cluster): no answer at " \
        f"{address} (Connection refused)" in done.stderr
    refused = _kvlab(["run", "offload", "--dry-run", "--cluster", "192.0.2.99:6379"], tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "set both" in refused.stderr and "--node NAME" in refused.stderr


def test_a_cluster_run_keeps_its_store_on_the_shared_mount(tmp_path: Path) -> None:
    from kvlab.experiments.lab import Lab

    settings = Settings(kv_shared_path=str(tmp_path / "mnt"))
    on_ray = Lab(settings, run_id="r1", placement=placement.Placement(cluster="h:6379", node="a"))
    assert on_ray.store_path("pd") == tmp_path / "mnt" / "kvlab-r1" / "pd"
    store = on_ray.store("pd")
    assert store.is_dir() and (store.stat().st_mode & 0o777) == 0o700
    on_ray.cleanup()
    assert not (tmp_path / "mnt" / "kvlab-r1").exists() and (tmp_path / "mnt").is_dir()
    here = Lab(settings, run_id="r1")  # this machine: the run's own private store, as before
    assert here.store_path("pd") == settings.paths().store("r1", "pd")


async def test_run_all_on_a_node_records_the_disk_tier_as_not_run_there(tmp_path: Path) -> None:
    """The disk tier times slot files where kvlab runs: placed on a Ray node, `run all` says
    so in a not-run line instead of timing this machine's disk as the node's."""
    from kvlab.experiments import everything
    from kvlab.experiments.lab import Lab

    book = tmp_path / "book.md"
    lab = Lab(Settings(labbook=str(book)), placement=placement.Placement(cluster="10.0.0.1:6379",
                                                                         node="gpu-box"))
    written = await everything.run(lab, everything.AllSpec.quick("mixed", ("disk",)))
    assert [r.record for r in written] == ["not-run"]
    assert isinstance(written[0], NotRunRecord)
    assert written[0].reason == everything.NOT_PLACED
    assert lab.outcomes["disk"]["not_run"] == everything.NOT_PLACED
    assert notebook.read(book).records[0].label == written[0].label


C = Node("c1c1c1c1c1c1c1c1c1c1c1c1", "10.0.0.3", "node-c")
D = Node("d4d4d4d4d4d4d4d4d4d4d4d4", "10.0.0.4", "node-d")
XPYD = Settings(prefill_hosts="pre,node-c", decode_hosts="node-b,node-d")


def test_xpyd_places_one_engine_per_listed_node() -> None:
    where = placement.from_options(XPYD, "head:6379", environ={})
    assert where.counts() == (2, 2)
    assert where.split_roles() == ("prefill", "prefill-2", "decode", "decode-2")
    assert [where.target(r) for r in (*where.split_roles(), "baseline")] == [
        ("PREFILL_HOSTS", "pre"), ("PREFILL_HOSTS", "node-c"), ("DECODE_HOSTS", "node-b"),
        ("DECODE_HOSTS", "node-d"), ("DECODE_HOSTS", "node-b")]  # the baseline: the first
    assert where.targets() == [("PREFILL_HOSTS", "pre"), ("PREFILL_HOSTS", "node-c"),
                               ("DECODE_HOSTS", "node-b"), ("DECODE_HOSTS", "node-d")]
    # the single names keep working, as one of each; this machine runs one of each
    single = placement.from_options(Settings(prefill_host="pre", decode_host="node-b"),
                                    "head:6379", environ={})
    assert (single.split_roles(), single.targets()) == (
        ("prefill", "decode"), [("PREFILL_HOST", "pre"), ("DECODE_HOST", "node-b")])
    assert placement.from_options(XPYD, environ={}).counts() == (1, 1)
    one_list = placement.from_options(Settings(prefill_hosts="pre", decode_host="node-b"),
                                      "head:6379", environ={})
    assert one_list.targets() == [("PREFILL_HOSTS", "pre"), ("DECODE_HOST", "node-b")]


def test_a_listed_name_matching_no_node_is_refused_naming_the_list() -> None:
    where = placement.from_options(Settings(prefill_hosts="pre,node-z", decode_hosts="node-b"),
                                   "10.0.0.1:6379", environ={})
    with pytest.raises(RefusedError) as caught:
        for target in where.targets():
            nodes.resolve(*target, [A, B, C, D], where.cluster, _lookup({}))
    message = str(caught.value)
    assert message.startswith("PREFILL_HOSTS=node-z matches no node of the Ray cluster at "
                              "10.0.0.1:6379; its nodes: node-a.home.arpa 10.0.0.1")
    assert "node-d 10.0.0.4 [d4d4d4d4]" in message and "\n" not in message


def _xpyd_lab(tmp_path: Path, **settings: Any) -> Any:
    from kvlab.cluster.survey import Survey
    from kvlab.experiments.lab import Lab

    s = Settings(kv_shared_path=str(tmp_path / "mnt"), labbook=str(tmp_path / "book"),
                 prefill_hosts="pre,node-c", decode_hosts="node-b,node-d", **settings)
    where = placement.from_options(s, "10.0.0.1:6379", environ={})
    listed = [A, B, C, D]
    survey = Survey(where, tuple(listed), {t: nodes.resolve(*t, listed, where.cluster,
                                                            _lookup({}))
                                           for t in where.targets()})
    return Lab(s, run_id="<run id>", placement=where, survey=survey)


def test_an_xpyd_dry_run_places_every_engine_and_gives_the_proxy_every_leg(
        tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from kvlab.experiments import disagg
    from kvlab.report import console_run

    found = disagg.dry_run(_xpyd_lab(tmp_path), disagg.DisaggSpec(balance="least-outstanding"))
    plans = {str(p["label"]): p for p in found}
    assert list(plans) == ["placement", "prefill", "prefill-2", "decode", "decode-2", "proxy",
                           "baseline", "disagg-two-machines", "disagg-nixl"]
    at = {label: str(plans[label]["node"]) for label in list(plans)[1:7]}
    assert at == {"prefill": "pre [0c9ff01a] at 10.0.0.1",
                  "prefill-2": "node-c [c1c1c1c1] at 10.0.0.3",
                  "decode": "node-b [83f2f3dc] at 10.0.0.2",
                  "decode-2": "node-d [d4d4d4d4] at 10.0.0.4",
                  "proxy": "where kvlab runs", "baseline": "node-b [83f2f3dc] at 10.0.0.2"}
    given = _proxy_args(plans["proxy"])
    assert [u.split(":")[1] for u in given.prefill] == ["//10.0.0.1", "//10.0.0.3"]
    assert [u.split(":")[1] for u in given.decode] == ["//10.0.0.2", "//10.0.0.4"]
    assert given.balance == "least-outstanding"
    for label in ("prefill-2", "decode-2"):  # each its side's engine, on its own node
        assert plans[label]["plan"]["role"] == label  # type: ignore[index]
        assert "--kv-transfer-config" in str(plans[label]["shell"])
    where = plans["placement"]["placement"]
    assert isinstance(where, placement.DryPlacement)
    assert [r.role for r in where.roles] == ["prefill", "prefill-2", "decode", "decode-2",
                                             "proxy", "baseline"]
    assert where.roles[1].named_by == "PREFILL_HOSTS=node-c: its host name"
    assert len(where.store_seen_by) == 4
    out = Console(file=io.StringIO(), width=300)
    console_run.plans(out, found)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "    prefill-2 node-c [c1c1c1c1] at 10.0.0.3, http://10.0.0.3:" in text
    assert "    decode-2  node-d [d4d4d4d4] at 10.0.0.4, http://10.0.0.4:" in text


def _proxy_args(planned: dict[str, object]) -> ProxyArgs:
    """The arguments an experiment's proxy process is given (`python -m kvlab.proxy JSON`)."""
    argv = planned["plan"]["argv"]  # type: ignore[index]
    return ProxyArgs.model_validate_json(next(a for a in argv if a.startswith("{")))


def test_xpyd_prefix_affinity_gives_the_proxy_the_tokenizer(tmp_path: Path) -> None:
    from kvlab.experiments import disagg

    found = disagg.dry_run(_xpyd_lab(tmp_path, small_model="/models/tiny"),
                           disagg.DisaggSpec(balance="prefix-affinity"))
    given = _proxy_args(next(p for p in found if p["label"] == "proxy"))
    assert given.tokenizer == "/models/tiny" and given.block_tokens > 1


def test_xpyd_runs_the_load_part_only(tmp_path: Path) -> None:
    from kvlab.experiments import disagg

    with pytest.raises(SettingError, match=r"^--part cancel and --part boundary run on one "
                       "prefill and one decode"):
        disagg.dry_run(_xpyd_lab(tmp_path), disagg.DisaggSpec(parts=("load", "cancel")))


def test_the_disagg_balance_choices_are_the_proxys() -> None:
    from typing import get_args

    from kvlab.proxy import Balance
    from kvlab.proxy.legs import BALANCES

    assert get_args(Balance) == BALANCES


def test_each_leg_of_a_split_has_its_requests_and_bytes() -> None:
    from kvlab.engines import startup
    from kvlab.measure import leg_bytes, link_bytes
    from kvlab.records.models import LinkRecord
    from kvlab.records.pd import PredictionRecord

    urls = {r: f"http://10.0.0.{i}:8000/metrics"
            for i, r in enumerate(("prefill", "prefill-2", "decode", "decode-2"), 1)}
    deltas = {urls["prefill"]: {"requests_succeeded": 3, "prompt_tokens": 300,
                                "prompt_tokens_local_compute": 300},
              urls["prefill-2"]: {"requests_succeeded": 2, "prompt_tokens": 200,
                                  "prompt_tokens_local_compute": 200},
              urls["decode"]: {"requests_succeeded": 4, "prompt_tokens": 400,
                               "prompt_tokens_local_compute": 16,
                               "prompt_tokens_external_kv_transfer": 384},
              urls["decode-2"]: {"requests_succeeded": 1, "prompt_tokens": 100,
                                 "prompt_tokens_local_compute": 84,
                                 "prompt_tokens_external_kv_transfer": 16}}
    link = LinkRecord(label="disagg", lab=LAB, legs=urls, metric_deltas=deltas,
                      connector="shared")
    prediction = PredictionRecord(label="prediction", lab=LAB, bytes_per_token=10.0,
                                  prompt_tokens=100, payload_bytes=1000.0)
    legs = leg_bytes.per_leg(link, prediction, {"prefill": "pre [0c9ff01a]"})
    assert [(g.role, g.requests, g.predicted_bytes, g.observed_bytes, g.observed_from)
            for g in legs] == [("prefill", 3, 3000, None, None),
                               ("prefill-2", 2, 2000, None, None),
                               ("decode", 4, 4000, 3840, "loaded_tokens"),
                               ("decode-2", 1, 1000, 160, "loaded_tokens")]
    assert legs[0].node == "pre [0c9ff01a]" and legs[1].node is None
    assert leg_bytes.line(legs[0]) == ("leg prefill on pre [0c9ff01a]: 3 requests; KV "
                                       "predicted 3.00 KB, moved none counted by it")
    assert leg_bytes.line(legs[3]).endswith("1 requests; KV predicted 1.00 KB, moved 160 B by "
                                            "loaded_tokens")
    link.per_leg = legs
    assert LinkRecord.model_validate_json(link.model_dump_json()).per_leg == legs
    assert LinkRecord(label="x", lab=LAB).per_leg is None  # older lines read as before
    # every decode leg counts in what decode computed itself: 100 of 500 prompt tokens
    assert link_bytes._decode_computed_share(link) == pytest.approx(0.2)
    assert startup.lab_for("decode-2") == LAB == startup.lab_for("prefill")


def test_run_all_on_xpyd_runs_the_split_under_load_only(tmp_path: Path) -> None:
    from kvlab.experiments import disagg
    from kvlab.experiments.lab import Lab
    from kvlab.experiments.sizes import AllSpec

    assert disagg.all_spec(_xpyd_lab(tmp_path), AllSpec.quick("mixed")).parts == ("load",)
    one = disagg.all_spec(Lab(Settings()), AllSpec.quick("mixed"))
    assert one.parts == ("load", "cancel", "boundary")
