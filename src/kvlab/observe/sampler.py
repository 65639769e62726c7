"""KV-cache usage over time: a background scrape of an engine's gauges during a workload.

Pressure must be stated, not hoped for; the peak of `vllm:kv_cache_usage_perc` (and the
running/waiting queue) sampled while the load runs is the record of what was reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvlab.observe import metrics


@dataclass
class Samples:
    """(seconds since start, gauge values) pairs."""

    points: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    def peak(self, key: str) -> float | None:
        values = [p[key] for _, p in self.points if key in p]
        return max(values) if values else None

    def as_dict(self) -> dict[str, Any]:
        keys = sorted({k for _, p in self.points for k in p})
        return {"t_s": [round(t, 2) for t, _ in self.points],
                **{k: [p.get(k) for _, p in self.points] for k in keys}}


@contextlib.asynccontextmanager
async def sampling(metrics_url: str, interval_s: float = 0.5) -> AsyncIterator[Samples]:
    """Scrape `metrics_url` every `interval_s` while the block runs."""
    samples = Samples()
    started = time.monotonic()

    async def loop(client: httpx.AsyncClient) -> None:
        while True:
            snap = await metrics.scrape(client, metrics_url)
            if snap is not None:
                gauges = metrics.evidence_deltas(snap, snap)
                point = {k.removesuffix("_end"): float(v) for k, v in gauges.items()
                         if k.endswith("_end")}
                samples.points.append((time.monotonic() - started, point))
            await asyncio.sleep(interval_s)

    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        task = asyncio.create_task(loop(client))
        try:
            yield samples
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
