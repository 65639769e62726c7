"""What a plan answers from its simulations: each arm's figures, the highest rate meeting a
TTFT target, the fewest replicas meeting it at a rate, and what the model leaves out.

Percentiles are numpy's linear interpolation between closest ranks, as `loadgen.stats` takes
them. The searches assume TTFT's percentile only grows with the rate and falls with more
replicas: the highest rate is bisected (in log scale, `RATE_STEPS` simulations after the
bracket is found) over the stream's arrivals scaled; the fewest replicas bisected between 1 and
the most the plan was given. Neither holds exactly under affinity (a key's replica can change
with N), so each answer is the simulation at the figure it gives, not an interpolation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvlab.core import InputError
from kvlab.plan.routing import Policy
from kvlab.plan.simulate import Outcome
from kvlab.plan.stream import Floats, Stream
from kvlab.records import Percentiles, PlanPoint, RateAnswer, ReplicasAnswer

RATE_STEPS = 12  # bisections of the rate: the answer within ~2^(-12) of the bracket in log
BRACKET_STEPS = 20  # doublings or halvings of the rate while looking for a bracket

LEFT_OUT = (
    "Prefills run one at a time per replica at a cost linear in uncached tokens: batched "
    "prefills, chunked prefill and a prefill slowed by the decodes beside it are not modelled.",
    "A request's decode steps all take the time of the batch running when its decode starts; "
    "the batch changing under it, preemption and a KV cache too full to admit it are not "
    "modelled (only the profile's max_seqs limits the batch).",
    "Each replica's cache is looked up in the order requests reach it, one at a time, and "
    "evicts once after each: blocks of requests still running are not held against eviction, "
    "and generated tokens are never cached.",
    "The network, the router's own time, tokenizing and the HTTP stack add nothing; every "
    "replica is always up.",
    "vllm-router's cache_aware record is a set of whole blocks never trimmed, where the "
    "router keeps a character tree trimmed every 120 s.",
    "Session prompts are sized in tokens, not tokenized: the chat template's few tokens a "
    "message are not counted, and a user's next conversation goes to the same user.",
)


def percentiles(values: Floats) -> Percentiles | None:
    """p50/p90/p95/p99/mean/std/min/max of the finite values (None: none)."""
    kept = values[np.isfinite(values)]
    if not len(kept):
        return None
    p50, p90, p95, p99 = (float(x) for x in np.percentile(kept, [50, 90, 95, 99]))
    return Percentiles(p50=round(p50, 6), p90=round(p90, 6), p95=round(p95, 6),
                       p99=round(p99, 6), mean=round(float(kept.mean()), 6),
                       std=round(float(kept.std(ddof=1)), 6) if len(kept) > 1 else None,
                       min=round(float(kept.min()), 6), max=round(float(kept.max()), 6),
                       n=len(kept))


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def arrival_rate(outcome: Outcome) -> float:
    """Requests a second over the span of their arrivals (0: one instant)."""
    span = float(outcome.arrival_s.max() - outcome.arrival_s.min()) if len(outcome.arrival_s) \
        else 0.0
    return len(outcome.arrival_s) / span if span > 0 else 0.0


def point(outcome: Outcome) -> PlanPoint:
    """One arm's figures."""
    rate = arrival_rate(outcome)
    o, n, b = outcome, outcome.replicas, outcome.block_tokens
    per = np.bincount(o.replica, minlength=n)
    prompt = np.bincount(o.replica, weights=o.prompt_tokens, minlength=n)
    hit = np.bincount(o.replica, weights=(o.device_blocks + o.tier_blocks_hit) * b, minlength=n)
    total = int(o.prompt_tokens.sum())
    cached = int((o.device_blocks.sum() + o.tier_blocks_hit.sum()) * b)
    mean = per.mean() if n else 0.0
    return PlanPoint(
        policy=o.policy, replicas=n, tier_blocks=o.tier_blocks, rate=round(rate, 6),
        requests=len(o.replica), prompt_tokens=total, hit_share=_share(cached, total),
        tier_share=_share(int(o.tier_blocks_hit.sum()) * b, total),
        hit_share_per_replica=[_share(int(h), int(p)) for h, p in zip(hit, prompt, strict=True)],
        requests_per_replica=[int(c) for c in per],
        busiest_over_mean=round(float(per.max() / mean), 4) if mean else None,
        ttft_s=percentiles(o.ttft_s), tpot_s=percentiles(o.tpot_s))


