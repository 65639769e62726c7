"""Load rows with per-request files, written with `records.requests.write` as a run would, and
the typed parts such rows carry (a pressure plan, a topology)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvlab.records import notebook, requests
from kvlab.records.evidence import Where
from kvlab.records.models import LoadRecord, Percentiles
from kvlab.records.pressure import PressurePlanned


def lognormal(seed: int, n: int, median: float, sigma: float = 0.4) -> list[float]:
    """`n` TTFTs from a lognormal with this median (seeded)."""
    rng = np.random.default_rng(seed)
    return [float(v) for v in rng.lognormal(np.log(median), sigma, n)]


def lines(ttfts: Sequence[float], level: int, repeat: int | None = None, warmup: int = 0,
          failed: int = 0, tokens: int = 16) -> list[requests.RequestLine]:
    """Ok requests with these TTFTs, after `warmup` warm-up requests and before `failed`
    failures (both with absurd TTFTs, so a statistic that counted them would show it)."""
    out = [requests.RequestLine(id=i, level=level, repeat=repeat, warmup=True, status="ok",
                                sent_s=0.0, ttft_s=100.0, tpot_s=1.0, output_tokens=tokens,
                                end_s=100.0) for i in range(warmup)]
    start = 0.0
    for t in ttfts:
        tpot = t / 10
        out.append(requests.RequestLine(
            id=len(out), level=level, repeat=repeat, status="ok", sent_s=start,
            first_token_s=start + t, end_s=start + t + tpot * (tokens - 1), ttft_s=t,
            tpot_s=tpot, output_tokens=tokens, prompt_tokens=1000, cached_tokens=896,
            itl_s=requests.Gaps(n=tokens - 1, p50=tpot, p99=tpot, max=tpot)))
        start += 0.01
    out += [requests.RequestLine(id=len(out) + i, level=level, repeat=repeat, status="failed",
                                 ttft_s=100.0, error="HTTP 500", http_status=500)
            for i in range(failed)]
    return out


def run_row(book: Path, label: str, level: int, ttfts: Sequence[float], *,
            repeat: int | None = None, lab: str = notebook.LAB_PD, warmup: int = 0,
            failed: int = 0, write: bool = True, **extra: Any) -> LoadRecord:
    """A load row whose per-request file holds `ttfts` (appended to `book` if `write`)."""
    name = f"{label}-c{level}" + (f"-r{repeat}" if repeat is not None else "") + ".jsonl"
    relative = f"{requests.REQUESTS_DIR}/{name}"
    digest = requests.write(book.parent / relative,
                            lines(ttfts, level, repeat, warmup=warmup, failed=failed))
    p50 = float(np.median(ttfts))
    row = LoadRecord(label=label, lab=lab, concurrency=level, requests=len(ttfts) + failed,
                     ok=len(ttfts), failed=failed, model="m", prompt_set="shared-prefix",
                     max_tokens=16, prompt_tokens_mean=1000.0,
                     ttft_s=Percentiles(p50=p50, p90=p50, p99=p50, mean=p50),
                     tpot_s=Percentiles(p50=p50 / 10), output_tokens_per_s=160.0 / p50,
                     requests_file=relative, requests_sha256=digest, warmup_requests=warmup,
                     repeat=repeat, **extra)
    if write:
        notebook.append(book, row)
    return row


def plan(oversubscription: float = 3.0, reusable_fraction: float = 0.8,
         **fields: Any) -> PressurePlanned:
    """A pressure plan with these figures; the sizes not given are 0: no cache size a judgement
    goes by, no bytes per token, the cache not fixed in bytes."""
    sizes: dict[str, Any] = {"concurrency": 4, "requests": 48, "conversations": 12,
                             "conversation_tokens": 1000, "working_set_tokens": 12_000,
                             "cache_tokens": 0, "kv_cache_bytes": 0, "bytes_per_token": 0.0}
    return PressurePlanned(oversubscription=oversubscription,
                           reusable_fraction=reusable_fraction, **{**sizes, **fields})


def where_fields(where: Where) -> dict[str, Any]:
    """A topology as a row's keyword arguments (the fields it states)."""
    return where.model_dump(exclude_none=True)
