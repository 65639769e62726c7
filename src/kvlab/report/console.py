"""What a command prints of the lines it wrote, for a person at a terminal.

Each function renders typed records (the same ones `--json` prints) onto a rich console: a
load sweep's table, a link's bytes, a capacity search's probes, a run's listing, the disk
tier's stopwatch, the interference pair, a reuse or proof run. A figure that was not recorded
reads "n/a" or "-", never "None". Nothing here measures, reads the notebook, or decides.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvlab.cluster.placement import DryPlacement
from kvlab.core import LoadedSettings, human_bytes
from kvlab.engines import TITLES, EnginePlan, EngineStatus, as_started
from kvlab.engines.llamacpp.slots import Done, Held, holds
from kvlab.engines.vllm import VllmInstall
from kvlab.loadgen import Dataset, LoadSpec, ProgressHook, RequestRecord
from kvlab.measure import Compatibility, compat, shortfall
from kvlab.observe import fingerprint
from kvlab.proxy import Crossing, ProxyConfig, listen_url
from kvlab.records import (
    BoundaryRecord,
    BoundFigure,
    CapacityRecord,
    ComparisonRecord,
    DiskRecord,
    KvPrediction,
    LinkRecord,
    LoadRecord,
    NotRunRecord,
    Percentiles,
    ProcedureRecord,
    ProofRecord,
    Record,
    ReuseRecord,
    ReuseSummary,
    TraceEvidence,
    Turn,
    Where,
    serve_label,
)

NONE = Percentiles()


def ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds is not None else "n/a"


def _ms(value: float | None) -> str:
    return f"{value * 1000:.1f}" if value is not None else "-"


# --- the load generator --------------------------------------------------------------------
def load_plan(spec: LoadSpec, profile: str, reason: str) -> str:
    """What a load will send, said before it starts: its levels and requests a level, output
    tokens, model, and the profile its defaults came from."""
    if spec.sessions is not None:
        kind = "users"
    elif spec.trace is not None:
        kind = "in-flight caps"
    else:
        kind = "concurrency"
    if spec.trace is not None:
        limit = spec.trace.limit
        counts = f"the trace's first {limit} requests" if limit else "every request of the trace"
    else:
        each = ", ".join(str(spec.floor(level)) for level, _ in spec.points())
        counts = f"at least {each} {'turns' if spec.sessions is not None else 'requests'} a level"
    return (f"==> {spec.label}: {kind} {', '.join(map(str, spec.levels))} ({counts}), "
            f"max_tokens {spec.max_tokens}, model {spec.model!r}; "
            f"defaults from profile {profile}" + (f" ({reason})" if reason else "")
            + (dataset_plan(spec.dataset) if spec.dataset is not None else ""))


def dataset_plan(data: Dataset) -> str:
    """The user's file as the plan says it: what is sent of it, and what was left out."""
    skipped = ", ".join(f"{n} {why}" for why, n in data.skipped.items())
    turns = (f"; its {data.conversations} conversations replayed as user sessions"
             if data.conversations else "")
    return (f"\n    dataset {data.file} ({data.format}, keys {', '.join(data.keys)}): "
            f"{len(data.entries)} of {data.records} records usable"
            + (f" (skipped: {skipped})" if skipped else "") + turns)