@dataclass(frozen=True)
class Target:
    """A TTFT percentile that must stay at or under a number of seconds."""

    percentile: float
    seconds: float

    def __post_init__(self) -> None:
        if not 0 < self.percentile <= 100 or not self.seconds > 0:
            raise InputError(f"a TTFT target of p{self.percentile:g} <= {self.seconds} s: "
                             "give a percentile in (0, 100] and seconds above 0")

    def __str__(self) -> str:
        return f"TTFT p{self.percentile:g} <= {self.seconds:g} s"

    def value(self, outcome: Outcome) -> float:
        return float(np.percentile(outcome.ttft_s, self.percentile))

    def met(self, outcome: Outcome) -> bool:
        return self.value(outcome) <= self.seconds


def base_rate(stream: Stream) -> float:
    """A trace's own rate in requests per second (sessions have none: their arrivals wait
    on replies)."""
    rate = stream.rate()
    if stream.closed:
        raise InputError("--rate: user sessions' arrivals wait on their replies; set their "
                         "pace with --think-time and --user-rate instead")
    if rate is None:
        raise InputError("--rate: the trace's requests all arrive at one instant: it has no "
                         "rate to scale")
    return rate


Run = Callable[[Stream, int], Outcome]  # a stream over N replicas


def highest_rate(stream: Stream, run: Run, target: Target, policy: Policy, replicas: int,
                 tier_blocks: int) -> RateAnswer:
    """The highest rate (the stream's arrivals and think times scaled) at which `run` over
    `replicas` meets `target`: the rate its requests arrived at in that run."""
    low: tuple[float, Outcome] | None = None
    high: float | None = None
    scale = 1.0
    for _ in range(BRACKET_STEPS):
        outcome = run(stream.scaled(scale), replicas)
        if target.met(outcome):
            low = (scale, outcome)
            if high is not None:
                break
            scale *= 2
        else:
            high = scale
            if low is not None:
                break
            scale /= 2

    def answer(rate: float | None, at: Outcome | None = None, why: str | None = None
               ) -> RateAnswer:
        return RateAnswer(policy=policy, replicas=replicas, tier_blocks=tier_blocks,
                          target=str(target), rate=None if rate is None else round(rate, 6),
                          ttft_s=None if at is None else percentiles(at.ttft_s), why=why)

    if low is None:
        return answer(None, why=f"not met at {scale:.3g} x the stream's own "
                          f"pace ({BRACKET_STEPS} halvings)")
    if high is None:
        return answer(arrival_rate(low[1]), low[1], why=f"met at every pace tried, up to "
                      f"{low[0]:.3g} x the stream's own")
    for _ in range(RATE_STEPS):
        mid = math.sqrt(low[0] * high)
        outcome = run(stream.scaled(mid), replicas)
        if target.met(outcome):
            low = (mid, outcome)
        else:
            high = mid
    return answer(arrival_rate(low[1]), low[1])


def fewest_replicas(stream: Stream, run: Run, target: Target,
                    policy: Policy, tier_blocks: int, rate: float, most: int
                    ) -> ReplicasAnswer:
    """The fewest replicas (1 to `most`) with which `run` meets `target`, the stream (a
    trace) at `rate`."""
    scaled = stream.scaled(rate / base_rate(stream))

    def runs(n: int) -> Outcome:
        return run(scaled, n)

    def answer(replicas: int | None, at: Outcome, why: str | None = None) -> ReplicasAnswer:
        return ReplicasAnswer(policy=policy, tier_blocks=tier_blocks, rate=rate,
                              target=str(target), replicas=replicas,
                              ttft_s=percentiles(at.ttft_s), why=why)

    top = runs(most)
    if not target.met(top):
        return answer(None, top, why=f"not met with {most} replicas (the most given)")
    lo, hi, best = 0, most, top  # lo fails (0 replicas always does), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        outcome = runs(mid)
        if target.met(outcome):
            hi, best = mid, outcome
        else:
            lo = mid
    return answer(hi, best)
