"""What one load sweep is asked to do: `LoadSpec`, its levels and its defaults.

A level is a concurrency (closed loop), a concurrency capping an open-loop rate (`rate`, or
one level per rate of `rates`), a number of users (`sessions`: user sessions with think
time), or an in-flight cap on a replayed trace (`trace`). The workload is a prompt set
(`shared-prefix` optionally split into `groups` with `group_shares`, `mixed`, `multi-turn`),
user sessions, a trace, random prompts of `random_input_len` tokens, or the user's dataset
(its prompts a level at a time, one pass of the file unless a count is given; its
conversations as user sessions); the spec checks once that the combination makes sense and
owns the defaults (how many requests a level takes, how many warm-ups, which prompt indices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from kvlab.core import InputError, JsonObject, Say
from kvlab.loadgen import stats, workloads
from kvlab.loadgen.benchargs import BenchArgs, one_result_file
from kvlab.loadgen.benchresult import BenchAsk
from kvlab.loadgen.dataset import Dataset
from kvlab.loadgen.guidellm import guide_run
from kvlab.loadgen.sessions import SessionSpec
from kvlab.loadgen.trace import TraceSpec
from kvlab.records import PromptFit, RunContext, Workload, notebook

MIN_REQUESTS = 200  # a level's default: p99 of at least 200 values is not one request
PER_CONCURRENCY = 10  # ... and at least 10 per concurrent slot
BLOCK = 1_000_000  # prompt indices per (repeat, level): disjoint prompts everywhere
WARMUP_OFFSET = BLOCK // 2  # a level's warm-up prompts, within its block
TRACE_WARMUP = 1  # a trace's warm-up requests unless set (its own tokens, no shared block)


def default_requests(concurrency: int) -> int:
    """Requests per level when none are set: max(10 x concurrency, 200)."""
    return max(PER_CONCURRENCY * concurrency, MIN_REQUESTS)


@dataclass(frozen=True)
class LoadSpec:
    """Everything one sweep needs, except the API key (passed apart, never stored)."""

    base_url: str
    model: str
    levels: tuple[int, ...]
    requests: int | None  # None: min_requests, else the default (`default_requests`)
    max_tokens: int
    prompt_set: str
    label: str
    engine: str = "vllm"  # as records spell it (engines.base.NAMES): whose /tokenize sizes
    endpoint: Literal["chat", "completions"] = "chat"
    timeout_s: float = 600.0
    rate: float | None = None
    burstiness: float = 1.0  # open loop: the arrival gaps' gamma shape (1 Poisson, inf even)
    slo: stats.Slo | None = None
    preamble_tokens: int = workloads.DEFAULT_PREAMBLE_TOKENS
    seed: int = 0
    ignore_eos: bool = False
    scrape_metrics: bool = True
    # the engines' /metrics (several: replicas behind a front, each counted and summed);
    # empty = the base URL's own server
    metrics_urls: tuple[str, ...] = ()
    lab: str = notebook.LAB_PD
    context: RunContext = field(default_factory=RunContext)  # what the caller knows, every row
    run_id: str | None = None  # the run every row belongs to
    min_requests: int | None = None  # at least this many measured requests per level
    duration_s: float | None = None  # and at least this long
    max_s: float | None = None  # nothing sent after this long (guidellm's --max-seconds)
    warmup: int | None = None  # requests first, left out of the statistics; None: concurrency
    repeat: int | None = None  # which repeat of a run this sweep is (0-based)
    labbook: str = ""  # per-request files go beside this notebook ("" = none written)
    size_prompts: bool = False  # size prompts with the server's tokenizer (else the estimate)
    tokenize_url: str = ""  # whose /tokenize; "" = the base URL's server, then metrics_url's
    tokenizer: str = ""  # a local tokenizer.json (or model directory) for token prompts
    sizing: workloads.Sizing | None = None  # a sizing already made (the caller's plan's)
    fit: PromptFit | None = None  # the longest prompt against the served context (`fit.py`)
    # a prompt the served context cannot hold: the preamble cut to fit (it came from the
    # settings' defaults), the load refused (the user named it), or sent (--send-oversized)
    oversized: Literal["fit", "refuse", "send"] = "fit"
    rates: tuple[float, ...] = ()  # open loop: one level per (concurrency, rate)
    groups: int = 1  # shared-prefix: how many preambles
    group_shares: tuple[float, ...] = ()  # their shares of the requests (equal when empty)
    sessions: SessionSpec | None = None  # user sessions: the levels are user counts
    trace: TraceSpec | None = None  # a trace replay: the levels are in-flight caps
    dataset: Dataset | None = None  # the user's file: its prompts, or its conversations
    block_offset: int = 0  # prompt blocks skipped (a capacity search's probes: fresh prompts)
    oracle: bool = True  # the cache oracle beside each level (vLLM, llama-server; needs files)
    oracle_tier_tokens: int = 0  # the host tier the oracle models, in tokens (0: none)
    # that tier finds prefixes in whole chunks of this many tokens from the first, written on
    # every prefill (LMCache: 256); 0: block by block, filled by the device's evictions
    oracle_tier_chunk_tokens: int = 0
    oracle_curve_tokens: tuple[int, ...] = ()  # host tiers the oracle also replays, in tokens
    # (beside its multiples of the device cache): a tier-size curve's sizes
    # where `model` came from, for `served.resolve`: "" kvlab named it (not checked); "named"
    # the user's --model or SERVED_NAME (refused unless the server lists it); "default" no
    # one named it (the one model the server lists is taken)
    model_source: Literal["", "named", "default"] = ""
    # vllm bench serve's request options: every request carries them, every row says them
    temperature: float | None = None
    extra_body: JsonObject = field(default_factory=dict)  # merged into every body
    headers: tuple[tuple[str, str], ...] = ()  # sent on every request
    # processes sending an open-loop level: None, as many as its rate needs by the client's
    # CPU per request on the warm-up (`spread.processes_for`); 1, one event loop
    processes: int | None = None
    request_id_prefix: str = ""  # X-Request-Id: this and the prompt's number ("": kvlab-uuid)
    random_input_len: int | None = None  # prompts of this many random tokens (a workload)
    # aiperf's spreads: each random prompt's length, and each answer's max_tokens, drawn from
    # a normal of this standard deviation around the mean (seeded by the prompt; 0: none)
    input_stddev: float = 0.0
    output_stddev: float = 0.0
    # vllm bench's prefix_repetition: (prefixes, their tokens) that random prompts open with
    shared_prefixes: tuple[int, int] | None = None
    # random prompts sent as their token ids or as the server's text of them; None: not asked
    # (ids)
    prompt_form: Literal["ids", "text"] | None = None
    bench: BenchAsk = field(default_factory=BenchAsk)  # vllm bench's metrics and result file

    def input_len(self, index: int) -> int:
        """Random prompt `index`'s length: --random-input-len, spread by --input-stddev."""
        assert self.random_input_len is not None
        return _spread(self.random_input_len, self.input_stddev, (self.seed, 0, index))

    def output_len(self, index: int) -> int | None:
        """Prompt `index`'s max_tokens when answers are spread (--output-tokens-stddev), else
        None (the spec's own)."""
        if not self.output_stddev:
            return None
        return _spread(self.max_tokens, self.output_stddev, (self.seed, 1, index))

    @property
    def metrics_url(self) -> str:
        """The first engine's /metrics ("" = the base URL's own server)."""
        return self.metrics_urls[0] if self.metrics_urls else ""

    def __post_init__(self) -> None:
        for name in ("requests", "min_requests", "warmup"):
            value = getattr(self, name)
            if value is not None and value < (0 if name == "warmup" else 1):
                raise InputError(f"--{name.replace('_', '-')} {value}: must be at least "
                                 f"{0 if name == 'warmup' else 1}")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InputError(f"--duration {self.duration_s}: must be above 0 seconds")
        if self.max_s is not None and (not self.max_s > 0 or (self.duration_s or 0) > self.max_s):
            raise InputError(f"--max-seconds {self.max_s}: must be above 0 seconds and at least "
                             "--duration (the time a level runs at least)")
        if self.levels and max(self.floor(c) for c in self.levels) > WARMUP_OFFSET:
            raise InputError(f"--requests/--min-requests: at most {WARMUP_OFFSET} per level")
        if (self.warmup or 0) > WARMUP_OFFSET:
            raise InputError(f"--warmup {self.warmup}: at most {WARMUP_OFFSET} per level")
        if any(not r > 0 for r in self.rates):
            raise InputError(f"--rate {self.rates}: every rate must be above 0 per second")
        self._check_workload()

    def _check_workload(self) -> None:
        if self.sessions is not None and self.trace is not None:
            raise InputError("--users and --trace: give one workload, not both")
        if self.dataset is not None and self.trace is not None:
            raise InputError("--dataset and --trace: give one workload, not both")
        if (self.sessions or self.trace) and (self.rate is not None or self.rates):
            raise InputError("--rate: user sessions and traces set their own arrivals "
                             "(--user-rate, the trace's timestamps with --trace-speedup)")
        if self.trace is not None and self.endpoint != "completions":
            raise InputError("--trace: a trace's prompts are token ids, sent to "
                             "/v1/completions: use --endpoint completions")
        if self.random_input_len is not None:
            if self.sessions is not None or self.trace is not None:
                raise InputError("--random-input-len is a workload of its own: give it, "
                                 "--users or --trace, one of them")
            if self.endpoint != "completions":
                raise InputError("--random-input-len: random prompts are a completion's "
                                 "prompt, sent to /v1/completions (vllm bench's default "
                                 "endpoint): leave --endpoint out or give /v1/completions")
        elif self.prompt_form is not None:
            raise InputError(f"--prompt-form {self.prompt_form}: only random prompts "
                             "(--random-input-len) have a form to choose; leave it out")
        workloads.check_shares(self.groups, self.group_shares)

    @property
    def shares(self) -> tuple[float, ...]:
        """The prefix groups' normalised shares (one group: ())."""
        return workloads.check_shares(self.groups, self.group_shares) if self.groups > 1 \
            else ()

    def points(self) -> list[tuple[int, float | None]]:
        """Each level's (concurrency, rate), in the order they run."""
        if not self.rates:
            return [(c, self.rate) for c in self.levels]
        return [(c, r) for c in self.levels for r in self.rates]

    def floor(self, concurrency: int) -> int:
        """The level's measured requests (a timed level's least)."""
        given = [n for n in (self.requests, self.min_requests) if n is not None]
        if given:
            return max(given)
        return self.dataset.user_turns if self.dataset else default_requests(concurrency)

    def session_floor(self) -> int | None:
        """User sessions: the turns a level sends at least, when set (else its conversations
        decide)."""
        given = [n for n in (self.requests, self.min_requests) if n is not None]
        return max(given) if given else None

    def warmup_for(self, concurrency: int) -> int:
        """Warm-up requests: one per concurrent slot unless set, so every connection and the
        engine's batch of `concurrency` sequences (and the shared preamble) were exercised."""
        if self.warmup is not None:
            return self.warmup
        return TRACE_WARMUP if self.trace is not None else concurrency

    def body(self, prompt: workloads.Prompt,
             tokens: list[int] | str | None = None) -> JsonObject:
        """The request body: streamed, with the server's usage in the last chunk; `tokens`
        (a trace's or random prompt: its token ids, or their text) go to /v1/completions as
        the prompt."""
        body: JsonObject = {"model": self.model,
                                "max_tokens": prompt.max_tokens or self.max_tokens,
                                "stream": True, "stream_options": {"include_usage": True}}
        if tokens is not None:
            body["prompt"] = tokens
        elif self.endpoint == "chat":
            body["messages"] = prompt.as_messages()
        else:
            body["prompt"] = prompt.as_text()
        if self.ignore_eos or (tokens is not None and self.trace is not None):
            body["ignore_eos"] = True
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    @property
    def token_prompts(self) -> bool:
        """Prompts are made of the served model's token ids (a trace, random prompts), not of
        kvlab's text: no preamble is sized or sent."""
        return self.trace is not None or self.random_input_len is not None

    @property
    def text_prompts(self) -> bool:
        """Random prompts are sent as the server's text of their token ids."""
        return self.prompt_form == "text"

    @property
    def arrivals(self) -> str:
        """How an open-loop level's requests arrive, as rows say it."""
        if self.burstiness == 1.0:
            return "poisson"
        return "even" if self.burstiness == float("inf") else f"gamma {self.burstiness:g}"

    @property
    def path(self) -> str:
        return "/chat/completions" if self.endpoint == "chat" else "/completions"

    def block(self, level_index: int) -> int:
        """The level's block of prompt indices: disjoint per repeat, level and probe."""
        return self.block_offset + (self.repeat or 0) * max(1, len(self.points())) + level_index

    def workload(self, level: int) -> Workload:
        """What a row says about the kind of workload and its level."""
        if self.sessions is not None:
            return self.sessions.workload(level)
        if self.trace is not None:
            return Workload(kind="trace", in_flight_cap=level)
        return Workload(kind="prompt set", concurrency=level)


