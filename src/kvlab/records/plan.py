"""The lines `kvlab plan` reads and writes: one replica's profile, and a plan's answers.

A `ReplicaProfile` is what the planner knows of one replica: its KV cache (block size, device
blocks, a host tier's blocks) and its costs (prefill seconds per uncached prompt token, recall
seconds per token served from the tier, the decode step's seconds as a + b x the running
batch, and how many sequences it runs at once). Each figure says where it came from
(`sources`: the engine's counter or log it was read from, the levels it was fitted to, or
"given"). `kvlab plan --measure` writes one as a `ProfileRecord`, so a plan can be re-run from
the notebook; `kvlab plan --profile FILE` reads one from a JSON file (the profile alone, or a
profile line).

A `PlanRecord` holds a plan's answers: per routing policy, replica count and tier size
(`PlanPoint`) the hit share (overall and per replica), TTFT and TPOT percentiles and requests
per replica; the highest rate meeting a TTFT target and the smallest replica count meeting it
at a rate; and, always, what the model leaves out.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import LAB_NONE, Record, Strict
from kvlab.records.evidence import Percentiles


class ReplicaProfile(Strict):
    """One replica's cache and costs, as the planner models it."""

    block_tokens: int = Field(ge=1, description="Tokens per KV block.")
    device_blocks: int = Field(ge=0, description="KV blocks the device cache holds.")
    tier_blocks: int = Field(0, ge=0, description="Blocks of a host tier under it (0: none).")
    prefill_s_per_token: float = Field(ge=0, description="Seconds of prefill per prompt "
                                       "token not served from cache.")
    recall_s_per_token: float = Field(0.0, ge=0, description="Seconds per prompt token "
                                      "served from the host tier (its copy back).")
    decode_step_s: float = Field(ge=0, description="The decode step's seconds at no batch: "
                                 "a in a + b x batch.")
    decode_step_per_seq_s: float = Field(0.0, ge=0, description="Seconds the decode step "
                                         "grows per sequence in the batch: b.")
    max_seqs: int = Field(ge=1, description="Sequences the replica runs at once (vLLM's "
                          "max_num_seqs); more wait.")
    ttft_fixed_s: float = Field(0.0, ge=0, description="Seconds every request's first token "
                                "takes beyond the engine's queue and prefill (its front end, "
                                "HTTP, a router): added to TTFT, holding no prefill.")
    sources: dict[str, str] = Field(default_factory=dict, description="Where each figure "
                                    "came from, by field name.")

    def decode_step(self, batch: int) -> float:
        """Seconds of one decode step with `batch` sequences running."""
        return self.decode_step_s + self.decode_step_per_seq_s * batch


class ProfileLevel(Strict):
    """One measured level a profile's costs were read from."""

    concurrency: int
    requests: int
    prompt_tokens: int | None = Field(None, description="Prompt tokens the engine counted "
                                      "over the level.")
    cached_tokens: int | None = Field(None, description="Of them, served from its cache.")
    prefill_s: float | None = Field(None, description="The engine's prefill-time histogram's "
                                    "sum over the level.")
    tpot_s: Percentiles | None = None
    ttft_s: Percentiles | None = None


class ProfileRecord(Record):
    """A replica profile measured on an engine (`kvlab plan --measure`)."""

    kind: ClassVar[str] = "replica_profile"
    lab: str = LAB_NONE
    record: Literal["replica_profile"] = "replica_profile"
    profile: ReplicaProfile
    engine: str | None = None
    model: str | None = None
    url: str | None = Field(None, description="The engine measured.")
    levels: list[ProfileLevel] = Field(default_factory=list)


class PlanPoint(Strict):
    """One simulated arm: a routing policy over N replicas with a tier of T blocks each."""

    policy: str
    replicas: int
    tier_blocks: int
    rate: float = Field(description="Requests per second the stream arrived at.")
    requests: int
    prompt_tokens: int
    hit_share: float | None = Field(None, description="Of all prompt tokens, served from cache "
                                    "(device and tier).")
    tier_share: float | None = Field(None, description="Of all prompt tokens, served from the "
                                     "tier.")
    hit_share_per_replica: list[float | None]
    requests_per_replica: list[int]
    busiest_over_mean: float | None = Field(None, description="The busiest replica's requests over "
                                            "the mean.")
    ttft_s: Percentiles | None = None
    tpot_s: Percentiles | None = Field(None, description="Of requests with two or more output "
                                       "tokens.")


class RateAnswer(Strict):
    """The highest rate a policy, N and tier meet the TTFT target at (None: not even the
    lowest rate tried)."""

    policy: str
    replicas: int
    tier_blocks: int
    target: str
    rate: float | None = None
    ttft_s: Percentiles | None = Field(None, description="At that rate.")
    why: str | None = None


class ReplicasAnswer(Strict):
    """The fewest replicas a policy and tier meet the TTFT target with at a rate (None: not
    the most tried)."""

    policy: str
    tier_blocks: int
    rate: float
    target: str
    replicas: int | None = None
    ttft_s: Percentiles | None = None
    why: str | None = None


class PlanRecord(Record):
    """A plan's answers for one workload and one replica profile."""

    kind: ClassVar[str] = "plan"
    lab: str = LAB_NONE
    record: Literal["plan"] = "plan"
    workload: str = Field(description="The stream simulated: a trace's path and sha256, or "
                          "the user sessions' settings.")
    profile: ReplicaProfile
    points: list[PlanPoint]
    highest_rates: list[RateAnswer] = Field(default_factory=list)
    fewest_replicas: list[ReplicasAnswer] = Field(default_factory=list)
    left_out: list[str] = Field(description="What the model leaves out, one sentence each.")