def load_rows(console: Console, rows: Sequence[LoadRecord]) -> None:
    """A sweep's levels: one table row each, then each level's failures and goodput."""
    table = Table("conc", "ok", "fail", "warm-up", "TTFT p50", "TTFT p95", "TTFT p99",
                  "TPOT p50", "ITL p50", "tok/s", "req/s", "hits", "lag p99",
                  title="times in ms; percentiles over the ok requests")
    for r in rows:
        ttft, hits = r.ttft_s or NONE, r.prefix_hit_rate
        table.add_row(str(r.concurrency), str(r.ok), str((r.failed or 0) + (r.cancelled or 0)),
                      str(r.warmup_requests or 0), _ms(ttft.p50), _ms(ttft.p95), _ms(ttft.p99),
                      _ms((r.tpot_s or NONE).p50), _ms((r.itl_s or NONE).p50),
                      f"{r.output_tokens_per_s or 0:.0f}", f"{r.requests_per_s or 0:.1f}",
                      f"{hits:.0%}" if hits is not None else "-",
                      _ms((r.schedule_lag_s or NONE).p99))
    console.print(table)
    for r in rows:
        if (t := r.trace) is not None:
            console.print(f"    concurrency {r.concurrency}: {trace_summary(t)}")
        if r.vllm_metrics:
            console.print(f"    concurrency {r.concurrency}: vllm bench's figures, ms: "
                          + ", ".join(f"{k.removesuffix('_ms')} {v:.2f}"
                                      for k, v in r.vllm_metrics.items()
                                      if not k.startswith("std_")))
        if r.result_file:
            console.print(f"    concurrency {r.concurrency}: vllm bench's result in "
                          f"{r.result_file}")
        if r.blank_outputs:
            console.print(f"    concurrency {r.concurrency}: {r.blank_outputs} answers counted "
                          "output tokens but decoded to no visible text (kept as successes, "
                          "timed from their first choice, as vllm bench does)")
        if r.errors:
            first = r.failures[0].detail if r.failures else ""
            console.print(f"    concurrency {r.concurrency}: failures {r.errors}; first: "
                          f"{first[:160]}")
        if (d := r.dataset) is not None:
            console.print(f"    concurrency {r.concurrency}: dataset {d.file}: {d.sent} records "
                          f"from record {d.first_record}" + (
                              f", {d.resent} sent before in this run (the file ran out)"
                              if d.resent else "") + (
                              f"; {d.outputs_capped} output lengths capped at max_tokens"
                              if d.outputs_capped else ""))
        if r.goodput:
            g = r.goodput
            console.print(f"    concurrency {r.concurrency}: goodput "
                          f"{g.requests_per_s} req/s ({g.requests} met {g.slo})")
        if (o := r.oracle) is not None and o.predicted_share is not None \
                and o.measured_share is not None:
            console.print(f"    concurrency {r.concurrency}: cache oracle {o.predicted_share:.1%}"
                          f" of prompt tokens cacheable, {o.measured_share:.1%} reported cached"
                          f" (a cache that never evicts: "
                          f"{o.infinite_cache_tokens / o.prompt_tokens:.1%})")
            if (words := shortfall(o)) is not None:
                console.print(f"    concurrency {r.concurrency}: {words}")


def trace_summary(t: TraceEvidence) -> str:
    """What a trace replay sent: how many of its requests, and what became of the longer
    ones."""
    taken = f"the first {t.limit}" if t.limit else "all"
    words = f"trace {Path(t.path).name}: {t.requests} requests sent of {taken}"
    if t.max_input is not None:
        words += (f"; over {t.max_input} tokens: {t.truncated_to_max_input} truncated to fit"
                  if t.over_max_input == "truncate"
                  else f"; over {t.max_input} tokens: {t.left_out_over_max_input} left out")
    if t.reusable_fraction_infinite_cache is not None:
        words += (f"; an infinite cache would reuse {t.reusable_fraction_infinite_cache:.1%} "
                  "of what was sent")
    return words


