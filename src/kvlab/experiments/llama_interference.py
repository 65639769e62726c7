"""`kvlab run interference`: the P/D lab's Track M reduced path, on llama-server.

Prefill interference, measured on hardware that cannot remove it: the same load (concurrency
4, the settings' prompt set, requests and max tokens) against llama-server started with
`--parallel 4` and then `--parallel 1`, every other flag the same. With four slots the four
conversations share each batch; with one they queue behind each other's prefill. Each run is
one load row (label `LABEL-parallel-N`, the seed's load-row shape plus the server settings);
a `comparison` line pairs them.

CTX is the same for both runs, so at `--parallel 4` a slot holds CTX/4 tokens: the prompt
set's preamble is sized with the server's own chat template and tokenizer to fit that.
The load comes from a `LoadFn`; the default is kvlab's load generator, one level per run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from kvlab.engines import LLAMA_CPP, EnginePlan, llamacpp, startup
from kvlab.engines.llamacpp import (
    TEMPLATE_MARGIN,
    LlamaClient,
    LlamaTarget,
    check_fits,
    server_fields,
    server_plan,
)
from kvlab.experiments import repeats
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.sizes import AllSpec
from kvlab.loadgen import workloads
from kvlab.measure import intervals
from kvlab.records import (
    INTERFERENCE,
    ComparisonLevel,
    ComparisonRecord,
    LoadRecord,
    Percentiles,
    Record,
    RunContext,
    interference_label,
    notebook,
)


@dataclass(frozen=True)
class Workload:
    """What every request of both runs looks like."""

    model: str
    prompt_set: str
    preamble_tokens: int
    max_tokens: int
    seed: int = 0


# (base_url with /v1, concurrency, requests, workload, label, what the rows state of the
#  server, api key, the notebook its per-request file goes beside, which repeat) -> row
LoadFn = Callable[[str, int, int, Workload, str, RunContext, str, str, int | None],
                  Awaitable[LoadRecord]]


async def loadgen_level(base_url: str, concurrency: int, requests: int, workload: Workload,
                        label: str, context: RunContext, api_key: str,
                        labbook: str, repeat: int | None = None) -> LoadRecord:
    """One level of kvlab's load generator; its row, not yet appended."""
    from kvlab.loadgen import LoadSpec, run_sweep

    spec = LoadSpec(base_url=base_url, model=workload.model, levels=(concurrency,),
                    requests=requests, max_tokens=workload.max_tokens,
                    prompt_set=workload.prompt_set, label=label, engine=LLAMA_CPP,
                    preamble_tokens=workload.preamble_tokens, seed=workload.seed, context=context,
                    labbook=labbook, repeat=repeat)
    return (await run_sweep(spec, api_key=api_key)).rows[0]


@dataclass(frozen=True)
class InterferenceSpec:
    """The one variable (`parallels`) and everything held fixed."""

    concurrency: int = 4
    parallels: tuple[int, ...] = (4, 1)
    requests: int | None = None  # None: the load generator's default for the concurrency
    max_tokens: int = 16
    prompt_set: str = "shared-prefix"
    ctx: int = 4096
    label: str = "interference"
    seed: int = 0
    repeat: int = 1  # each run this many times, in alternating order (4 1 1 4 ...)

    def budget(self) -> int:
        """Most prompt tokens one request may carry at the largest --parallel."""
        budget = self.ctx // max(self.parallels) - self.max_tokens - TEMPLATE_MARGIN
        if budget < 64:
            check_fits(64, self.max_tokens, self.ctx, max(self.parallels))
        return budget

    def label_for(self, parallel: int) -> str:
        return f"{self.label}-parallel-{parallel}" if self.label != INTERFERENCE.label \
            else interference_label(parallel)

    @property
    def count(self) -> int:
        """Requests per run."""
        from kvlab.loadgen import default_requests

        return self.requests or default_requests(self.concurrency)


async def fit_preamble(client: LlamaClient, spec: InterferenceSpec) -> int:
    """The largest preamble size whose longest prompt fits a slot, in this server's tokens."""
    budget = spec.budget()
    size = budget
    for _ in range(6):
        prompts = workloads.build(spec.prompt_set, spec.count, seed=spec.seed,
                                  preamble_tokens=size)
        longest = max([await client.chat_tokens(p.as_messages()) for p in prompts])
        if longest <= budget:
            return size
        size = max(16, int(size * budget / longest * 0.97))
    check_fits(longest, spec.max_tokens, spec.ctx, max(spec.parallels))
    return size


def all_spec(lab: Lab, sizes: AllSpec) -> InterferenceSpec:
    """The interference runs at `kvlab run all`'s sizes, on distinct prompts: a shared
    preamble would let one slot reuse it and hide the interference."""
    return InterferenceSpec(requests=max(sizes.requests, 8) if sizes.requests else None,
                            max_tokens=sizes.max_tokens, prompt_set="mixed", ctx=lab.settings.ctx)


