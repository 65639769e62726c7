"""What `kvlab load` and `kvlab run-load` are asked, as declared arguments, and the
`LoadSpec` they make with the settings.

`LoadArgs` is kvlab's own load options (run-load.sh passes the seed's: base URL, model,
concurrency, requests, max tokens, prompt set, label); `CapacityArgs` the capacity search's.
Each field is one command-line option (`cli/options.py` makes them: the description is its
help). The settings give what the options leave unset (SERVED_NAME, CONCURRENCY, REQUESTS,
MAX_TOKENS, PROMPT_SET, PREAMBLE_TOKENS, CTX, MEM_FRACTION) and say where the URL's split runs.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, Field

from kvlab.core import Args, InputError, LoadedSettings, Say, Settings, api_base, quiet
from kvlab.loadgen.benchargs import (
    BenchArgs,
    bench_ask,
    extra_body,
    headers,
    repetition,
    request_id_prefix,
)
from kvlab.records import LAB_NONE, LAB_OFFLOAD, LAB_PD, RunContext, Where

if TYPE_CHECKING:
    from kvlab.loadgen.capacity import Knob, LatencyTarget, SearchPlan
    from kvlab.loadgen.dataset import Dataset
    from kvlab.loadgen.linkrun import LinkSpec
    from kvlab.loadgen.slo import Objectives
    from kvlab.loadgen.spec import LoadSpec

TRACE_IN_FLIGHT = 256  # a trace's in-flight cap unless CONCURRENCY is set
OPENAI_KEY_ENV = "OPENAI_API_KEY"  # where vllm bench serve reads the servers' key
VLLM_RANDOM_INPUT_LEN = 1024  # vllm bench serve's --random-input-len default


def _no_secret(text: str) -> str:
    """Free text bound for the notebook, refused before the run when it holds a key (the
    notebook would refuse it after the run, and the run would be lost)."""
    from kvlab.core import secret_in_text

    found = secret_in_text(text)
    if found is not None:
        raise ValueError(f"holds {found}; leave it out: the notebook never keeps a secret")
    return text


NoteText = Annotated[str, AfterValidator(_no_secret)]  # a --note for the notebook line


class LoadArgs(Args):
    """kvlab's own load options, shared by `load` and `run-load`."""

    slo: tuple[str, ...] = Field(
        (), json_schema_extra={"aliases": "--goodput", "metavar": "BOUNDS"},
        description="Latency bounds, repeatable: on each request, counted as goodput "
        "('ttft<=500ms,tpot<=50ms'; e2e too), or on a percentile, the --find-capacity target "
        "('ttft_p90<=500ms,errors<=0.01'; ttft, tpot, itl, e2e at p50/p90/p95/p99). Units ms "
        "or s. Also understood, and said: ttft_ms=500, ttft_p90<=0.5 (seconds) and vllm "
        "bench's --goodput ttft:500 (ms; e2el).")
    timeout: float = Field(600.0, gt=0, description="Seconds one request may take; then it "
                           "failed.")
    rate: str | None = Field(None, json_schema_extra={"aliases": "--request-rate"},
                             description="Open loop: requests per second, capped at the "
                             "concurrency; several (1,2,4) sweep them, one level each; inf "
                             "(vllm bench's default) is the closed loop.")
    rate_type: Literal["synchronous", "concurrent", "constant", "poisson", "throughput",
                       "sweep"] | None = Field(None, description="guidellm's: synchronous, "
                                               "concurrent or throughput (closed loops), "
                                               "constant or poisson (--rate's arrivals); said "
                                               "as understood.")
    arrivals: str = Field(
        "poisson", json_schema_extra={"aliases": "--burstiness"},
        description="Open-loop arrival gaps: poisson, even (a constant rate), or vllm bench's "
        "burstiness B: gamma gaps of shape B and mean 1/rate (1 is poisson, below 1 burstier, "
        "inf even).")
    users: str | None = Field(None, description="User sessions: users per level, e.g. 4,8 "
                              "(they replace --concurrency and the prompt set).")
    turns: int = Field(4, ge=1, description="User sessions: turns per conversation.")
    think_time: str = Field("exponential:1", description="User sessions: seconds between a "
                            "reply and the next turn: fixed:S, exponential:S (mean), "
                            "trace:FILE (one value a line) or paced:N (about N users in "
                            "flight, from the warm-up's request time).")
    user_rate: float | None = Field(None, gt=0, description="User sessions: new users a "
                                    "second (Poisson), each for one conversation [default: all "
                                    "users there from the start].")
    cache_block: int | None = Field(None, ge=1, description="User sessions: the cache's block "
                                    "in tokens, for counting turns that came back after "
                                    "eviction [default: read from the cached counts].")
    prefix_groups: int = Field(1, ge=1, description="shared-prefix: how many preambles.")
    group_shares: str | None = Field(None, description="shared-prefix: each group's share of "
                                     "the requests, e.g. 0.5,0.3,0.2 [default: equal].")
    trace: str | None = Field(None, description="Replay a Mooncake-format trace (JSON lines: "
                              "timestamp ms, input_length, output_length, hash_ids) as token "
                              "prompts to /v1/completions.")
    trace_block_size: int = Field(512, ge=1, description="Tokens per hash id in the trace.")
    trace_speedup: float = Field(1.0, gt=0, description="Replay this many times faster.")
    trace_limit: int | None = Field(None, ge=1, description="Replay the trace's first N "
                                    "requests only, counted in the file before any is left "
                                    "out (with --trace-over-max-input filter, fewer are sent).")
    trace_max_input: int | None = Field(None, ge=1, description="Prompts longer than this many "
                                        "tokens are cut to fit or left out (see "
                                        "--trace-over-max-input; counted in the row).")
    trace_over_max_input: Literal["truncate", "filter"] = Field(
        "truncate", description="A request over --trace-max-input: truncate keeps it with its "
        "blocks cut to fit (reuse computed on what is sent); filter leaves it out.")
    dataset: str | None = Field(
        None, json_schema_extra={"aliases": "--dataset-path --data --input-file"},
        description="Your dataset file: a ShareGPT JSON list (conversations of from/value "
        "messages) or JSON lines of prompts (prompt or text, optional output_tokens or "
        "output_length); one-message records are sent as prompts, conversations replayed as "
        "user sessions (--users, else the concurrency levels, are the users).")
    dataset_name: Literal["auto", "sharegpt", "custom", "random", "prefix_repetition",
                          "single_turn", "multi_turn", "mooncake_trace"] = Field(
        "auto", json_schema_extra={"aliases": "--custom-dataset-type"},
        description="How --dataset is read: sharegpt, custom or single_turn (JSON lines of "
        "prompts), multi_turn (aiperf's turns), mooncake_trace (a trace, as --trace) or auto "
        "(each record by its keys); random: no file, random token prompts of "
        "--random-input-len tokens (1,024 unless given, as vllm bench); prefix_repetition: "
        "random prompts sharing --prefix-repetition-num-prefixes prefixes, as vllm bench.")
    preamble_tokens: int | None = Field(None, ge=1, description="Preamble size, approximate "
                                        "tokens (default: PREAMBLE_TOKENS).")
    seed: int = Field(0, description="Workload seed.")
    endpoint: str | None = Field(None, description="chat or completions, or the path as vllm "
                                 "bench takes it: /v1/chat/completions or /v1/completions "
                                 "[default: chat; completions for --trace and "
                                 "--random-input-len].")
    ignore_eos: bool = Field(False, description="Ask for exactly --max-tokens tokens.")
    send_oversized: bool = Field(False, description="Send prompts the served context cannot "
                                 "hold (each a failed request: to measure a server's "
                                 "refusals). Default: a preamble from the settings is cut to "
                                 "fit, one you named is refused.")
    kv_cache_type: str | None = Field(None, description="Record the server's KV type (f16, "
                                      "q8_0, ...).")
    no_metrics: bool = Field(False, description="Do not scrape the server's /metrics.")
    no_progress: bool = Field(False, description="No progress bars.")
    warmup: int | None = Field(None, ge=0, json_schema_extra={
        "aliases": "--warmup-request-count"}, description="Requests sent first at each level and "
                               "left out of every statistic (marked in the per-request file) "
                               "[default: one per concurrent request; 1 for --trace; 2 per "
                               "probe with --find-capacity].")
    min_requests: int | None = Field(None, ge=1, description="Measured requests per level at "
                                     "least [default: REQUESTS when set, else max(10 x "
                                     "concurrency, 200)].")
    duration: float | None = Field(None, gt=0, description="Seconds each level runs at least "
                                   "(and at least --min-requests).")
    processes: int | None = Field(None, ge=1, description="Processes sending each open-loop "
                                  "level on its one schedule [default: as many as its rate "
                                  "needs by the client's CPU a request on the warm-up].")
    max_seconds: float | None = Field(None, gt=0, description="Seconds after which a level "
                                      "sends nothing more (what is in flight finishes; the "
                                      "rest is counted unsent), as guidellm's.")
    prompt_sizing: Literal["tokenizer", "estimate"] = Field(
        "tokenizer", description="Size prompts in the served model's tokens through its "
        "/tokenize, or by the 1.3-tokens-a-word estimate (also the fallback when the server "
        "has no /tokenize).")
    tokenize_url: str = Field("", description="The engine whose /tokenize sizes the prompts "
                              "[default: the base URL's server, then --metrics-url's; behind a "
                              "proxy, an engine].")
    tokenizer: str = Field("", description="The model's directory or tokenizer.json on this "
                           "machine: random and trace prompts are made in its tokens here, "
                           "for a server with no /tokenize (as vllm bench's --tokenizer).")