def link(console: Console, record: LinkRecord, labbook: str) -> None:
    """run-load.sh's closing block: the bytes on the interface, RDMA, NIXL, the side channel."""
    if record.rx_bytes is not None:
        console.print(f"==> Link during this run, on {record.iface}")
        console.print(f"    received     {record.rx_bytes} bytes")
        console.print(f"    transmitted  {record.tx_bytes} bytes")
    else:
        console.print("==> No byte counters recorded. Set CLUSTER_IFACE to measure the link.")
    if record.rdma:
        console.print(f"    RDMA ports   received {record.rdma.rx_bytes}, transmitted "
                      f"{record.rdma.tx_bytes} bytes"
                      + (" (a counter saturated)" if record.rdma.saturated else ""))
    for url, nixl in (record.nixl or {}).items():
        console.print(f"    NIXL         {nixl.nixl_bytes or 0:.0f} bytes in "
                      f"{nixl.nixl_transfers or 0:.0f} transfers ({url})")
    if record.side_channel and record.side_channel.verdict:
        console.print(f"    side channel {record.side_channel.verdict}")
    console.print("    Per request, compare the larger figure with one request's KV cache "
                  "(kvlab predict); a thousand times smaller means no cache crossed.")
    console.print(f"    Appended one link line to {labbook}")


def topology(where: Where) -> str:
    """Where a run's split was, in one line."""
    hosts = ", ".join(f"{role} {host}" for role, host in (where.hosts or {}).items())
    return (f"{where.topology} ({hosts}); connector {where.connector}; "
            f"link {where.link}; from {where.topology_from}")


def capacity(console: Console, record: CapacityRecord, slo: str) -> None:
    """A capacity search: each probe's load, whether it met the target and why."""
    bounds = record.target.bounds
    table = Table(record.knob, "met", *bounds, "failed", "why",
                  title=f"capacity search: {slo} (percentiles in seconds, 95% intervals)")
    for step in record.steps:
        table.add_row(f"{step.load:g}", "yes" if step.met else "no",
                      *[_figure(step.figures.get(k)) for k in bounds],
                      f"{step.failed_share:.1%}", step.why)
    console.print(table)
    console.print(f"==> capacity: {record.statement}")


def _figure(f: BoundFigure | None) -> str:
    if f is None or f.value is None:
        return "-"
    band = f" [{f.low:.3g}, {f.high:.3g}]" if f.low is not None and f.high is not None else ""
    return f"{f.value:.3g}{band}"


# --- a run's lines ----------------------------------------------------------------------------
def summary(record: Record) -> str:
    """One line of what a record says, for the end-of-run listing."""
    if isinstance(record, CapacityRecord):
        return record.statement
    if isinstance(record, NotRunRecord):
        return f"not run: {record.reason}"
    if isinstance(record, ReuseRecord):
        s = record.summary or ReuseSummary()
        return (f"turn 1 {s.turn1_ttft_s} s, best later {s.best_later_ttft_s} s, "
                f"reused turns {s.reused_turns}/{len(s.later_turn_verdicts)}")
    if isinstance(record, ProofRecord):
        return ", ".join(f"{k}={v}" for k, v in record.verdicts.items() if v)
    if isinstance(record, LoadRecord):
        ttft = record.ttft_s.p50 if record.ttft_s else None
        return (f"c={record.concurrency} TTFT p50 {ttft} s, "
                f"{record.output_tokens_per_s} tok/s, failed {record.failed or 0}")
    return ""


def lines(console: Console, records: Sequence[Record], labbook: str) -> None:
    """Every line a run wrote, one each, and the steps' checks and boundaries."""
    for record in records:
        console.print(f"  {record.record:<10} {record.label:<22} {summary(record)}")
    console.print(f"{len(records)} lines appended to {labbook}")
    for r in records:
        if isinstance(r, ProcedureRecord):
            procedure(console, r)
        elif isinstance(r, BoundaryRecord):
            boundary(console, r)


def procedure(console: Console, r: ProcedureRecord) -> None:
    failed = f" (failed: {', '.join(r.failed)})" if r.failed else ""
    console.print(f"==> {r.step}: {r.verdict}{failed}")
    for c in r.checks:
        console.print(f"    {'ok  ' if c.passed else 'FAIL'} {c.name}: {c.detail}")


