"""`kvlab run llama-tiers`: llama.cpp's path through the offload lab's tasks 2 and 3, and its
quantised cache, each with one variable changed and the rows the vLLM ones have.

- turns (task 2): six turns of one conversation against llama-server started with
  `--no-cache-prompt`, then `--cache-prompt` (`reuse` lines `llama-prompt-off`/`-on`);
  the RAM cache is off on both, so prompt caching is the one variable.
- pressure (task 3): user sessions, three times as many users as slots, against llama-server
  with few slots: `--cache-ram 0` (no host tier: a returning user whose slot another
  conversation took recomputes), then a RAM cache sized to hold every conversation, then one
  a third of what the slots cannot hold (`load` lines `llama-ram-off-load`, `-on-load`,
  `-small-load`). The pressure is planned (conversations against slots, the working set in
  bytes from the server's own KV line) and reached (cached tokens, returning turns after
  eviction, and the RAM cache's saves, loads and peak size from the server's log). The think
  time of the first run is every run's.
- quant: f16 KV against q8_0 in the same memory: the f16 server's KV cache from its startup
  line is the budget, the q8_0 server gets the context that fits it; each states the tokens
  that fit, is timed on the same distinct prompts (concurrency 1, nothing reused), and answers
  one prompt for the first token's top logprobs; a prompt longer than the f16 side holds is
  sent to both (`load` lines `llama-kv-f16`/`llama-kv-q8_0`, then a `kv-quant` line).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from kvlab.core import EngineError, SettingError, api_base
from kvlab.engines import LLAMA_CPP, EnginePlan, EngineProcess, llamacpp, startup
from kvlab.engines.llamacpp import (
    LLAMA_CPP_ENGINE,
    LlamaClient,
    LlamaTarget,
    prompt_of,
    server_fields,
    server_plan,
)
from kvlab.experiments import repeats
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.offload import require_successes
from kvlab.experiments.pressure_plan import OVERSUBSCRIPTION, TURNS, think_of
from kvlab.experiments.sizes import AllSpec
from kvlab.loadgen import LoadSpec, workloads
from kvlab.measure import (
    PREAMBLE_WORDS,
    TURN_MAX_TOKENS,
    ReuseOptions,
    intervals,
    reuse_record,
    run_reuse,
)
from kvlab.observe import logprob_gap, sampling
from kvlab.records import (
    LLAMA_KV_QUANT,
    LLAMA_PROMPT_OFF,
    LLAMA_PROMPT_ON,
    LLAMA_RAM_CURVE,
    LLAMA_RAM_OFF,
    LLAMA_RAM_ON,
    LLAMA_RAM_SMALL,
    KvCapacity,
    KvQuantRecord,
    KvTypeSide,
    LoadRecord,
    Pressure,
    PressurePlanned,
    PressureReached,
    Record,
    Row,
    RunContext,
    notebook,
)

LAB = notebook.LAB_OFFLOAD
PARTS = ("turns", "pressure", "curve", "quant")
# --part curve: RAM cache sizes, as shares of what it must hold (1: every conversation)
CURVE_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
MIB = 2**20
TIER_MARGIN = 1.1  # the RAM cache that holds the working set, with room for the templates
FIT = 0.9  # a conversation's last turn may fill this share of a slot
REFERENCE, CANDIDATE = "f16", "q8_0"


@dataclass(frozen=True)
class LlamaTiersSpec:
    """Each part's sizes; the parts to run, in this order."""

    parts: tuple[str, ...] = PARTS
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    turn_max_tokens: int = TURN_MAX_TOKENS
    slots: int = 2
    users: int = 0  # 0: OVERSUBSCRIPTION times the slots
    slot_ctx: int = 4096  # tokens per slot in the pressure runs
    preamble_tokens: int = 1200
    max_tokens: int = 32
    think_time: str = ""  # loadgen.sessions.ThinkTime; "": paced to one user per slot
    repeat: int = 1
    small_share: float = 1 / 3  # the smaller RAM cache: this share of what it must hold
    quant_ctx: int = 4096  # the f16 side's --ctx-size: its KV cache is both sides' budget
    quant_requests: int = 16  # 8 gave [0.18, 2.75] once: a stray slow stretch on 2 cores
    quant_prompt_tokens: int = 1000  # the timed prompts' documents: a quarter to all of this

    def check(self) -> None:
        unknown = [p for p in self.parts if p not in PARTS]
        if unknown or not self.parts:
            raise SettingError(f"--part {','.join(self.parts)}: choose from {', '.join(PARTS)}"
                               " or all")
        if self.slots < 1 or self.users_or_default < 2 * self.slots:
            raise SettingError(f"--users {self.users}: give at least twice the {self.slots} "
                               "slots, so that returning users find their slot taken")
        if not 0 < self.small_share < 1:
            raise SettingError(f"small tier share {self.small_share}: give a share in (0, 1)")
        if self.quant_prompt_tokens + 64 > self.quant_ctx:
            raise SettingError(f"--quant-prompt-tokens {self.quant_prompt_tokens}: must fit "
                               f"the f16 side's --ctx-size {self.quant_ctx} with 64 to spare")

    @property
    def users_or_default(self) -> int:
        return self.users or math.ceil(OVERSUBSCRIPTION * self.slots)