def burstiness(given: str) -> float:
    """`--arrivals`/`--burstiness` as the gamma shape: poisson 1, even infinity, or B > 0."""
    word = given.strip().lower()
    if word in ("poisson", "even"):
        return 1.0 if word == "poisson" else math.inf
    try:
        value = float(word)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"--arrivals {given!r}: give poisson, even or a burstiness above 0 "
                         "(vllm bench's --burstiness: 1 is poisson, inf even)")
    return value


ENDPOINTS = {"chat": "chat", "completions": "completions", "/v1/chat/completions": "chat",
             "/v1/completions": "completions"}


def endpoint_word(given: str) -> Literal["chat", "completions"]:
    """`--endpoint` as kvlab's word, from the word or vllm bench's path."""
    word = ENDPOINTS.get(given.rstrip("/") or given)
    if word is None:
        raise InputError(f"--endpoint {given!r}: give chat or completions (or "
                         "/v1/chat/completions, /v1/completions)")
    return "chat" if word == "chat" else "completions"


def understood_url(given: str) -> tuple[str, str]:
    """The OpenAI base URL for `--base-url` (kvlab's /v1 root, or vllm bench's server root),
    and the words that say which was understood ("" when it was the /v1 root)."""
    if "://" not in given:  # aiperf's --url localhost:8000
        url = api_base("http://" + given)
        return url, f"--base-url {given}: a host and port, as aiperf takes it; requests go " \
            f"to {url}"
    url = api_base(given)
    if url == given.rstrip("/"):
        return url, ""
    return url, f"--base-url {given}: a server root, as vllm bench takes it; requests go to {url}"