def _spread(mean: int, stddev: float, key: tuple[int, int, int]) -> int:
    """A whole number of tokens, at least 1, from a normal around `mean`, seeded by `key`."""
    if not stddev:
        return mean
    import numpy as np

    drawn = np.random.default_rng([abs(k) for k in key]).normal(mean, stddev)
    return max(1, round(float(drawn)))


def with_rate_type(spec: LoadSpec, rate_type: str | None, say: Say) -> LoadSpec:
    """guidellm's `--rate-type` as kvlab's levels, said as understood: synchronous is one at a
    time, concurrent its --rate values as concurrencies, throughput every request at once,
    constant and poisson --rate's arrivals (even, Poisson); sweep is refused for
    --find-capacity."""
    if rate_type is None:
        return spec
    rates = (spec.rate,) if spec.rate is not None else spec.rates
    if rate_type == "sweep":
        raise InputError("--rate-type sweep: kvlab's --find-capacity searches for the highest "
                         "load that meets a latency target (--slo); give that instead")
    if rate_type in ("constant", "poisson"):
        if not rates:
            raise InputError(f"--rate-type {rate_type}: give the requests per second with "
                             "--rate")
        return replace(spec, burstiness=math.inf if rate_type == "constant" else 1.0)
    if rate_type == "concurrent":
        if not rates or any(r != int(r) for r in rates):
            raise InputError("--rate-type concurrent: give the concurrencies with --rate, "
                             "whole numbers (4 or 1,4,8)")
        levels = tuple(int(r) for r in rates)
    else:  # synchronous, throughput
        levels = (1,) if rate_type == "synchronous" else (spec.requests or 200,)
    say(f"    --rate-type {rate_type}: closed loop at concurrency "
        f"{', '.join(map(str, levels))}")
    return replace(spec, levels=levels, rate=None, rates=())