async def run(lab: Lab, spec: InterferenceSpec, *,
              load: LoadFn = loadgen_level) -> list[Record]:
    """The runs in alternating order (one server start per stint), each load row written
    as it ends, then the comparison."""
    spec.budget()
    binary = llamacpp.require_llama_server(lab.settings)
    accepted = llamacpp.help_flags(binary)
    workload: Workload | None = None
    rows: list[LoadRecord] = []
    for stint in repeats.stints(spec.repeat, len(spec.parallels)):
        parallel = spec.parallels[stint.side]
        plan = server_plan(lab.settings, binary, role=f"interference-{parallel}", ctx=spec.ctx,
                           parallel=parallel, accepted=accepted,
                           slot_dir=lab.scratch("interference-slots"))
        async with engines(lab, [plan], labels=[spec.label_for(parallel)]) as (proc,):
            plan = proc.plan  # as started: on a Ray node, its address and port
            workload = workload or await _workload(lab, spec, plan)
            context = await _server_context(plan, proc.log_text(), spec, parallel)
            for repeat in stint.repeats:
                lab.say(f"--parallel {parallel}: {spec.count} requests at concurrency "
                        f"{spec.concurrency} ({spec.prompt_set}, preamble "
                        f"{workload.preamble_tokens})"
                        + (f", repeat {repeat + 1} of {spec.repeat}" if repeat is not None
                           else ""))
                rows.append(lab.record(await load(
                    plan.base_url + "/v1", spec.concurrency, spec.count, workload,
                    spec.label_for(parallel), context, lab.api_key(),
                    lab.settings.labbook, repeat)))
    return [*rows, lab.record(comparison(spec, rows, Path(lab.settings.labbook)))]


async def _workload(lab: Lab, spec: InterferenceSpec, plan: EnginePlan) -> Workload:
    """The requests every run sends, their preamble fitted to a slot with this server's
    tokenizer; then one short request, so that model residency is not what is measured."""
    async with LlamaClient(LlamaTarget.from_plan(plan), lab.api_key()) as client:
        workload = Workload(lab.settings.served_name, spec.prompt_set,
                            await fit_preamble(client, spec), spec.max_tokens, spec.seed)
        await client.chat("Warm up.", max_tokens=2, model=lab.settings.served_name)
    return workload


async def _server_context(plan: EnginePlan, log: str, spec: InterferenceSpec,
                          parallel: int) -> RunContext:
    """The fields every row of this server states: version, slots, capacity, KV types."""
    server = server_fields(plan, spec.ctx, parallel, None)
    server.capacity = startup.capacity(plan, log)
    context = RunContext(engine_version=await startup.server_version(plan),
                         llama_parallel=parallel, varied="llama_parallel", server=server)
    return context.overlay(llamacpp.kv_label(*llamacpp.kv_types(plan)))


def _p50(figures: Percentiles | None) -> float | None:
    return figures.p50 if figures is not None else None


def _cached_mean(row: LoadRecord) -> float | None:
    """Prompt tokens the server reused per response: reuse, not interference, if high."""
    cached = row.cached_tokens_per_response
    return cached.mean if cached is not None else None


def _ratio(new: float | None, old: float | None) -> float | None:
    return round(new / old, 3) if new is not None and old else None


def _level(rows: list[LoadRecord], row: LoadRecord, base: LoadRecord,
           book: Path | None) -> ComparisonLevel:
    """One candidate against the baseline: both sides' p50s, the ratios, their intervals."""
    found = intervals.between(book, rows, row, base) if book is not None else {}
    b_ttft, c_ttft = _p50(base.ttft_s), _p50(row.ttft_s)
    b_tpot, c_tpot = _p50(base.tpot_s), _p50(row.tpot_s)
    b_out, c_out = base.output_tokens_per_s, row.output_tokens_per_s
    return ComparisonLevel(
        concurrency=row.concurrency, candidate_label=row.label,
        llama_parallel=row.llama_parallel, ttft_p50_candidate_s=c_ttft,
        ttft_p50_baseline_s=b_ttft, ttft_p50_ratio=_ratio(c_ttft, b_ttft),
        tpot_p50_candidate_s=c_tpot, tpot_p50_baseline_s=b_tpot,
        tpot_p50_ratio=_ratio(c_tpot, b_tpot), output_tokens_per_s_candidate=c_out,
        output_tokens_per_s_baseline=b_out, output_tokens_per_s_ratio=_ratio(c_out, b_out),
        failed=row.failed, failed_baseline=base.failed,
        cached_tokens_mean_candidate=_cached_mean(row),
        cached_tokens_mean_baseline=_cached_mean(base),
        intervals={k: iv.as_record() for k, iv in found.items()} or None,
        repeats=len(intervals.repeats(rows, row)))


def held_fixed(row: LoadRecord) -> dict[str, object]:
    """What every run must share for its ratio to be the slots' alone."""
    return {"model": row.model, "prompt_set": row.prompt_set,
            "preamble_tokens": row.preamble_tokens, "max_tokens": row.max_tokens,
            "concurrency": row.concurrency, "requests": row.requests,
            "kv_cache_type": row.kv_cache_type}


HELD_FIXED = ("model", "prompt_set", "preamble_tokens", "max_tokens", "concurrency",
              "requests", "kv_cache_type")  # the keys of held_fixed()


def comparison(spec: InterferenceSpec, rows: list[LoadRecord],
               book: Path | None = None) -> ComparisonRecord:
    """Each run's newest row paired against the first run's (most slots): TTFT, TPOT and
    throughput ratios, each with its interval over requests and repeats when the rows name
    per-request files beside `book`."""
    newest = {row.label: row for row in rows}
    base, others = newest[spec.label_for(spec.parallels[0])], \
        [newest[spec.label_for(p)] for p in spec.parallels[1:]]
    fixed = held_fixed(base)
    differs = sorted({f for row in others for f, v in held_fixed(row).items() if v != fixed[f]})
    levels = [_level(rows, row, base, book) for row in others]
    return ComparisonRecord(
        label=spec.label, lab=notebook.LAB_PD, experiment="interference",
        baseline_label=base.label, candidate_labels=[r.label for r in others],
        varied={"llama_parallel": list(spec.parallels)}, held_fixed=list(HELD_FIXED),
        same_experiment=not differs, differs=differs, model=base.model,
        prompt_set=base.prompt_set, ctx=spec.ctx, levels=levels,
        interval_method=intervals.METHOD,
        note=("ratios are candidate / baseline (the run with the most slots); a TTFT ratio "
              "above 1 is the prefill interference that fewer slots cannot hide"),
    )