class TargetArgs(Args):
    """What `kvlab load` is pointed at (the options run-load.sh passes to Part 9's
    load-test.py), each unset one from the settings."""

    base_url: str | None = Field(None, json_schema_extra={"aliases": "--url --target"},
                                 description="The server's OpenAI base URL, e.g. "
                                 "http://127.0.0.1:8200/v1; the server root and a bare "
                                 "host:port are taken too, and said.")
    backend: str | None = Field(None, json_schema_extra={"metavar": "kind=openai_http,..."},
                                description="guidellm 0.8's backend: its target is read as "
                                "--base-url, its model as --model.")
    model: str | None = Field(None, description='Name sent in "model" (default: SERVED_NAME).')
    concurrency: str | None = Field(None, json_schema_extra={"aliases": "--max-concurrency"},
                                    description="Levels, e.g. 1,4,8 (default: CONCURRENCY).")
    requests: int | None = Field(None, json_schema_extra={
        "aliases": "--num-prompts --request-count --max-requests"},
                                 description="Measured requests per level (default: "
                                 "REQUESTS when set, else max(10 x concurrency, 200)).")
    max_tokens: int | None = Field(None, json_schema_extra={
        "aliases": "--random-output-len --output-tokens-mean"},
                                   description="Output tokens per request (default: "
                                   "MAX_TOKENS).")
    prompt_set: str | None = Field(None, description="shared-prefix, mixed or multi-turn "
                                   "(default: PROMPT_SET).")
    label: str = Field("load", description="Label of the rows.")
    engine: Literal["vllm", "llama.cpp", "llamacpp"] = Field(
        "vllm", description="Whose /tokenize sizes the prompts and whose counters the rows "
        "read.")
    labbook: str | None = Field(None, description="Notebook file (default: LABBOOK).")
    lab: Literal["pd", "offload"] | None = Field(None, description="Which lab the rows belong "
                                                 "to [default: pd; a trace's: none].")
    metrics_url: tuple[str, ...] = Field(
        (), description="The engine's /metrics for the counter deltas (default: the URL's "
        "server; behind a proxy, give the decode engine's). Repeat it for replicas behind a "
        "front: each replica's hits and share are shown and the counters summed.")
    print_load_test_path: bool = Field(False, description="Print a file that works as "
                                       "LOAD_TEST for the seed's run-load.sh, and exit.")

    def overrides(self) -> dict[str, object]:
        """The settings these options override (flag > environment > .env)."""
        return {"served_name": self.model, "concurrency": self.concurrency,
                "requests": self.requests, "max_tokens": self.max_tokens,
                "prompt_set": self.prompt_set, "labbook": self.labbook}

    def read_backend(self, say: Say) -> TargetArgs:
        """guidellm 0.8's --backend as --base-url and --model (`guidellm.guide_backend`)."""
        from kvlab.loadgen.guidellm import guide_backend

        url, model = guide_backend(self.backend, self.base_url, self.model, say)
        return self.model_copy(update={"base_url": url, "model": model})


