"""The arguments of the P/D lab's experiments (`kvlab run shared`, `replicas`, `disagg`)
and the specs they make with the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from kvlab.core import LoadedSettings, SettingError, StoreName
from kvlab.experiments.args import (
    AUTO_HELP,
    REPEAT_HELP,
    SLO_HELP,
    PlannedArgs,
    capacity_ask,
    ints,
    repeat_asked,
)
from kvlab.experiments.disagg_spec import DISAGG_PARTS
from kvlab.proxy import Balance
from kvlab.records import SPLIT

if TYPE_CHECKING:
    from kvlab.experiments.disagg_spec import DisaggSpec
    from kvlab.experiments.replicas import ReplicasSpec
    from kvlab.experiments.shared import SharedSpec


class SharedArgs(PlannedArgs):
    """Two instances, one KV store: alternating turns, a single-instance control, the proof."""

    turns: int = Field(6, ge=2, description="Turns of the conversation.")
    preamble_words: int | None = Field(None, ge=1, description="Default: PREAMBLE_WORDS.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP)
    store: StoreName = Field(
        "shared", description="The store both instances use: shared (the seed's: vLLM's "
        "ExampleConnector on one directory, whole prompts), lmcache (one LMCache server of "
        "KV_OFFLOAD_GB, by prefix) or fs (vLLM's fs tier on one directory under a CPU tier of "
        "KV_OFFLOAD_GB, by prefix; a GPU build only).")

    def spec(self, loaded: LoadedSettings) -> SharedSpec:
        from kvlab.experiments.shared import SharedSpec

        return SharedSpec(turns=self.turns,
                          preamble_words=self.preamble_words or loaded.values.preamble_words,
                          repeat=self.repeat, store=self.store)


class ReplicasArgs(PlannedArgs):
    """N plain replicas behind one front, one arm per routing choice, measured for reuse."""

    replicas: int = Field(3, ge=2, description="How many vLLM replicas.")
    arm: tuple[str, ...] = Field((), description="An arm to run (repeat for several): "
                                 "round-robin, least-outstanding, prefix-affinity, "
                                 "conversation-affinity, vllm-router:cache_aware, "
                                 "vllm-router:consistent_hash, shared-store; default all.")
    prompt_set: tuple[str, ...] = Field((), description="shared-prefix or multi-turn (repeat "
                                        "for both, the default).")
    groups: int = Field(6, ge=1, description="shared-prefix: how many preambles.")
    requests: int = Field(24, ge=1, description="Requests per arm and prompt set.")
    concurrency: int = Field(4, ge=1, description="Requests in flight through the front.")
    preamble_tokens: int | None = Field(None, ge=16, description="Default: PREAMBLE_TOKENS.")
    load_factor: float = Field(1.25, ge=1.0, description="kvlab's affinity bound: no replica "
                               "holds more than this times the mean in flight.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP)

    def spec(self, loaded: LoadedSettings) -> ReplicasSpec:
        from kvlab.experiments.replicas import ARMS, ReplicasSpec

        if self.repeat != 1:
            raise SettingError(f"--repeat {self.repeat}: run replicas runs each arm once; "
                               "each arm's TTFT carries its own interval over requests")
        s = loaded.values
        return ReplicasSpec(
            replicas=self.replicas, arms=self.arm or ARMS,
            prompt_sets=self.prompt_set or ("shared-prefix", "multi-turn"),
            groups=self.groups, requests=self.requests, concurrency=self.concurrency,
            preamble_tokens=self.preamble_tokens or s.preamble_tokens,
            max_tokens=s.max_tokens, load_factor=self.load_factor).check()


class DisaggArgs(PlannedArgs):
    """Prediction, the split behind kvlab's proxy, the baseline, the comparison; with --part,
    the lab's procedure steps (a cancel and a worker restart; the prompt-length boundary)."""

    link_gbps: float | None = Field(None, gt=0, description="Link speed for the prediction "
                                    "(default: none on loopback).")
    part: tuple[Literal["load", "cancel", "boundary", "all"], ...] = Field(
        (), description="What to run, repeatable (default: load). load: the prediction, the "
        "split and the baseline under load, the comparison. cancel: a request cancelled "
        "mid-stream, then the decode worker restarted, every check recorded (exit 1 when one "
        "fails). boundary: prompt lengths through the split and the baseline, where the split "
        "pays. all: the three, sharing the engines.")
    lengths: str | None = Field(None, description="--part boundary: prompt lengths in tokens, "
                                "comma-separated (default: those of 128,512,1024,2048,3072 "
                                "that fit CTX).")
    boundary_concurrency: str | None = Field(None, description="--part boundary: concurrency "
                                             "levels, comma-separated (default 1).")
    boundary_requests: int | None = Field(None, ge=1, description="--part boundary: requests "
                                          "per length and level (default 3).")
    cancel_prompt_tokens: int | None = Field(None, ge=32, description="--part cancel: the "
                                             "cancelled request's prompt length (default "
                                             "2048, or half of CTX when that is less).")
    cancel_after: int | None = Field(None, ge=1, description="--part cancel: tokens received "
                                     "before the client closes the stream (default 4).")
    label: str = Field("disagg", description="The split's label (the baseline's is baseline): "
                       "one per configuration in a notebook, e.g. disagg-nixl-tcp.")
    slo: str = Field("", description=SLO_HELP)
    proxy_node: str | None = Field(None, description="On the cluster, kvlab's proxy on this "
                                   "node (default: where kvlab runs).",
                                   json_schema_extra={"metavar": "NAME"})
    repeat: str = Field("1", description=REPEAT_HELP + " For --part load," + AUTO_HELP,
                        json_schema_extra={"metavar": "N|auto[:CAP]"})
    balance: Balance = Field("round-robin", description="How kvlab's proxy picks among several "
                             "prefill or decode engines (PREFILL_HOSTS, DECODE_HOSTS): in turn, "
                             "the fewest in flight, or by affinity (the prompt's leading "
                             "blocks, or its conversation).")

    def proxy(self) -> str | None:
        return self.proxy_node

    def spec(self, loaded: LoadedSettings) -> DisaggSpec:
        from dataclasses import replace

        from kvlab.experiments.disagg_spec import DisaggSpec

        s = loaded.values
        count, rule = repeat_asked(self.repeat)
        spec = DisaggSpec(levels=s.concurrency, requests=loaded.values.requests,
                          max_tokens=s.max_tokens, preamble_tokens=s.preamble_tokens,
                          prompt_set=s.prompt_set, link_gbps=self.link_gbps,
                          parts=self.parts(), capacity=capacity_ask(self.slo),
                          repeat=count, rule=rule, label=split_label(self.label),
                          balance=self.balance)
        b, c = spec.boundary, spec.cancel
        lengths = ints("--lengths", self.lengths)
        levels = ints("--boundary-concurrency", self.boundary_concurrency)
        boundary = replace(b, lengths=lengths if lengths is not None else b.lengths,
                           levels=levels or b.levels,
                           requests=self.boundary_requests or b.requests)
        cancel = replace(c, prompt_tokens=self.cancel_prompt_tokens or c.prompt_tokens,
                         cancel_after=self.cancel_after or c.cancel_after)
        return replace(spec, boundary=boundary, cancel=cancel)

    def parts(self) -> tuple[str, ...]:
        """The parts asked for, in the run's order; `all` is every part, none is `load`."""
        if "all" in self.part:
            return DISAGG_PARTS
        return tuple(p for p in DISAGG_PARTS if p in self.part) or DISAGG_PARTS[:1]


def split_label(label: str) -> str:
    """A split's label as the report finds it: disagg, or disagg-SOMETHING."""
    if (label != SPLIT.label and not label.startswith(SPLIT.label + "-")) \
            or not label.isprintable() or len(label) > 64:
        raise SettingError(f"--label {label!r}: name the split disagg or disagg-SOMETHING "
                           "(64 characters at most), so that the report finds it")
    return label
