"""The sizes `kvlab run all` gives every experiment: the labs' own, or small ones for CI and a
first look (`--quick`). Each experiment makes its own spec from them (its `all_spec`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.loadgen import CapacityAsk, SearchPlan

# capacity searches: the labs' (six probes of six seconds) and quick ones (two of two)
LAB_SEARCH = SearchPlan(start=2.0, max_steps=6, duration_s=6.0, min_requests=20, warmup=2)
QUICK_SEARCH = SearchPlan(start=2.0, max_steps=2, duration_s=2.0, min_requests=6, warmup=1)


@dataclass(frozen=True)
class AllSpec:
    """The sizes every experiment of the run takes, and which experiments to run."""

    turns: int
    preamble_words: int
    offload_concurrency: int
    levels: tuple[int, ...]
    requests: int | None  # a level's; None: the load generator's max(10 x c, 200)
    max_tokens: int
    preamble_tokens: int
    disk_prompt_tokens: int
    prompt_set: str = "shared-prefix"
    only: tuple[str, ...] = ()
    capacity: CapacityAsk | None = None  # the target "" is the platform's
    llama_slot_ctx: int = 2048  # llama-tiers' pressure runs: tokens per slot
    together: bool = False  # on a GPU: an experiment's engines start at once (`together.py`)

    @classmethod
    def lab(cls, levels: tuple[int, ...], requests: int | None, max_tokens: int,
            preamble_tokens: int, preamble_words: int, prompt_set: str,
            only: tuple[str, ...] = (), gpu: bool = False) -> AllSpec:
        return cls(6, preamble_words, 8, levels, requests, max_tokens, preamble_tokens, 3500,
                   prompt_set, only, CapacityAsk("", LAB_SEARCH), together=gpu)

    @classmethod
    def quick(cls, prompt_set: str, only: tuple[str, ...] = (), gpu: bool = False) -> AllSpec:
        # a GPU serves a pressure run's turns fast: pacing 2 users in flight stretched its
        # think time to 8.1 s and each run to 88 s on the H200, 8 keep it near 20 s
        return cls(3, 400, 8 if gpu else 2, (1, 2), 4, 8, 300, 3000, prompt_set, only,
                   CapacityAsk("", QUICK_SEARCH), llama_slot_ctx=1024, together=gpu)