def all_spec(lab: Lab, sizes: AllSpec) -> LlamaTiersSpec:
    """llama.cpp's tiers at `kvlab run all`'s sizes."""
    return LlamaTiersSpec(turns=sizes.turns, preamble_words=sizes.preamble_words,
                          slot_ctx=sizes.llama_slot_ctx, quant_ctx=2 * sizes.llama_slot_ctx,
                          quant_prompt_tokens=sizes.llama_slot_ctx // 2)


async def run(lab: Lab, spec: LlamaTiersSpec) -> list[Record]:
    """The parts asked for, each one server at a time."""
    spec.check()
    out: list[Record] = []
    if "turns" in spec.parts:
        for on in (False, True):
            out.append(await prompt_caching(lab, spec, on))
    if "pressure" in spec.parts:
        out += await ram_tier(lab, spec, _sides(spec), spec.repeat)
    if "curve" in spec.parts:
        out += await ram_tier(lab, spec, tuple((LLAMA_RAM_CURVE, share)
                                               for share in CURVE_SHARES), 1)
    if "quant" in spec.parts:
        out += await kv_quant(lab, spec)
    return out


def _plan(lab: Lab, row: Row, *, ctx: int, parallel: int, cache_ram_mib: int,
          chosen: llamacpp.LlamaOptions | None = None) -> EnginePlan:
    binary = llamacpp.require_llama_server(lab.settings)
    return server_plan(lab.settings, binary, role=row.label, ctx=ctx, parallel=parallel,
                       slot_dir=lab.scratch("llama-tiers-slots"),
                       cache_ram_mib=cache_ram_mib, chosen=chosen)


# --- task 2: prompt caching off and on ------------------------------------------------------
async def prompt_caching(lab: Lab, spec: LlamaTiersSpec, on: bool) -> Record:
    """Turns of one conversation on one slot, prompt caching off or on (no RAM cache)."""
    row = LLAMA_PROMPT_ON if on else LLAMA_PROMPT_OFF
    plan = _plan(lab, row, ctx=lab.settings.ctx, parallel=1, cache_ram_mib=0,
                 chosen=llamacpp.LlamaOptions(cache_prompt=on))
    async with engines(lab, [plan], labels=[row.label]) as (proc,):
        lab.say(f"==> {row.label}: {spec.turns} turns, --{'' if on else 'no-'}cache-prompt")
        found = await run_reuse(ReuseOptions(
            [proc.plan.base_url], lab.settings.served_name, turns=spec.turns,
            preamble_words=spec.preamble_words, max_tokens=spec.turn_max_tokens,
            api_key=lab.api_key(), nonce=f"{lab.run_id}-{row.label}"), say=lab.say)
    record = reuse_record(found, row.label, LAB, "one llama-server, one slot, no RAM cache: "
                          "prompt caching is the one variable")
    record.tier = "llama-server prompt cache " + ("on" if on else "off (--no-cache-prompt)")
    record.pressure = Pressure(state="quiet")
    return lab.record(record)


# --- task 3: the RAM cache under pressure ---------------------------------------------------
@dataclass(frozen=True)
class SlotPressure:
    """User sessions sized against the slots: what the runs share."""

    users: int
    slots: int
    preamble_tokens: int
    conversation_tokens: int
    turn_tokens: tuple[int, ...]
    bytes_per_token: float
    kv_cache_bytes: int
    cache_tokens: int

    @property
    def working_set_tokens(self) -> int:
        return self.users * self.conversation_tokens

    @property
    def tier_tokens_needed(self) -> int:
        """What the RAM cache must hold so that no returning user recomputes: the
        conversations the slots cannot hold (it is exclusive of the slots)."""
        return (self.users - self.slots) * self.conversation_tokens

    def tier_mib(self, share: float) -> int:
        """A RAM cache of whole MiB: with `share` 1 every conversation (with room for the
        stale shorter states the cache keeps beside the newest), else `share` of what it
        must hold."""
        need = (self.working_set_tokens * TIER_MARGIN if share >= 1
                else self.tier_tokens_needed * share)
        return max(1, math.ceil(need * self.bytes_per_token / MIB))

    def planned(self, tier_mib: int) -> PressurePlanned:
        requests = self.users * TURNS
        return PressurePlanned(
            concurrency=self.slots, requests=requests, conversations=self.users,
            conversation_tokens=self.conversation_tokens,
            working_set_tokens=self.working_set_tokens, cache_tokens=self.cache_tokens,
            kv_cache_bytes=self.kv_cache_bytes, bytes_per_token=self.bytes_per_token,
            reusable_fraction=round(sum(self.turn_tokens[:-1]) / sum(self.turn_tokens), 3),
            preamble_tokens=self.preamble_tokens, users=self.users, turns=TURNS,
            oversubscription=round(self.working_set_tokens / self.cache_tokens, 2),
            tier_tokens_needed=self.tier_tokens_needed,
            tier_bytes_needed=math.ceil(self.tier_tokens_needed * self.bytes_per_token),
            host_tier_bytes=tier_mib * MIB)


async def size_sessions(client: LlamaClient, spec: LlamaTiersSpec, capacity_bytes: int,
                        cells: int) -> SlotPressure:
    """The largest preamble (at most the one asked for) whose conversation fits a slot, in
    this server's own tokens: a bisection, since the turns' questions are a fixed cost."""
    async def turns_at(size: int) -> tuple[int, ...]:
        prompts = workloads.build("multi-turn", TURNS, preamble_tokens=size, start=0,
                                  turns=TURNS)
        return tuple([await client.chat_tokens(p.as_messages()) for p in prompts])

    def fits(turns: tuple[int, ...]) -> bool:
        return turns[-1] + TURNS * spec.max_tokens <= FIT * spec.slot_ctx

    low, high = 16, spec.preamble_tokens
    best = await turns_at(low)
    if not fits(best):
        raise SettingError(f"a conversation of {TURNS} turns does not fit a slot of "
                           f"{spec.slot_ctx} tokens: raise --slot-ctx")
    while high - low > 16:
        mid = (low + high) // 2
        found = await turns_at(mid)
        low, high, best = (mid, high, found) if fits(found) else (low, mid, best)
    return SlotPressure(spec.users_or_default, spec.slots, low, best[-1] + TURNS * spec.max_tokens,
                        best, capacity_bytes / cells, capacity_bytes, cells)


def kv_size(capacity: KvCapacity, why: str) -> tuple[int, int]:
    """The KV cache's (bytes, cells) from the server's startup line; SettingError with `why`
    when the log names none."""
    if not capacity.kv_cache_bytes or not capacity.kv_cache_tokens:
        raise SettingError(f"llama-server's log names no KV cache size: {why}")
    return capacity.kv_cache_bytes, capacity.kv_cache_tokens


def _sides(spec: LlamaTiersSpec) -> tuple[tuple[Row, float], ...]:
    """The runs: no RAM cache, one that holds every conversation, a smaller one."""
    return ((LLAMA_RAM_OFF, 0.0), (LLAMA_RAM_ON, 1.0), (LLAMA_RAM_SMALL, spec.small_share))


async def ram_tier(lab: Lab, spec: LlamaTiersSpec, sides: tuple[tuple[Row, float], ...],
                   repeat: int) -> list[Record]:
    """The runs of `sides` (a row and a RAM cache share each) in alternating order, one server
    start per stint. The curve's sizes share one row and run once each (`repeat` 1), so a
    comparison never pools two sizes."""
    rows: list[Record] = []
    sizing: SlotPressure | None = None
    ran: set[tuple[str, int]] = set()
    for stint in repeats.stints(repeat, len(sides)):
        row, share = sides[stint.side]
        mib = sizing.tier_mib(share) if sizing is not None and share else 0
        if stint.first and (row.label, mib) in ran:  # two shares of one size in whole MiB
            lab.say(f"    {row.label}: {share:g} of the RAM cache needed is {mib} MiB again; "
                    "run once")
            continue
        ran.add((row.label, mib))
        plan = _plan(lab, row, ctx=spec.slots * spec.slot_ctx, parallel=spec.slots,
                     cache_ram_mib=mib,
                     chosen=llamacpp.LlamaOptions(log_verbosity=llamacpp.DEBUG_VERBOSITY))
        async with engines(lab, [plan], labels=[row.label]) as (proc,):
            capacity = startup.capacity(proc.plan, proc.log_text())
            if sizing is None:
                async with LlamaClient(LlamaTarget.from_plan(proc.plan), lab.api_key()) as c:
                    sizing = await size_sessions(
                        c, spec, *kv_size(capacity, "kvlab cannot size the pressure runs"))
            server = server_fields(proc.plan, spec.slots * spec.slot_ctx, spec.slots, mib)
            server.capacity = capacity
            context = RunContext(tier=_tier_words(mib), server=server, varied="cache_ram_mib",
                                 llama_parallel=spec.slots,
                                 engine_version=await startup.server_version(proc.plan))
            for number in stint.repeats:
                rows.append(await _pressure_run(lab, spec, proc, sizing, row, mib, context,
                                                number))
                if not spec.think_time and (think := think_of(rows)) is not None:
                    spec = replace(spec, think_time=f"exponential:{think}")
        require_successes(row.label, rows)
    return rows


def _tier_words(mib: int) -> str:
    return f"llama-server RAM cache {mib} MiB" if mib else "none: --cache-ram 0"


async def _pressure_run(lab: Lab, spec: LlamaTiersSpec, proc: EngineProcess,
                        sizing: SlotPressure, row: Row, mib: int, context: RunContext,
                        repeat: int | None) -> LoadRecord:
    from kvlab.loadgen import SessionSpec, ThinkTime, run_sweep

    planned = sizing.planned(mib)
    think = ThinkTime.parse(spec.think_time or f"paced:{spec.slots}")
    load = LoadSpec(base_url=api_base(proc.plan.base_url), model=lab.settings.served_name,
                    levels=(sizing.users,), requests=planned.requests,
                    max_tokens=spec.max_tokens, prompt_set="sessions", label=row.label,
                    preamble_tokens=sizing.preamble_tokens, lab=LAB, engine=LLAMA_CPP,
                    labbook=lab.settings.labbook, ignore_eos=True, repeat=repeat,
                    sessions=SessionSpec(turns=TURNS, think=think, conversations=sizing.users,
                                         cache_block_tokens=1),
                    context=context.model_copy(update={"pressure": Pressure(
                        state="under pressure", planned=planned)}))
    lab.say(f"==> {row.label}: {sizing.users} users on {sizing.slots} slots, working set "
            f"{sizing.working_set_tokens * sizing.bytes_per_token / MIB:.1f} MiB, "
            + _tier_words(mib)
            + (f" (repeat {repeat + 1} of {spec.repeat})" if repeat is not None else ""))
    before = len(proc.log_text())
    async with sampling(proc.plan.metrics_url, LLAMA_CPP_ENGINE.gauges) as samples:
        result = await run_sweep(load, api_key=lab.api_key())
    found = result.rows[0]
    found.pressure = Pressure(state="under pressure", planned=planned, reached=PressureReached(
        peak_requests_waiting=samples.peak("requests_deferred"),
        prefix_hit_rate=found.prefix_hit_rate,
        evicted_turns=found.sessions.evicted_turns if found.sessions else None,
        host_tier=llamacpp.ramcache.use_in(proc.log_text()[before:])))
    found.kv_usage_samples = samples.as_record()
    return lab.record(found)


# --- the quantised cache --------------------------------------------------------------------
def candidate_ctx(reference_bytes: int, reference_cells: int, kv_type: str) -> int:
    """The context whose `kv_type` cache fits the reference's bytes (ggml's block sizes:
    q8_0 keeps 32 values in 34 bytes, f16 in 64), rounded down to 256 tokens."""
    per_cell = reference_bytes / reference_cells * _BYTES_PER_VALUE[kv_type] / 2.0
    return int(reference_bytes / per_cell) // 256 * 256


_BYTES_PER_VALUE = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


async def kv_quant(lab: Lab, spec: LlamaTiersSpec) -> list[Record]:
    """f16, then q8_0 in the f16 cache's memory; their load rows and the `kv-quant` line."""
    sides: list[tuple[KvTypeSide, LoadRecord, list[tuple[str, float]]]] = []
    budget: tuple[int, int] | None = None
    prompts: tuple[str, str] | None = None
    for kv_type in (REFERENCE, CANDIDATE):
        ctx = spec.quant_ctx if budget is None else candidate_ctx(*budget, kv_type)
        label = f"llama-kv-{kv_type}"
        plan = _plan(lab, LLAMA_KV_QUANT, ctx=ctx, parallel=1, cache_ram_mib=0,
                     chosen=llamacpp.LlamaOptions(cache_type=kv_type,
                                                  log_verbosity=llamacpp.DEBUG_VERBOSITY))
        async with engines(lab, [plan], labels=[label]) as (proc,):
            capacity = startup.capacity(proc.plan, proc.log_text())
            if budget is None:
                budget = kv_size(capacity, "kvlab cannot give q8_0 the f16 cache's memory")
            async with LlamaClient(LlamaTarget.from_plan(proc.plan), lab.api_key()) as client:
                prompts = prompts or await _quant_prompts(client, budget[1])
                sides.append(await _quant_side(lab, spec, proc.plan, client, kv_type, ctx,
                                               prompts, capacity))
    rows = [row for _, row, _ in sides]
    return [*rows, lab.record(quant_record(lab, spec, sides, budget))]


async def _quant_prompts(client: LlamaClient, cells: int) -> tuple[str, str]:
    """One prompt for the logprobs, and one longer than the reference's cache holds."""
    return (await prompt_of(client, 512, seed=98), await prompt_of(client, cells + 256, seed=99))


async def _quant_side(lab: Lab, spec: LlamaTiersSpec, plan: EnginePlan, client: LlamaClient,
                      kv_type: str, ctx: int, prompts: tuple[str, str], capacity: KvCapacity,
                      ) -> tuple[KvTypeSide, LoadRecord, list[tuple[str, float]]]:
    from kvlab.loadgen import run_sweep

    label = f"llama-kv-{kv_type}"
    lab.say(f"==> {label}: --ctx-size {ctx}, {capacity.kv_cache_tokens} cells in "
            f"{(capacity.kv_cache_bytes or 0) / MIB:.2f} MiB")
    await client.chat("Warm up.", max_tokens=2, model=lab.settings.served_name)
    server = server_fields(plan, ctx, 1, 0)
    server.capacity = capacity
    # distinct documents (`mixed`): nothing one request computed serves another
    load = LoadSpec(base_url=api_base(plan.base_url), model=lab.settings.served_name,
                    levels=(1,), requests=spec.quant_requests, max_tokens=spec.max_tokens,
                    prompt_set="mixed", preamble_tokens=spec.quant_prompt_tokens, label=label,
                    lab=LAB, engine=LLAMA_CPP, labbook=lab.settings.labbook, ignore_eos=True,
                    size_prompts=True,  # in this server's tokens, so that every one fits
                    context=RunContext(server=server, varied="kv_cache_type",
                                       engine_version=await startup.server_version(plan))
                    .overlay(llamacpp.kv_label(kv_type, kv_type)))
    row = lab.record((await run_sweep(load, api_key=lab.api_key())).rows[0])
    if row.failed:  # every timed request must have an answer on both sides
        raise EngineError(f"{label}: {row.failed} of {row.requests} timed requests failed "
                          f"({', '.join(str(f.error) for f in row.failures[:2])}): the two KV "
                          "types would not be compared on the same prompts")
    probe, long = prompts
    answer = await client.chat(probe, max_tokens=1, model=lab.settings.served_name)
    try:
        await client.chat(long, max_tokens=1, model=lab.settings.served_name)
        told = "served"
    except EngineError as exc:  # the server's own refusal (a context it cannot hold)
        told = f"refused: {str(exc)[:160]}"
    return KvTypeSide(kv_type=kv_type, label=label, ctx=ctx,
                      kv_cache_bytes=capacity.kv_cache_bytes,
                      kv_cache_tokens=capacity.kv_cache_tokens,
                      ttft_p50_s=row.ttft_s.p50 if row.ttft_s else None,
                      long_prompt=told), row, answer.first_logprobs


def quant_record(lab: Lab, spec: LlamaTiersSpec,
                 sides: list[tuple[KvTypeSide, LoadRecord, list[tuple[str, float]]]],
                 budget: tuple[int, int] | None) -> KvQuantRecord:
    """The two sides against each other: tokens in the same memory, TTFT with its interval,
    the first token's logprob distance, and whether the longer prompt fit only one."""
    (ref, ref_row, ref_top), (cand, cand_row, cand_top) = sides
    book = Path(lab.settings.labbook)
    ttft = intervals.ttft(book, notebook.read(book).records, cand_row, ref_row)
    tokens = (round(cand.kv_cache_tokens / ref.kv_cache_tokens, 3)
              if cand.kv_cache_tokens and ref.kv_cache_tokens else None)
    gap = logprob_gap(ref_top, cand_top)
    same = ref_top[0][0] == cand_top[0][0] if ref_top and cand_top else None
    reasons = [f"{cand.kv_type} holds {cand.kv_cache_tokens} tokens where {ref.kv_type} holds "
               f"{ref.kv_cache_tokens} in {(budget[0] if budget else 0) / MIB:.2f} MiB",
               f"TTFT p50 {cand.kv_type} / {ref.kv_type}: {ttft.words}",
               f"first token's top logprobs differ by at most {gap:.4f}" if gap is not None
               else "the logprobs could not be compared"]
    fits = cand.long_prompt == "served" and ref.long_prompt != "served"
    verdict = ("more tokens in the same memory" if tokens and tokens > 1 and fits else
               "no more tokens" if tokens is not None and tokens <= 1 else "not shown")
    return KvQuantRecord(
        label=LLAMA_KV_QUANT.label, lab=LAB, engine=LLAMA_CPP,
        engine_version=ref_row.engine_version, model=ref_row.model or lab.settings.served_name,
        memory_bytes=budget[0] if budget else None, reference=ref, candidate=cand,
        tokens_ratio=tokens, ttft_p50=ttft.as_record(), prompt_tokens=spec.quant_prompt_tokens,
        long_prompt_tokens=(budget[1] + 256) if budget else None, logprob_gap=gap,
        top_token_same=same, verdict=verdict, reasons=reasons)
