"""What a sweep prepares once, before any level.

The prompts' sizing (`sizing`: the engine's own tokenizer through its /tokenize when
`size_prompts`, else the word estimate) and, for a trace or random prompts, the trace read,
the served model's tokens they are drawn from (the engine's /tokenize, `trace`) and, for text
prompts, the server whose /detokenize makes them text (`textform`). The API key is used for
/tokenize and /detokenize and appears in no row.

Deliberately not here: a level's prompts and bytes (`payloads`), running a level (`level`),
and the order of the levels (`sweep`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from kvlab.loadgen import textform, workloads
from kvlab.loadgen import trace as trace_replay
from kvlab.loadgen.oracle_level import History
from kvlab.loadgen.sizing import prompt_sizing, tokenize_urls
from kvlab.loadgen.spec import LoadSpec


@dataclass(frozen=True)
class Inputs:
    """What a sweep prepares once, before any level: the prompts' sizing and, for a trace or
    random prompts, the served model's tokens they are drawn from (and the trace, or the
    server that makes random prompts text)."""

    sizing: workloads.Sizing = workloads.ESTIMATE
    pool: trace_replay.TokenPool | None = None
    trace: trace_replay.Trace | None = None
    detokenizer: textform.Detokenizer | None = None
    # every request the sweep has sent, for the cache oracle of the next level
    history: History = field(default_factory=History)

async def sweep_sizing(spec: LoadSpec, api_key: str = "") -> workloads.Sizing:
    """The spec's sizing, counted by the server's tokenizer when it asks for that."""
    if spec.sizing is not None:
        return spec.sizing
    if not spec.size_prompts or spec.token_prompts or spec.dataset is not None:
        return workloads.ESTIMATE
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers) as client:
        return await prompt_sizing(spec.engine, tokenize_urls(spec), spec.seed,
                                   spec.preamble_tokens, client)


async def prepare_inputs(spec: LoadSpec, api_key: str = "") -> Inputs:
    """The sizing and, for a trace or random prompts, the trace read, their token pool (the
    engine's /tokenize) and, for text prompts, the server whose /detokenize answers, once for
    every level."""
    sizing = await sweep_sizing(spec, api_key)
    if not spec.token_prompts:
        return Inputs(sizing)
    trace = trace_replay.read(spec.trace) if spec.trace is not None else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers) as client:
        pool = await trace_replay.token_pool(
            spec.engine, tokenize_urls(spec), spec.seed, client, tokenizer=spec.tokenizer,
            asked_by="--trace" if spec.trace is not None else "--random-input-len")
    detokenizer = await textform.detokenizer(
        spec.engine, tokenize_urls(spec), spec.model, list(pool.tokens[:textform.SAMPLE_TOKENS]),
        api_key) if spec.text_prompts else None
    return Inputs(sizing, pool, trace, detokenizer)