class CapacityArgs(Args):
    """`kvlab load --find-capacity`: the highest load that meets `--slo`'s target."""

    find_capacity: bool = Field(False, description="Search the load for the highest that "
                                "meets --slo's target (one row per probe, labelled "
                                "LABEL-capacity, then one capacity line).")
    capacity_knob: Literal["rate", "concurrency", "users", "speedup"] | None = Field(
        None, description="What the search raises [default: users with --users, speedup with "
        "--trace, else the open-loop rate].")
    capacity_start: float = Field(1.0, gt=0, description="The first load tried.")
    capacity_max: float | None = Field(None, gt=0, description="The highest load tried.")
    capacity_steps: int = Field(8, ge=1, description="Probes at most.")
    capacity_resolution: float = Field(0.1, gt=0, description="Stop when the loads that met "
                                       "and missed are this close (share of the load that "
                                       "met; whole numbers: one apart).")
    capacity_repeats: int = Field(1, ge=1, description="Measure a probe again, up to this "
                                  "many times, while its interval straddles a bound.")

    def search(self, load: LoadArgs, spec: LoadSpec) -> tuple[LatencyTarget, Knob, SearchPlan]:
        """The target, the knob and the plan; refuses a search the workload cannot run."""
        from kvlab.loadgen.capacity import Knob, LatencyTarget, SearchPlan, check_knob

        objectives = slo_objectives(load.slo, find_capacity=True)
        if objectives is None:
            raise InputError("--find-capacity needs --slo with the target, e.g. "
                             "--slo 'ttft_p90<=500ms,tpot_p90<=50ms'")
        knob = Knob.of(self.capacity_knob or ("users" if spec.sessions else "speedup"
                                              if spec.trace else "rate"))
        check_knob(knob, spec)
        plan = SearchPlan(start=self.capacity_start, max_load=self.capacity_max,
                          max_steps=self.capacity_steps, resolution=self.capacity_resolution,
                          repeats=self.capacity_repeats, duration_s=load.duration or 15.0,
                          min_requests=load.min_requests or 20,
                          floor_given=load.min_requests is not None,
                          warmup=2 if load.warmup is None else load.warmup)
        return LatencyTarget.of(objectives, " ".join(load.slo)), knob, plan


