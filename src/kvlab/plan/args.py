"""`kvlab plan`'s arguments: the workload (a trace, as `kvlab load --trace` reads it, or user
sessions), the replica profile, what to simulate (replica counts, policies, tier sizes) and
what to answer (a TTFT target, a rate). The trace's options keep `kvlab load`'s names."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from kvlab.core import Args, InputError
from kvlab.plan.routing import LOAD_FACTOR, POLICIES, Policy
from kvlab.plan.stream import TRACE_BLOCK_TOKENS, Keys, Stream, session_stream, trace_stream


def _numbers(text: str, flag: str, least: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r}: give whole numbers, e.g. 1,2,4") from None
    if not values or min(values) < least:
        raise InputError(f"{flag} {text!r}: give whole numbers of at least {least}")
    return tuple(sorted(set(values)))


class PlanArgs(Args):
    """What `kvlab plan` simulates and answers."""

    trace: str | None = Field(None, description="A Mooncake-format trace (JSON lines: "
                              "timestamp ms, input_length, output_length, hash_ids), as "
                              "`kvlab load --trace` replays it.")
    trace_block_size: int = Field(TRACE_BLOCK_TOKENS, ge=1, description="Tokens per hash id "
                                  "in the trace.")
    trace_limit: int | None = Field(None, ge=1, description="The trace's first N requests.")
    trace_max_input: int | None = Field(None, ge=1, description="Prompts longer than this "
                                        "are cut to fit or left out, as `kvlab load` does.")
    trace_over_max_input: Literal["truncate", "filter"] = Field(
        "truncate", description="A request over --trace-max-input: cut to fit, or left out.")
    trace_repeat: int = Field(1, description="The trace this many times over, each "
                              "copy after the last, its hash ids its own (no block shared "
                              "across copies): a longer trace at the same rate.")
    sessions: int | None = Field(None, ge=1, description="User sessions instead of a trace: "
                                 "this many users, each running conversations.")
    turns: int = Field(4, ge=1, description="User sessions: turns per conversation.")
    conversations: int | None = Field(None, ge=1, description="User sessions: conversations "
                                      "in all [default: one per user].")
    think_time: str = Field("exponential:1", description="User sessions: seconds between a "
                            "reply and the next turn: fixed:S, exponential:S (mean) or "
                            "trace:FILE.")
    user_rate: float | None = Field(None, gt=0, description="User sessions: new users a "
                                    "second (Poisson), one conversation each [default: all "
                                    "there from the start].")
    system_tokens: int = Field(12, ge=0, description="User sessions: the system message's "
                               "tokens, shared by every conversation.")
    document_tokens: int = Field(1024, ge=0, description="User sessions: each conversation's "
                                 "opening document, in tokens.")
    question_tokens: int = Field(32, ge=0, description="User sessions: tokens a question.")
    reply_tokens: int = Field(64, ge=1, description="User sessions: tokens a reply (the "
                              "output each turn asks for).")
    seed: int = Field(0, description="User sessions: the seed of arrivals and think times.")
    profile: str | None = Field(None, description="The replica profile: a JSON file of its "
                                "fields, or a notebook holding a replica_profile line.")
    replicas: str = Field("1,2,4", description="Replica counts to simulate, e.g. 1,2,4; the "
                          "largest bounds the fewest-replicas search.")
    policy: str = Field("all", description="Routing policies, comma-separated, or all: "
                        + ", ".join(POLICIES) + ".")
    tier_blocks: str = Field("profile", description="Host tier sizes per replica in blocks, "
                             "e.g. 0,4096, or profile (the profile's own).")
    rate: float | None = Field(None, gt=0, description="Requests a second to simulate at (the "
                               "stream's arrivals scaled) and to find the fewest replicas "
                               "for [default: the stream's own rate].")
    target_ttft_p90: float | None = Field(None, gt=0, description="A TTFT p90 target in "
                                          "seconds: find the highest rate meeting it, and with "
                                          "--rate the fewest replicas.")
    affinity_blocks: int = Field(Keys.blocks, ge=1, description="Prefix "
                                 "affinity's key: leading blocks (the proxy's "
                                 "--affinity-blocks).")
    affinity_block_tokens: int = Field(Keys.block_tokens, ge=1, description="Prefix "
                                       "affinity's key: tokens a block (the proxy's "
                                       "--block-tokens).")
    load_factor: float = Field(LOAD_FACTOR, ge=1.0, description="Affinity's "
                               "load bound over the mean in flight (the proxy's "
                               "--load-factor).")
    out: Path | None = Field(None, description="Also write the plan (its JSON line) here.")
    measure: bool = Field(False, description="Measure a replica profile on the vLLM engine at "
                          "--base-url and write its replica_profile line to --out (no plan).")
    base_url: str | None = Field(None, description="--measure: the engine's root URL.")
    model: str = Field("local-chat", description="--measure: the model name the engine "
                       "serves.")
    max_seqs: int | None = Field(None, ge=1, description="--measure: the engine's "
                                 "--max-num-seqs (it does not state it on /metrics).")
    measure_concurrency: int = Field(4, ge=2, description="--measure: the busier level's "
                                     "concurrency (the other is 1).")
    measure_requests: int = Field(8, ge=2, description="--measure: requests a level.")

    def replica_counts(self) -> tuple[int, ...]:
        return _numbers(self.replicas, "--replicas", 1)

    def policies(self) -> tuple[Policy, ...]:
        if self.policy.strip() == "all":
            return POLICIES
        asked = [p.strip() for p in self.policy.split(",") if p.strip()]
        for p in asked:
            if p not in POLICIES:
                raise InputError(f"--policy {p!r}: choose from all, {', '.join(POLICIES)}")
        return tuple(p for p in POLICIES if p in asked)

    def tiers(self, profile_tier: int) -> tuple[int, ...]:
        if self.tier_blocks.strip() == "profile":
            return (profile_tier,)
        return _numbers(self.tier_blocks, "--tier-blocks", 0)

    def stream(self, block_tokens: int) -> Stream:
        """The workload in the cache's blocks."""
        keys = Keys(self.affinity_blocks, self.affinity_block_tokens)
        if (self.trace is None) == (self.sessions is None):
            raise InputError("kvlab plan needs one workload: --trace FILE or --sessions USERS")
        if self.trace is not None:
            return trace_stream(self.trace, block_tokens, keys, trace_block=self.trace_block_size,
                                limit=self.trace_limit, max_input=self.trace_max_input,
                                over=self.trace_over_max_input, repeat=self.trace_repeat)
        assert self.sessions is not None
        return session_stream(self.sessions, block_tokens, keys, turns=self.turns,
                              conversations=self.conversations, think=self.think_time,
                              user_rate=self.user_rate, system_tokens=self.system_tokens,
                              document_tokens=self.document_tokens,
                              question_tokens=self.question_tokens,
                              reply_tokens=self.reply_tokens, seed=self.seed)
