"""Topology, connector and link: recorded on every load and link row, and the report places a
split run by them alone (a row that recorded none never lands in "Two machines")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fakes.fault_upstream import FaultUpstream
from kvlab.experiments import split as disagg
from kvlab.loadgen import sidechannel, topology
from kvlab.loadgen.topology import Known
from kvlab.observe import netdev
from kvlab.proxy import ProxyConfig, running
from kvlab.records import notebook
from kvlab.records.evidence import Percentiles, SideChannel, Where
from kvlab.records.models import LinkRecord, LoadRecord, NotRunRecord
from kvlab.report import build as report
from perrequest import where_fields

LAB = notebook.LAB_PD


def test_kvlab_run_disagg_and_manual_runs_record_the_same_fields() -> None:
    derived = topology.derive("http://127.0.0.1:8000/v1", Known(connector="nixl",
                                                                proxy_port=8000))
    stated = {"topology", "single_machine", "hosts", "connector", "link", "topology_from",
              "placement"}  # what every row states, whoever started it
    for where in (disagg.TOPOLOGY, disagg.BASELINE, derived):
        assert isinstance(where, Where)
        assert stated <= where.model_fields_set <= set(topology.FIELDS)
    assert set(topology.FIELDS) <= set(Where.model_fields)
    assert disagg.TOPOLOGY.topology == topology.LOOPBACK
    assert disagg.TOPOLOGY.hosts == {"prefill": "127.0.0.1", "decode": "127.0.0.1",
                                     "proxy": "127.0.0.1"}
    assert disagg.BASELINE.topology == topology.ONE_INSTANCE
    for name in topology.FIELDS:  # declared on the record model, not an untyped extra
        assert name in LoadRecord.model_fields and name in LinkRecord.model_fields


def test_derive_says_only_what_the_url_and_settings_say() -> None:
    proxy = "http://127.0.0.1:8000/v1"
    one = topology.derive(proxy, Known(connector="shared", proxy_port=8000))
    assert (one.topology, one.single_machine, one.link) == ("loopback", True, "loopback")
    assert one.hosts == {"prefill": "127.0.0.1", "decode": "127.0.0.1", "proxy": "127.0.0.1"}
    two = topology.derive(proxy, Known(connector="mooncake", prefill_host="node-a.home.arpa",
                                       decode_host="node-b.home.arpa", proxy_port=8000,
                                       cluster_iface="enp1s0"))
    assert (two.topology, two.single_machine, two.connector, two.link) == (
        "two machines", False, "mooncake", "enp1s0")
    # decode empty = 127.0.0.1 on the proxy's machine, as run-proxy.sh reads it
    half = topology.derive(proxy, Known(prefill_host="node-a.home.arpa", proxy_port=8000))
    assert half.topology == "two machines" and half.hosts["decode"] == "127.0.0.1"
    assert half.link == "unknown"  # no CLUSTER_IFACE: not guessed
    # the legs share a machine that is not the proxy's: the KV stays on one machine
    apart = topology.derive(proxy, Known(prefill_host="node-a", decode_host="node-a",
                                         proxy_port=8000))
    assert (apart.topology, apart.single_machine) == ("loopback", False)
    remote = topology.derive("http://node-c.home.arpa:8000/v1", Known(proxy_port=8000))
    assert (remote.topology, remote.single_machine) == ("loopback", True)
    # not the proxy's port, and no legs named: the machines behind it are unknown
    other = topology.derive("http://127.0.0.1:8100/v1", Known(connector="shared",
                                                              proxy_port=8000))
    assert (other.topology, other.single_machine, other.link) == ("unknown", None, "unknown")
    assert other.hosts == {"url": "127.0.0.1", "prefill": "unknown", "decode": "unknown"}
    # nothing says a split runs behind it: CONNECTOR's default is not its connector (a row
    # against a stock vllm serve said "connector: shared")
    assert other.connector == "unknown"


async def test_kvlab_proxy_names_its_legs() -> None:
    async with FaultUpstream() as prefill, FaultUpstream() as decode:
        config = ProxyConfig(prefill=(prefill.url,), decode=(decode.url,), port=0, compat=None)
        async with running(config) as app:
            legs = await asyncio.to_thread(topology.proxy_legs, app.url + "/v1")
            assert await asyncio.to_thread(topology.proxy_legs, prefill.url + "/v1") == {}
    assert legs == {"prefill": [prefill.url], "decode": [decode.url]}
    # a proxy on any port, known by its legs: both on this machine
    found = topology.derive(app.url + "/v1", Known(connector="shared", proxy_port=1, legs=legs))
    assert found.topology == "loopback" and "/health" in found.topology_from


def _rows(label: str, ttft: float, **where: Any) -> list[LoadRecord]:
    return [LoadRecord(label=label, lab=LAB, concurrency=c, requests=4, ok=4, failed=0,
                       model="m", prompt_set="shared-prefix", max_tokens=8,
                       ttft_s=Percentiles(p50=ttft), tpot_s=Percentiles(p50=0.01),
                       output_tokens_per_s=50.0, **where) for c in (1, 4)]


def _book(tmp_path: Path, *groups: list[LoadRecord]) -> Path:
    path = tmp_path / "labbook.md"
    for rows in groups:
        for row in rows:
            notebook.append(path, row)
    return path


def _pd(path: Path) -> dict[str, list[str]]:
    return {row[0]: row for row in report(path).tables[1].rows}


def test_a_run_with_no_topology_is_never_two_machines(tmp_path: Path) -> None:
    # what kvlab run-load wrote before it recorded topology: nothing at all
    table = _pd(_book(tmp_path, _rows("disagg", 0.3)))
    assert table["Two machines, shared-directory connector"][2].startswith("not measured")
    unknown = table["Split `disagg`, topology unknown (not recorded)"]
    assert unknown[2] == "0.300 / 0.300 (c=1/4)"
    assert "topology unknown (not recorded)" in unknown[9]


def test_rows_go_where_their_connector_and_topology_say(tmp_path: Path) -> None:
    two = where_fields(topology.derive("http://127.0.0.1:8000/v1", Known(
        connector="mooncake", prefill_host="a", decode_host="b", proxy_port=8000,
        cluster_iface="enp1s0")))
    shared = {**two, "connector": "shared"}
    loop = where_fields(topology.derive("http://127.0.0.1:8000/v1", Known(connector="nixl",
                                                                          proxy_port=8000)))
    path = _book(tmp_path, _rows("disagg", 0.5, **two), _rows("disagg-shared", 0.4, **shared),
                 _rows("disagg-loop", 0.2, **loop))
    notebook.append(path, NotRunRecord(label="disagg-nixl", lab=LAB, row="x",
                                       reason="needs RDMA"))
    table = _pd(path)
    # a mooncake run labelled disagg is not the shared-connector row
    assert table["Two machines, shared-directory connector"][2].startswith("0.400")
    assert table["Two machines, shared-directory connector"][1] == (
        "house Ethernet (recorded: enp1s0)")
    assert table["Two machines, NixlConnector"][2] == "not run here: needs RDMA"
    assert table["Two processes on one device"][2].startswith("0.200")
    mooncake = table["Split `disagg`: two machines, mooncake connector"]
    assert mooncake[2].startswith("0.500") and "prefill a, decode b" in mooncake[9]


def test_the_side_channel_diagnosis_in_words() -> None:
    lo = netdev.iface_holding(("127.0.0.1",))
    assert lo is not None
    fine = sidechannel.check("127.0.0.1", "", {lo: 5_000_000, "eth9": 1_000})
    assert isinstance(fine, SideChannel)
    assert fine.iface == lo and str(fine.verdict).endswith(
        "the most of any interface: the traffic took the side channel's network")
    elsewhere = sidechannel.check("127.0.0.1", "", {lo: 1_000, "eth9": 9_000_000})
    assert "but eth9 moved the most, 9.00 MB: the traffic crossed eth9" in str(elsewhere.verdict)
    assert "nothing in any log says so" in str(elsewhere.verdict)
    # the address is on another interface than CLUSTER_IFACE, and that interface did the work
    wrong = sidechannel.check("127.0.0.1", "enp1s0", {lo: 9_000_000, "enp1s0": 2_000},
                              rdma_bytes=0)
    assert wrong.verdict == (
        f"SIDE_CHANNEL_ADDR 127.0.0.1 is on {lo}, which moved 9.00 MB, not CLUSTER_IFACE "
        f"enp1s0, which moved 2.00 KB: the traffic took {lo}, not the cable; a side channel on a "
        "management address works and is slow, and nothing in any log says so; set "
        "SIDE_CHANNEL_ADDR to this machine's address on enp1s0")
    remote = sidechannel.check("192.0.2.7", "", {lo: 1})  # TEST-NET-1: never this machine's
    assert remote.iface is None and "not an address of this machine" in str(remote.verdict)
    rdma = sidechannel.check("127.0.0.1", "", {lo: 10}, rdma_bytes=4_000_000)
    assert str(rdma.verdict).endswith("RDMA ports moved 4.00 MB, which no interface counter "
                                      "shows")