def lab_named(name: str | None) -> str | None:
    """`--lab pd|offload` as the lab's full name (None: not given)."""
    return None if name is None else LAB_PD if name == "pd" else LAB_OFFLOAD


def floats(option: str, text: str | None) -> tuple[float, ...]:
    """A comma-separated list of positive numbers (empty when not given)."""
    if not text:
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{option} {text!r}: give numbers separated by commas") from None
    if any(not v > 0 for v in values):
        raise InputError(f"{option} {text!r}: every value must be above 0")
    return values


def split_topology(settings: Settings, base_url: str) -> Where:
    """What the URL and the settings honestly say about the machines behind `base_url`."""
    from kvlab.loadgen import topology

    known = topology.Known(
        connector=settings.connector, prefill_host=settings.prefill_host,
        decode_host=settings.decode_host, proxy_port=settings.proxy_port,
        cluster_iface=settings.cluster_iface,
        legs=topology.proxy_legs(base_url, settings.api_key()))
    return topology.derive(base_url, known)


def load_spec(loaded: LoadedSettings, args: LoadArgs, *, base_url: str, label: str,
              engine: str, lab: str | None, metrics_urls: tuple[str, ...] = (),
              find_capacity: bool = False, bench: BenchArgs | None = None,
              say: Say = quiet) -> LoadSpec:
    """A LoadSpec from the settings and the arguments (`lab` None: the P/D lab's, a trace's
    none); how an older or another tool's spelling was understood is said."""
    from kvlab.engines import canonical_name
    from kvlab.loadgen.spec import with_load_kind
    from kvlab.loadgen.stats import Slo
    from kvlab.loadgen.sweep import LoadSpec

    settings, bench = loaded.values, bench or BenchArgs()
    args, bench, max_tokens = _understood(args, bench, settings.max_tokens, say)
    objectives = slo_objectives(args.slo, find_capacity, say)
    context = RunContext(context_length=settings.ctx, memory_fraction=settings.mem_fraction,
                         kv_cache_type=args.kv_cache_type or None)
    context.overlay(split_topology(settings, base_url))
    # vllm bench's default rate, inf, sends everything at once under the cap: a closed loop
    rates = tuple(r for r in floats("--rate", args.rate) if r != math.inf)
    tokens = bool(args.trace) or bench.random_input_len is not None
    spec = LoadSpec(
        base_url=base_url, model=settings.served_name, levels=tuple(settings.concurrency),
        requests=loaded.values.requests, max_tokens=max_tokens,
        prompt_set=settings.prompt_set, label=label, engine=canonical_name(engine),
        endpoint=endpoint_word(args.endpoint) if args.endpoint
        else "completions" if tokens else "chat",
        timeout_s=args.timeout, burstiness=burstiness(args.arrivals),
        slo=Slo.of(objectives) if objectives else None,
        preamble_tokens=args.preamble_tokens or settings.preamble_tokens, seed=args.seed,
        ignore_eos=args.ignore_eos, scrape_metrics=not args.no_metrics,
        metrics_urls=metrics_urls, lab=lab or (LAB_NONE if args.trace else LAB_PD),
        context=context, min_requests=args.min_requests,
        duration_s=args.duration, max_s=args.max_seconds, warmup=args.warmup,
        labbook=settings.labbook,
        size_prompts=args.prompt_sizing == "tokenizer", tokenize_url=args.tokenize_url,
        tokenizer=args.tokenizer, processes=args.processes,
        rate=rates[0] if len(rates) == 1 else None, rates=rates if len(rates) > 1 else (),
        groups=args.prefix_groups, group_shares=floats("--group-shares", args.group_shares),
        model_source="default" if loaded.unset("served_name") else "named",
        oversized="send" if args.send_oversized else "fit"
        if args.preamble_tokens is None and loaded.unset("preamble_tokens") else "refuse",
        temperature=bench.temperature, extra_body=extra_body(bench.extra_body,
                                                             bench.temperature),
        headers=headers(bench.header), request_id_prefix=request_id_prefix(
            bench.request_id_prefix), random_input_len=bench.random_input_len,
        prompt_form=bench.prompt_form, input_stddev=bench.input_stddev, shared_prefixes=(
            bench.prefix_repetition_num_prefixes, bench.prefix_repetition_prefix_len)
        if args.dataset_name == "prefix_repetition" else None,
        output_stddev=bench.output_tokens_stddev,
        bench=bench_ask(bench, objectives, len(settings.concurrency) * max(1, len(rates))))
    return _workload(loaded, args, with_load_kind(spec, args.rate_type, bench, say))