def boundary(console: Console, r: BoundaryRecord) -> None:
    console.print(f"==> boundary at concurrency {r.concurrency}: {r.statement}")
    console.print(f"    {'tokens':>7} {'split TTFT':>11} {'baseline':>11} {'ratio':>7}")
    for p in r.points:
        ratio = f"x{p.ratio:.2f}" if p.ratio is not None else "n/a"
        console.print(f"    {p.prompt_tokens_target:>7} {ms(p.split_ttft_p50_s):>11} "
                      f"{ms(p.baseline_ttft_p50_s):>11} {ratio:>7}")


def plans(console: Console, found: Sequence[dict[str, object]]) -> None:
    """A dry run's plans: each one's command line, or why it would not run (a cluster's
    placement first)."""
    for item in found:
        if isinstance(where := item.get("placement"), DryPlacement):
            placement(console, where)
            continue
        node = f" (on {item['node']})" if "node" in item else ""
        console.print(f"==> {item['label']}{node}", markup=False)
        console.print(f"    {item['shell']}" if "plan" in item
                      else f"    not run here: {item['reason']}", markup=False)
        if "note" in item:
            console.print(f"    note: {item['note']}")


def placement(console: Console, p: DryPlacement) -> None:
    """Where a cluster run would put each role, read from the cluster; nothing started."""
    say = functools.partial(console.print, markup=False)  # a node id [c1c1c1c1] is no style
    say(f"==> placement on the Ray cluster at {p.cluster} (from {p.origin})")
    for r in p.roles:
        say(f"    {r.role:<9} {r.node}, {r.url}" + (f" ({r.named_by})" if r.named_by else ""))
    if p.store is not None:
        seen = " and ".join(dict.fromkeys(p.store_seen_by))
        say(f"    store     {p.store} on {seen}: {p.store_from}")
    else:
        say(f"    store     none: {p.store_from}")
    say(f"    nodes     {p.nodes}")
    say(f"    ports are chosen free on each node when it starts; {p.left_to_the_run}")


# --- llama.cpp's tiers ------------------------------------------------------------------------
def disk(console: Console, r: DiskRecord, labbook: str) -> None:
    """The disk tier's stopwatch: cold, save, control, restore, after the restore."""
    ev = r.evidence
    cold, control = (ev.cold, ev.control) if ev else (None, None)
    console.print(f"==> The disk tier, timed ({r.engine}, {r.prompt_tokens} prompt tokens, "
                  f"{r.kv_cache_type or 'model-dtype'} KV, {r.model})")
    console.print(f"    cold TTFT            {ms(r.cold_ttft_s):>13}  (cache_n {_cache(cold)})")
    console.print(f"    save                 {r.save_ms or 0:10.1f} ms  "
                  f"({r.file_bytes or 0:,} bytes)")
    if control is not None:  # llama.cpp's; mlx-lm's load is a new process, with no cache
        console.print(f"    control (no restore) {ms(control.ttft_s):>13}  "
                      f"(cache_n {_cache(control)})")
    console.print(f"    restore              {r.restore_ms or 0:10.1f} ms")
    console.print(f"    after restore TTFT   {ms(r.post_restore_ttft_s):>13}  "
                  f"(cache_n {r.post_restore_cached_tokens})")
    console.print(f"    restore / cold       {r.restore_cold_ratio or 0:10.5f}")
    console.print(f"    verdict: {r.verdict}" + "".join(f"\n      - {x}" for x in r.reasons))
    if r.kv_note:
        console.print(f"    note: {r.kv_note}")
    console.print(f"    one `disk` line appended to {labbook}")


def _cache(turn: Turn | None) -> str:
    return str(turn.cache_n) if turn is not None else "n/a"