def with_load_kind(spec: LoadSpec, rate_type: str | None, bench: BenchArgs,
                   say: Say) -> LoadSpec:
    """guidellm's load, either version's names, as kvlab's levels and limits: 0.3-0.4's
    `--rate-type` (`with_rate_type`) or 0.8's `--profile`, `--constraint` and `--override`
    (`guidellm.guide_run`), each said as understood; the same thing given twice is refused,
    and so is one result file for the levels they make."""
    found = _load_kind(spec, rate_type, bench, say)
    one_result_file(bench, len(found.points()))
    return found


def _load_kind(spec: LoadSpec, rate_type: str | None, bench: BenchArgs,
               say: Say) -> LoadSpec:
    run = guide_run(bench.profile, bench.constraint, bench.override)
    if run is None:
        return with_rate_type(spec, rate_type, say)
    for line in run.understood:
        say(f"    {line}")
    if run.max_s is not None:
        if spec.max_s is not None:
            raise InputError("--max-seconds and --constraint kind=max_duration: give it once")
        spec = replace(spec, max_s=run.max_s)
    if run.requests is not None:
        spec = replace(spec, requests=run.requests)
    if run.kind is None:
        return with_rate_type(spec, rate_type, say)
    where = f"--profile kind={run.kind}"
    if rate_type is not None:
        raise InputError(f"{where} and --rate-type {rate_type}: give one (guidellm 0.8's "
                         "--profile replaced --rate-type)")
    if spec.rate is not None or spec.rates:
        raise InputError(f"{where} and --rate: give the rate once (the profile's rate, or "
                         "--rate with --rate-type)")
    if run.rates:
        levels = run.levels or spec.levels
        say(f"    {where}: {'even' if run.kind != 'poisson' else 'Poisson'} arrivals at "
            f"{', '.join(f'{r:g}' for r in run.rates)} requests a second (--rate"
            f"{'' if run.kind == 'poisson' else ' --arrivals even'}), at most "
            f"{', '.join(map(str, levels))} in flight")
        return replace(spec, levels=levels, rate=run.rates[0] if len(run.rates) == 1 else None,
                       rates=run.rates if len(run.rates) > 1 else (),
                       burstiness=1.0 if run.kind == "poisson" else math.inf)
    levels = run.levels or ((1,) if run.kind == "synchronous" else (spec.requests or 200,))
    say(f"    {where}: closed loop at concurrency {', '.join(map(str, levels))}")
    return replace(spec, levels=levels)