def _understood(args: LoadArgs, bench: BenchArgs, max_tokens: int,
                say: Say) -> tuple[LoadArgs, BenchArgs, int]:
    """Other tools' workloads as kvlab's, each said as understood: aiperf's mooncake_trace
    file (a --trace), guidellm's `--data "prompt_tokens=N,output_tokens=M"` and vllm bench's
    prefix_repetition and random datasets (random token prompts)."""
    from kvlab.loadgen.dataset import synthetic

    if args.dataset_name == "mooncake_trace" and args.dataset:
        say(f"    --custom-dataset-type mooncake_trace: {args.dataset} replayed as --trace")
        return (args.model_copy(update={"trace": args.dataset, "dataset": None,
                                        "dataset_name": "auto"}), bench, max_tokens)
    if (found := synthetic(args.dataset)) is not None:
        tokens, output = found
        say(f"    --data {args.dataset}: random prompts of {tokens:,} tokens "
            "(--random-input-len)" + (f", answers of at most {output:,} (--max-tokens)"
                                      if output else ""))
        args, max_tokens = args.model_copy(update={"dataset": None}), output or max_tokens
        bench = bench.model_copy(update={"random_input_len": tokens})
    if args.dataset_name == "prefix_repetition":
        bench, max_tokens = repetition(bench, max_tokens, say)
    if args.dataset_name == "random" and bench.random_input_len is None:
        say(f"    --dataset-name random: random prompts of {VLLM_RANDOM_INPUT_LEN:,} tokens, "
            "vllm bench's default --random-input-len (give it for another size)")
        bench = bench.model_copy(update={"random_input_len": VLLM_RANDOM_INPUT_LEN})
    return args, bench, max_tokens


def slo_objectives(given: tuple[str, ...], find_capacity: bool,
                   say: Say = quiet) -> Objectives | None:
    """`--slo`/`--goodput`'s terms, each older spelling said as understood; a percentile bound
    is refused without --find-capacity (it is a search's target)."""
    from kvlab.loadgen import slo

    if not given:
        return None
    text = " ".join(given)
    objectives = slo.parse(text)
    for line in objectives.understood:
        say(f"    {line}")
    if objectives.percentiles and not find_capacity:
        raise InputError(f"--slo {text!r}: {objectives.percentiles[0].text()} bounds a "
                         "percentile, a --find-capacity target; a bound on each request "
                         "(e.g. ttft<=500ms) counts goodput")
    return objectives


