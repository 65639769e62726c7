"""A level's prompts and its requests' bytes, each from its own index range.

The prompt set's prompts (with the spec's preamble, sizing, conversations and shares), random
prompts' indices and sizes (their tokens come from the sweep's token pool), or the user's
dataset's records; warm-up prompts come from their own range, as do each level's and each
repeat's, so the warm-up warms the server and the shared preamble, never a measured prompt,
and no level resends an earlier one's records until the file runs out. The requests' bytes
are built from them before any clock starts.

Deliberately not here: the token pool and a trace's prompts (`trace`), what a sweep prepares
once (`inputs`), and running a level (`level`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from kvlab.loadgen import dataset, workloads
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.spec import BLOCK, WARMUP_OFFSET, LoadSpec


def level_prompts(spec: LoadSpec, level_index: int, count: int, *, warmup: bool = False,
                  sizing: workloads.Sizing = workloads.ESTIMATE,
                  offset: int = 0) -> list[workloads.Prompt]:
    """A level's prompts (or its warm-up's) from their own index range, from `offset` on
    (random prompts: their indices and sizes; the tokens come from the pool)."""
    if spec.dataset is not None:
        return _dataset_prompts(spec, level_index, count, warmup, offset)
    concurrency = spec.points()[level_index][0]
    if spec.random_input_len is not None:
        first = spec.block(level_index) * BLOCK + (WARMUP_OFFSET if warmup else 0) + offset
        return [workloads.Prompt(first + k, (), document_tokens=spec.input_len(first + k),
                                 max_tokens=spec.output_len(first + k)) for k in range(count)]
    conversations = math.ceil(spec.floor(concurrency) / workloads.DEFAULT_TURNS)
    built = workloads.build(spec.prompt_set, count, seed=spec.seed,
                            preamble_tokens=spec.preamble_tokens,
                            start=spec.block(level_index) * BLOCK
                            + (WARMUP_OFFSET if warmup else 0),
                            sizing=sizing, conversations=max(1, conversations), offset=offset,
                            shares=spec.shares)
    if not spec.output_stddev:
        return built
    return [replace(p, max_tokens=spec.output_len(p.index)) for p in built]


def dataset_first(spec: LoadSpec, level_index: int) -> int:
    """Where in the user's file a level begins: after what the levels and repeats before it
    took, so none resends an earlier one's records until the file runs out."""
    assert spec.dataset is not None
    return spec.block(level_index) * spec.dataset.conversations_for(0, spec.session_floor())


def _dataset_prompts(spec: LoadSpec, level_index: int, count: int, warmup: bool,
                     offset: int) -> list[workloads.Prompt]:
    """A level's records as prompts; its warm-up: short questions of kvlab's own, which no
    record shares."""
    assert spec.dataset is not None
    start = spec.block(level_index) * BLOCK + (WARMUP_OFFSET if warmup else 0) + offset
    if warmup:
        return [workloads.Prompt(start + k, (("system", workloads.SYSTEM_LINE),
                                             ("user", workloads.question(spec.seed, start + k))))
                for k in range(count)]
    first = dataset_first(spec, level_index) + offset
    return [dataset.prompt(spec.dataset.at(first + k), start + k, spec.max_tokens)
            for k in range(count)]


def payloads_of(spec: LoadSpec, target: Endpoint, prompts: list[workloads.Prompt],
                api_key: str = "",
                tokens: Sequence[list[int] | str] | None = None) -> list[tuple[int, bytes]]:
    """(prompt index, request bytes), built before any clock starts (`tokens`: each prompt's
    token ids or their text, for a trace or random prompts)."""
    ids = tokens if tokens is not None else [None] * len(prompts)
    prefix = spec.request_id_prefix
    return [(p.index, target.request_bytes(spec.path, spec.body(p, t), api_key, spec.headers,
                                           f"{prefix}{p.index}" if prefix else ""))
            for p, t in zip(prompts, ids, strict=True)]


def level_payloads(spec: LoadSpec, target: Endpoint, level_index: int,
                   api_key: str = "") -> list[tuple[int, bytes]]:
    """The measured requests of a level at its (least) count, with the estimated sizing."""
    count = spec.floor(spec.points()[level_index][0])
    return payloads_of(spec, target, level_prompts(spec, level_index, count), api_key)