def shared_slots(console: Console, r: ReuseRecord, labbook: str) -> None:
    """One slot store, two servers: A cold, B after A's file, B cold on another slot."""
    ev = r.evidence
    console.print(f"==> One slot store, two servers ({r.prompt_tokens} prompt tokens)")
    for turn, what in ((ev.cold_a if ev else None, "A, cold"),
                       (ev.restored_b if ev else None, "B, after restoring A's file"),
                       (ev.cold_b_control if ev else None, "B, cold on another slot")):
        console.print(f"    {what:<30} TTFT {ms(turn.ttft_s if turn else None):>10}  "
                      f"cache_n {_cache(turn)}")
    console.print(f"    first-token logprobs, A cold vs B restored: max |diff| "
                  f"{ev.logprob_max_abs_diff if ev else 'n/a'}")
    console.print(f"    verdict: {r.verdict}" + "".join(f"\n      - {x}" for x in r.reasons))
    console.print(f"    one `reuse` line labelled {r.label} appended to {labbook}")


def interference(console: Console, rows: Sequence[LoadRecord], comp: ComparisonRecord,
                 labbook: str) -> None:
    """Each slot count's figures, each candidate against the run with the most slots."""
    console.print(f"==> Prefill interference: {comp.model}, {comp.prompt_set}")
    console.print(f"    {'label':<28} {'TTFT p50':>10} {'TPOT p50':>10} {'out tok/s':>10} "
                  f"{'failed':>6}")
    for row in rows:
        console.print(f"    {row.label:<28} {ms((row.ttft_s or NONE).p50):>10} "
                      f"{ms((row.tpot_s or NONE).p50):>10} {row.output_tokens_per_s or 0:>10.1f}"
                      f" {row.failed or 0:>6}")
    for level in comp.levels:
        console.print(f"    {level.candidate_label} against {comp.baseline_label}: TTFT "
                      f"x{level.ttft_p50_ratio}, TPOT x{level.tpot_p50_ratio}, "
                      f"throughput x{level.output_tokens_per_s_ratio}")
    if not comp.same_experiment:
        console.print(f"    NOT the same experiment: {', '.join(comp.differs or [])} differ")
    console.print(f"    {len(rows)} load rows and one comparison appended to {labbook}")


def replicas(console: Console, lines: Sequence[Record]) -> None:
    """Each arm's figures per prompt set, then the lab's answer."""
    from kvlab.records import ReplicasRecord
    from kvlab.report import replicas as answer

    arms = [r for r in lines if isinstance(r, ReplicasRecord)]
    for note in (r for r in lines if isinstance(r, NotRunRecord)):
        console.print(f"    not run: {note.reason}")
    for prompt_set, group in answer.newest(arms).items():
        table = Table(title=f"N replicas, {prompt_set}")
        for column in answer.COLUMNS:
            table.add_column(column)
        for r in group:
            table.add_row(*answer.cells(r))
        console.print(table)
        console.print("    " + answer.decision(prompt_set, group))


# --- reuse, proof, prediction -----------------------------------------------------------------
def reuse(console: Console, record: ReuseRecord, written: str | None) -> None:
    """A conversation's turns: turn 1 against the fastest later one, each engine's hits, and
    whether the later turns reused; `written`: the notebook it went to (None: print only)."""
    s = record.summary or ReuseSummary()
    if s.turn1_ttft_s and s.best_later_ttft_s:
        console.print(f"\n    turn 1 time to first token   {s.turn1_ttft_s:.3f} s")
        console.print(f"    fastest later turn           {s.best_later_ttft_s:.3f} s "
                      f"({s.best_later_ratio or 0:.2f}x of turn 1)")
    for url, deltas in record.metric_deltas.items():
        hits, queries = deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")
        if hits is not None and queries:
            console.print(f"    {url}: prefix cache {hits:.0f} hit tokens of {queries:.0f} "
                          f"queried, {hits / queries * 100:.1f}%")
        if external := deltas.get("external_prefix_cache_hits"):
            console.print(f"    {url}: external (connector) hits {external:.0f} tokens")
    reused, later = s.reused_turns, len(s.later_turn_verdicts)
    if reused == later:
        console.print(f"    every later turn reused the conversation so far ({reused}/{later})")
    elif reused == 0:
        console.print("    NO later turn reused anything: every turn was prefilled from scratch")
    else:
        console.print(f"    {reused} of {later} later turns reused; see each turn's verdict")
    trap = next((r for reasons in record.turn_reasons for r in reasons
                 if "ExampleConnector" in r), None)
    if trap:
        console.print(f"    note: {trap}")
    console.print(f"\n    Appended one reuse line to {written}" if written
                  else "\n    --print-only: nothing written.")