def _workload(loaded: LoadedSettings, args: LoadArgs, spec: LoadSpec) -> LoadSpec:
    """User sessions (the levels become user counts) or a trace (token prompts to
    /v1/completions), when asked."""
    from kvlab.loadgen.sessions import SessionSpec, ThinkTime
    from kvlab.loadgen.trace import TraceSpec

    data = dataset_of(args)
    if args.users or (data is not None and data.conversations):
        users = tuple(int(v) for v in floats("--users", args.users)) if args.users \
            else spec.levels
        spec = replace(spec, levels=users, dataset=data,
                       sessions=SessionSpec(turns=data.max_turns if data else args.turns,
                                            think=ThinkTime.parse(args.think_time),
                                            user_rate=args.user_rate,
                                            cache_block_tokens=args.cache_block))
    elif data is not None:
        spec = replace(spec, dataset=data)
    if args.trace:
        default = loaded.unset("concurrency")  # nobody asked a cap
        spec = replace(spec, trace=TraceSpec(args.trace, args.trace_block_size,
                                             args.trace_speedup, args.trace_limit,
                                             args.trace_max_input, args.trace_over_max_input),
                       levels=(TRACE_IN_FLIGHT,) if default else spec.levels)
    return spec


def dataset_of(args: LoadArgs) -> Dataset | None:
    """The user's dataset file read (`loadgen/dataset.py`), when one was given."""
    from kvlab.loadgen.dataset import FILE_KINDS, DatasetSpec, read

    kind = FILE_KINDS.get(args.dataset_name)
    if kind is None and args.dataset:  # random, prefix_repetition (a trace is a --trace)
        raise InputError(f"--dataset-name {args.dataset_name}: random token prompts, no file; "
                         f"leave out --dataset-path {args.dataset}, or name sharegpt or custom")
    if kind is None or not args.dataset:
        if kind not in (None, "auto") or args.dataset_name == "mooncake_trace":
            raise InputError(f"--dataset-name {args.dataset_name}: give the file with "
                             "--dataset-path FILE")
        return None
    return read(DatasetSpec(args.dataset, kind))


def openai_key(loaded: LoadedSettings) -> tuple[LoadedSettings, str]:
    """vllm bench's key: with LOADTEST_API_KEY_ENV unset and its variable empty, the settings
    read the servers' key from OPENAI_API_KEY instead (sent, redacted and never written like
    any key); and the words that say so, or ""."""
    settings = loaded.values
    if not loaded.unset("loadtest_api_key_env") or settings.api_key() \
            or not os.environ.get(OPENAI_KEY_ENV):
        return loaded, ""
    values = settings.model_copy(update={"loadtest_api_key_env": OPENAI_KEY_ENV})
    return replace(loaded, values=values), (
        f"the servers' API key from {OPENAI_KEY_ENV}, as vllm bench reads it "
        f"({settings.loadtest_api_key_env} is empty)")


def link_spec(settings: Settings, spec: LoadSpec, metrics_urls: tuple[str, ...]) -> LinkSpec:
    """run-load.sh's counters around `spec`'s sweep, from the settings (CONNECTOR, CTX,
    CLUSTER_IFACE, LOAD_TEST, SIDE_CHANNEL_ADDR for a point-to-point connector)."""
    from kvlab.core import connectors
    from kvlab.loadgen.linkrun import LinkSpec, check_load_test

    if settings.load_test:
        check_load_test(settings.load_test)
    return LinkSpec(connector=settings.connector, context_length=settings.ctx,
                    iface=settings.cluster_iface, load_test=settings.load_test,
                    metrics_urls=metrics_urls,
                    side_channel_addr=settings.side_channel_addr
                    if connectors.get(settings.connector).side_channel else "",
                    where=Where.part_of(spec.context))
