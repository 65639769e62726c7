"""A sweep: one level per concurrency (or rate, user count, trace cap), one notebook row and one
per-request file each.

Before the first level, what every level shares is prepared once (`inputs`: the prompts'
sizing, a trace's or random prompts' token pool, the server that makes them text); each level
then runs in turn (`level`: warm-up, the measured requests between two /metrics scrapes, the
per-request file and the row), with its prompts and request bytes from `payloads`. Each row
is handed to `on_row` as soon as its level ends, so an interrupted sweep keeps every level it
measured, and each row names the engines behind the URL as they stated themselves at the
start (`instances`). The API key is used for the requests, the scrape, /tokenize and
/detokenize, and appears in no row.

A level runs the spec's workload: the prompt set or random prompts of `random_input_len` of the
served model's tokens drawn from the trace's token pool (closed loop, or open loop at `rate`,
one level per rate of `rates`; sent as their token ids, or as the server's text of them with
`prompt_form` text, `textform`), user sessions (`sessions.SessionRun`: the level is the number
of users, each turn built from the real replies so far), a trace (`trace`: its requests as token
prompts, released at its own times) or the user's dataset (`dataset`: its prompts as a prompt
set's, its conversations as user sessions; the warm-up asks short questions of its own).

`run_level` runs one level alone, as a sweep runs it, and returns its row.

Deliberately not here: what one level does (`level`), its prompts (`payloads`) and the
sweep's shared inputs (`inputs`). `BLOCK`, `MIN_REQUESTS`, `WARMUP_OFFSET`, `LoadSpec` and
`default_requests` are `spec`'s, re-exported here for the callers that take them from the
sweep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from kvlab.loadgen import instances, workloads
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.inputs import Inputs, prepare_inputs
from kvlab.loadgen.level import Row, measure_level
from kvlab.loadgen.runner import Progress
from kvlab.loadgen.spec import BLOCK, MIN_REQUESTS, WARMUP_OFFSET, LoadSpec, default_requests

ProgressHook = Callable[[int, int], Progress | None]  # (concurrency, requests) -> per-record
__all__ = ["BLOCK", "MIN_REQUESTS", "WARMUP_OFFSET", "LoadSpec", "default_requests"]


@dataclass
class SweepResult:
    rows: list[Row]
    interrupted: bool = False


def metrics_client(spec: LoadSpec, api_key: str = "") -> httpx.AsyncClient | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(timeout=10.0, trust_env=False, headers=headers) \
        if spec.scrape_metrics else None


def level_total(spec: LoadSpec, level: int, inputs: Inputs) -> int:
    """The requests a level's progress bar counts to: a trace's requests, else its floor."""
    return len(inputs.trace.requests) if inputs.trace is not None else spec.floor(level)


async def run_sweep(spec: LoadSpec, *, api_key: str = "", stop: asyncio.Event | None = None,
                    progress: ProgressHook | None = None,
                    on_row: Callable[[Row], object] | None = None) -> SweepResult:
    """Every level in order; stops after the level during which `stop` was set. Each row
    names the engines behind the URL as they stated themselves at the start."""
    target = Endpoint.from_url(spec.base_url)
    out = SweepResult(rows=[])
    spec = await instances.with_engines(spec, api_key)
    inputs = await prepare_inputs(spec, api_key)
    client = metrics_client(spec, api_key)
    try:
        for i, (level, rate) in enumerate(spec.points()):
            level_spec = replace(spec, rate=rate) if spec.rates else spec
            hook = progress(level, level_total(spec, level, inputs)) \
                if progress is not None else None
            row = (await measure_level(level_spec, target, level, i, api_key=api_key,
                                       stop=stop, progress=hook, client=client,
                                       inputs=inputs)).row
            out.rows.append(row)
            if on_row is not None:
                on_row(row)
            if row.interrupted or (stop is not None and stop.is_set()):
                out.interrupted = True
                break
    finally:
        if client is not None:
            await client.aclose()
    return out


async def run_level(spec: LoadSpec, target: Endpoint, concurrency: int, level_index: int, *,
                    api_key: str = "", stop: asyncio.Event | None = None,
                    progress: Progress | None = None,
                    client: httpx.AsyncClient | None = None,
                    sizing: workloads.Sizing | None = None) -> Row:
    """Run one level (warm-up, then the measured requests) and return its row."""
    inputs = Inputs(sizing or spec.sizing or workloads.ESTIMATE)
    return (await measure_level(spec, target, concurrency, level_index, api_key=api_key,
                                stop=stop, progress=progress, client=client,
                                inputs=inputs)).row