def proof(console: Console, record: ProofRecord) -> None:
    """Each case's verdict against what was expected and observed, then the reasons."""
    table = Table("case", "verdict", "expected", "observed", "TTFT x cold", box=None)
    for case in record.cases:
        ev = case.evidence
        table.add_row(case.case, str(case.verdict or "-"),
                      _said(ev.expected_tokens if ev else None),
                      _said(ev.observed_tokens if ev else None),
                      _said(ev.ttft_ratio if ev else None))
    console.print(table)
    for case in record.cases:
        if case.verdict not in (None, "reused", "no-reuse-expected"):
            console.print(f"  {case.case}: " + "; ".join(case.reasons))
    for line in record.explanations:
        console.print(f"  {line}")


def _said(value: float | None) -> str:
    return "" if value is None else str(value)


def prediction(console: Console, r: KvPrediction, written: str | None) -> None:
    """The KV arithmetic: bytes per token, payload, transfer, concurrency."""
    console.print(f"==> KV arithmetic for {r.source}")
    console.print(f"    shape             {r.layers} layers x {r.kv_heads} KV heads x "
                  f"{r.head_dim} head dim x 2 (K and V), {r.dtype}")
    console.print(f"    bytes per token   {r.bytes_per_token or 0:,.0f}")
    if r.payload_bytes is not None:
        console.print(f"    payload           {human_bytes(r.payload_bytes)} for "
                      f"{r.prompt_tokens or 0:,} tokens ({r.payload_bytes:,.0f} B)")
        aligned = human_bytes(r.payload_bytes_block_aligned or 0)
        console.print(f"    block-aligned     {aligned} at {r.block_size}-token blocks")
    if r.transfer_s is not None:
        console.print(f"    transfer time     {r.transfer_s:.3f} s on "
                      f"{human_bytes(r.link_bytes_per_s or 0)}/s")
        console.print(f"    TTFT prediction   {r.ttft_prediction}")
    if r.max_concurrency is not None:
        console.print(f"    max concurrency   {r.max_concurrency:.2f} sequences of "
                      f"{r.ctx or 0:,} tokens in {r.kv_cache_tokens or 0:,} cached tokens")
    if written:
        console.print(f"    appended one prediction line to {written}")


# --- the proxy ---------------------------------------------------------------------------------
def proxy_ready(console: Console, config: ProxyConfig, local_url: str) -> None:
    """Where the proxy listens, its legs and its key, once it serves."""
    console.print("\n==> Proxy")
    console.print(f"    connector  {config.connector} ({config.balance})")
    console.print(f"    prefill    {', '.join(config.urls['prefill'])}")
    console.print(f"    decode     {', '.join(config.urls['decode'])}")
    console.print(f"    client key {'required' if config.api_key else 'none'}")
    console.print(f"    workers    {config.workers}")
    listen = listen_url(config.host, config.port)
    also = "" if local_url == listen else f" (from this machine: {local_url})"
    console.print(f"    listening  {listen}{also}\n")
    console.print("    Send every measured request to the proxy and nothing to the engines "
                  "directly.\n    `kvlab proxy --check` proves a request crosses both legs. "
                  "Ctrl-C stops the proxy.")
    console.print(f"==> ready: {listen}")


