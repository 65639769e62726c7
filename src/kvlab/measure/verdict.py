"""Evidence -> verdict: did a request reuse KV, and if not, was that expected?

A cache miss is silent, so a verdict compares what *should* have been reusable (from the
prompt's token count, the engine's block size and what the instance has already seen) with
what the server *says* it reused (per-response cached tokens, prefix-cache counter deltas) and
with the one signal no counter bug can fake, the TTFT against a cold prefill of the same
length. Pure functions only: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvlab.records import CaseEvidence
from kvlab.records import Verdict as VerdictName

if TYPE_CHECKING:
    from kvlab.engines import InstanceFacts

Verdict = VerdictName
# no reuse where reuse was expected: `kvlab reuse` and `kvlab prove` exit 1 on these
FAILED: frozenset[Verdict] = frozenset({"silent-miss", "warm-up-only"})

REUSED_FRACTION = 0.9  # of the expected tokens, to call it reused
MISS_FRACTION = 0.1  # below this fraction of the expected tokens, nothing was reused
FASTER_RATIO = 0.7  # TTFT at or below this fraction of cold counts as clearly faster


def reusable_tokens(prompt_tokens: int, block_size: int) -> int:
    """Tokens a prefix cache can serve for a fully cached prompt of `prompt_tokens`.

    The engine must compute at least the last token itself, and caches whole blocks only,
    so the reusable part is the longest whole-block prefix of the first n-1 tokens.
    """
    if prompt_tokens <= 1 or block_size <= 0:
        return 0
    return ((prompt_tokens - 1) // block_size) * block_size


def lookup_key(prompt_tokens: int, block_size: int) -> int:
    """Tokens vLLM's ExampleConnector hashes to look a prompt of n tokens up: the whole
    blocks of its first n - 1 tokens, ((n - 2) // block) * block (example_connector.py)."""
    if prompt_tokens < 2 or block_size <= 0:
        return 0
    return ((prompt_tokens - 2) // block_size) * block_size


def store_key(prompt_tokens: int, block_size: int) -> int:
    """Tokens it hashes to store a prompt of m tokens: the whole blocks of all m tokens,
    ((m - 1) // block) * block. One less token than the lookup, so a prompt of k blocks + 1
    tokens is stored under k blocks and looked up under k - 1: it is never served, not even
    to an identical prompt (seen in vLLM 0.26 and 0.32)."""
    if prompt_tokens < 1 or block_size <= 0:
        return 0
    return ((prompt_tokens - 1) // block_size) * block_size


@dataclass
class Evidence:
    """What one request showed about reuse."""

    expected_tokens: int
    cached_tokens: int | None = None  # from the response (usage or llama timings.cache_n)
    counter_hits: float | None = None  # local + external prefix-cache hit tokens, delta
    ttft_s: float | None = None
    cold_ttft_s: float | None = None
    prompt_tokens: int | None = None
    source_tokens: float | None = None  # vLLM prompt_tokens_by_source: cache hit + transfer

    @property
    def signals(self) -> list[float]:
        return [float(v) for v in (self.cached_tokens, self.counter_hits, self.source_tokens)
                if v is not None]

    @property
    def observed_tokens(self) -> float | None:
        """The best available count of reused tokens: the largest of the token signals."""
        return max(self.signals) if self.signals else None

    @property
    def ttft_ratio(self) -> float | None:
        if self.ttft_s is None or not self.cold_ttft_s:
            return None
        return self.ttft_s / self.cold_ttft_s


@dataclass
class Judgement:
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)
    evidence: CaseEvidence = field(default_factory=CaseEvidence)


def judge(ev: Evidence, *, context: str = "", cause: str = "",
          store_tokens: float | None = None) -> Judgement:
    """The verdict for one request, with the reasons a reader needs to trust it.

    `context` explains the expectation (why nothing, or why this much, was reusable) and
    leads the reasons whatever the verdict. `cause` is what the instance itself says would
    stop reuse (`no_reuse_cause`): it leads the reasons of a verdict of no reuse. A case
    meant for the instance's own prefix cache that the KV store served instead
    (`store_tokens` came through the connector while `cause` says the cache is off) is not
    "reused": it is inconclusive, and the reasons say what served it.
    """
    judgement = _judge(ev, context)
    if cause and store_tokens and judgement.verdict == "reused":
        judgement.verdict = "inconclusive"
        judgement.reasons.insert(0, (
            f"served by the KV store, not by this instance's prefix cache: {store_tokens:.0f} "
            "prompt tokens came through its connector (vLLM's prompt_tokens_by_source "
            "external_kv_transfer); its own cache proved nothing"))
        judgement.reasons.insert(0, f"cause: {cause}")
        judgement.evidence.cause = cause
        return judgement
    if context and context not in judgement.reasons:
        judgement.reasons.insert(0, context)
    if cause and judgement.verdict == "warm-up-only":
        # the instance reuses nothing by configuration: a faster repeat is noise or warm-up
        # that the cold request paid, and the miss itself is the finding
        judgement.verdict = "silent-miss"
        judgement.reasons.append("the faster TTFT is not reuse: the instance caches nothing")
    if cause and judgement.verdict in FAILED:
        judgement.reasons.insert(0, f"cause: {cause}")
        judgement.evidence.cause = cause
    return judgement


def no_reuse_cause(facts: InstanceFacts | None) -> str:
    """What an instance reports that stops reuse by configuration ("" when nothing does)."""
    if facts is not None and facts.prefix_caching is False:
        return (f"prefix caching is OFF on {facts.url} (the instance reports it disabled: "
                "vLLM's --no-enable-prefix-caching, llama-server's --no-cache-prompt), so it "
                "reuses nothing, by configuration")
    return ""


def _judge(ev: Evidence, why_none_expected: str) -> Judgement:
    observed, ratio = ev.observed_tokens, ev.ttft_ratio
    facts = CaseEvidence(expected_tokens=ev.expected_tokens, observed_tokens=observed,
                         cached_tokens=ev.cached_tokens, counter_hits=ev.counter_hits,
                         source_tokens=ev.source_tokens, prompt_tokens=ev.prompt_tokens,
                         ttft_s=ev.ttft_s, cold_ttft_s=ev.cold_ttft_s,
                         ttft_ratio=round(ratio, 3) if ratio is not None else None)
    if observed is None:
        return Judgement("inconclusive", [
            "no reuse evidence: the response carried no cached-token count and /metrics had no "
            "prefix-cache counters (vLLM needs --enable-prompt-tokens-details; llama-server "
            "--metrics)"], facts)
    if ev.expected_tokens <= 0:
        return _none_expected(observed, ev, why_none_expected, facts)
    fraction = observed / ev.expected_tokens
    facts.observed_fraction = round(fraction, 3)
    if fraction >= REUSED_FRACTION:
        reasons = [f"{observed:.0f} of {ev.expected_tokens} reusable tokens were served from "
                   "cache"]
        if ratio is not None and ratio > 1 - (1 - FASTER_RATIO) / 2:
            agreeing = sum(s >= REUSED_FRACTION * ev.expected_tokens for s in ev.signals)
            if agreeing < 2:
                reasons.append(f"but TTFT was {ratio:.2f}x of cold and only one signal reports "
                               "the hits (counter bugs exist): not proven")
                return Judgement("inconclusive", reasons, facts)
            reasons.append(f"{agreeing} independent signals agree, but TTFT was {ratio:.2f}x "
                           "of cold: the reuse saved less than the request cost elsewhere (a "
                           "store write or disk read, a busy machine, a short prompt)")
            return Judgement("reused", reasons, facts)
        if ratio is not None:
            reasons.append(f"TTFT {ratio:.2f}x of the cold prefill")
        return Judgement("reused", reasons, facts)
    if fraction < MISS_FRACTION:
        if ratio is not None and ratio <= FASTER_RATIO:
            return Judgement("warm-up-only", [
                f"TTFT dropped to {ratio:.2f}x of cold, but only {observed:.0f} of "
                f"{ev.expected_tokens} tokens came from cache: the speed-up is warm-up (model "
                "residency, compiled kernels), not reuse"], facts)
        return Judgement("silent-miss", [
            f"{ev.expected_tokens} tokens were reusable, {observed:.0f} were reused: the engine "
            "recomputed the prompt and reported nothing unusual"], facts)
    return Judgement("inconclusive", [
        f"partial reuse: {observed:.0f} of {ev.expected_tokens} reusable tokens"], facts)


def _none_expected(observed: float, ev: Evidence, why: str,
                   facts: CaseEvidence) -> Judgement:
    tolerance = max(1.0, MISS_FRACTION * (ev.prompt_tokens or 0))
    if observed <= tolerance:
        reasons = [why] if why else []
        reasons.append(f"{observed:.0f} tokens reused, as expected")
        return Judgement("no-reuse-expected", reasons, facts)
    return Judgement("inconclusive", [
        f"{observed:.0f} tokens were reused where none should have been: the control shares a "
        "prefix with an earlier prompt, or the cache is keyed too loosely"], facts)