def crossing(console: Console, result: Crossing) -> None:
    """One request through a proxy: what each leg's counters say, and the verdict."""
    console.print(f"==> One request through {result.proxy}: HTTP {result.status}, "
                  f"{result.seconds:.3f} s, request id {result.request_id}")
    console.print(f"    legs from {result.legs_from}")
    console.print(f"    prompt tokens {result.prompt_tokens}, block size {result.block_size}, "
                  f"expected external hits on decode about {result.expected_external_hits}")
    for role, legs in (("prefill", result.prefill), ("decode", result.decode)):
        for leg, deltas in legs.items():
            shown = ", ".join(f"{k} +{v:g}" for k, v in deltas.items() if v is not None
                              and k in ("requests_succeeded", "external_prefix_cache_hits",
                                        "prompt_tokens", "prompt_tokens_external_kv_transfer"))
            console.print(f"    {role:<8} {leg}: {shown or 'no counters moved'}")
    if result.kv_transfer_header:
        console.print(f"    the proxy marked the response: x-kvlab-kv-transfer: "
                      f"{result.kv_transfer_header}")
    console.print("    verdict: " + ("crossed both legs" if result.crossed
                                      else "NOT proven: " + "; ".join(result.reasons)))


# --- llama-server's slots -----------------------------------------------------------------------
def slots(console: Console, held: Held) -> None:
    """What each slot holds, then the store's files and their manifests."""
    console.print(f"==> What each slot of {held.base_url} is holding")
    for s in held.slots:
        busy = "busy" if s.get("is_processing") else "idle"
        console.print(f"    slot {s.get('id')}: {busy}, {holds(s)} of {s.get('n_ctx')}")
    console.print(f"==> Slot files in {held.store}")
    if not held.files:
        console.print("    (none)")
    for f in held.files:
        m = f.manifest
        about = (f"{m.n_tokens} tokens, {m.kv_type_k}/{m.kv_type_v}, --parallel "
                 f"{m.parallel}, model {m.model_sha256[:12]}…, saved {m.saved_at}"
                 if m else "no kvlab manifest: kvlab will not restore it")
        console.print(f"    {f.filename}  {f.bytes:,} B  {about}")


def slot_action(console: Console, done: Done) -> None:
    """One save, restore or erase: how long it took, server-side and on the wall."""
    op = done.op
    console.print(f"==> {op.action} slot {op.slot}" + (f" as {op.filename}" if op.filename
                                                         else ""))
    server = f"{op.server_ms} ms server-side, " if op.server_ms is not None else ""
    size = f", {op.n_bytes:,} bytes" if op.n_bytes is not None else ""
    console.print(f"    took {server}{op.wall_ms:.1f} ms wall; {op.n_tokens} tokens{size}")
    if op.action in ("save", "restore"):
        console.print("    That is the disk tier's latency for this conversation. Compare it "
                      "with the\n    time the same prompt takes to prefill from cold "
                      "(`kvlab run disk` does both).")


def compatibility(console: Console, result: Compatibility) -> None:
    """`kvlab check`: every compared field side by side, the notes, the mismatches."""
    facts = [f.as_record() for f in result.instances]
    table = Table("field", *[f.url for f in facts], box=None)
    for name in (*compat.COMPARED, *compat.COMPARED_WHERE_KNOWN, *compat.NOTED):
        table.add_row(name, *[str(getattr(f, name)) for f in facts])
    table.add_row(compat.FINGERPRINT, *[
        " ".join(repr(t) for t in (f.fingerprint.chosen if f.fingerprint else []))
        or "no logprobs" for f in facts])
    console.print(table)
    for line in result.notes:
        console.print(f"note: {line}")
    for mismatch in result.mismatches:
        console.print(f"MISMATCH: {mismatch.message()}")
    for fault in result.store_faults:
        console.print(f"STORE: {fault}")
    if result.compatible:
        console.print("compatible: every compared field agrees, and so do the numbers "
                      f"(fingerprint within {fingerprint.TOLERANCE:.0e})")


# --- settings and engines ---------------------------------------------------------------------
def settings(console: Console, loaded: LoadedSettings, choice: VllmInstall) -> None:
    """Every effective setting and where it came from; the profile; the vLLM chosen."""
    table = Table("setting", "value", "source", box=None, pad_edge=False)
    for column in table.columns:
        column.overflow = "fold"
    for key, value, source in loaded.rows():
        table.add_row(key, value, source)
    console.print(table)
    console.print(f"\nprofile: {loaded.profile} ({loaded.profile_reason or 'none'})")
    console.print(f"vllm: {choice.as_record().command} ({choice.origin}, {choice.platform}): "
                  f"{choice.reason}")
    console.print(f"settings file: {loaded.env_file or 'none (./.env not found)'}")
    if loaded.unknown_keys:
        console.print("unknown keys in the settings file (ignored): "
                      + ", ".join(loaded.unknown_keys))


def engines(console: Console, lines: Sequence[EngineStatus], choice: VllmInstall | None) -> None:
    """Which engines are installed, where, and which vLLM kvlab would run here."""
    table = Table("engine", "installed", "version", "path", "detail", box=None)
    for s in lines:
        table.add_row(s.name, "yes" if s.installed else "no", s.version, s.path, s.detail)
    console.print(table)
    if choice is not None:
        console.print(f"\nvllm used: {choice.as_record().command} ({choice.origin}, "
                      f"{choice.platform}): {choice.reason}")


# --- progress ------------------------------------------------------------------------------
PROGRESS_REDRAWS_PER_S = 2


@contextmanager
def progress(err: Console, enabled: bool) -> Iterator[ProgressHook | None]:
    """A rich progress bar per level on stderr (hook for the sweep), or None.

    Drawing runs on rich's thread and holds the GIL while it renders, which delays the
    event loop's timestamps: measured with `benchmarks/loadgen_accuracy.py --progress`, the
    default 10 redraws a second (1.4 ms each) added 0.2 ms to the timing error's p99 at
    200 req/s. Twice a second is enough for a bar.
    """
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=False,
                  refresh_per_second=PROGRESS_REDRAWS_PER_S) as bar:
        def hook(level: int, total: int) -> Callable[[RequestRecord], None]:
            task = bar.add_task(f"concurrency {level}", total=total, failed=0)
            failed = [0]

            def tick(record: RequestRecord) -> None:
                # records are decoded after the level: count what is known now
                failed[0] += int(record.error is not None or record.status != 200)
                bar.update(task, advance=1, failed=failed[0])
            return tick
        yield hook


# --- a plan ---------------------------------------------------------------------------------
LLAMA_TIERS = """\
    What the tiers are, per the llama-server README:
      --cache-prompt     per-slot prompt caching (on by default; passed so the run says so)
      --parallel         slots: conversations that can stay warm at the same time; each slot
                         holds CTX / parallel tokens
      -ctk / -ctv        the KV cache's data type; q8_0 halves it against f16 but, unlike
                         prompt caching, changes outputs: never compare it with an f16 run
      --slot-save-path   where slot save writes and restore reads (the disk tier); without
                         it both endpoints are off
      --metrics --slots  the two endpoints kvlab reads
    --cache-reuse (reuse through KV shifting) is left off, as in the lab.
"""


def plan(console: Console, plan: EnginePlan) -> None:
    """A plan as the seed's serve scripts print it, with the values the engine will use."""
    console.print(f"==> {plan.engine} {TITLES.get(plan.role, plan.role)}")
    summary = as_started(plan)
    width = max(len(k) for k, _ in summary) if summary else 0
    for key, value in summary:
        console.print(f"    {key:<{width}}  {value}")
    if (label := serve_label(plan.role, plan.host_tier)) != plan.role:
        console.print(f"\n    Suggested label for the measurement:  {label}")
    for note in plan.notes:
        console.print(f"    note: {note}")
    console.print(f"\n    {plan.shell_line()}\n")
