"""What the llama.cpp commands print, for a person at a terminal: `kvlab run disk` (and
mlx-cache's disk line), `kvlab run shared-slots`, `kvlab run interference`, and
`kvlab llama slots|save|restore|erase`.

The disk tier's stopwatch (cold, save, control, restore, after the restore), one slot store
read by two servers, each slot count's figures against the most slots, what each slot holds
with the store's files, and one slot action's timing. A figure that was not recorded reads
"n/a", never "None".

It renders llama.cpp's records and slot results only: the plan llama-server starts with and
the tiers' flags are `console_engines.py`'s, a run's listing `console_run.py`'s. Nothing here
measures, reads the notebook, or decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console

from kvlab.engines.llamacpp.slots import Done, Held, holds
from kvlab.records import ComparisonRecord, DiskRecord, LoadRecord, ReuseRecord, Turn
from kvlab.report.console_common import NONE, ms


# --- llama.cpp's tiers ------------------------------------------------------------------------
def disk(console: Console, r: DiskRecord, labbook: str) -> None:
    """The disk tier's stopwatch: cold, save, control, restore, after the restore."""
    ev = r.evidence
    cold, control = (ev.cold, ev.control) if ev else (None, None)
    console.print(f"==> The disk tier, timed ({r.engine}, {r.prompt_tokens} prompt tokens, "
                  f"{r.kv_cache_type or 'model-dtype'} KV, {r.model})")
    console.print(f"    cold TTFT            {ms(r.cold_ttft_s):>13}  (cache_n {_cache(cold)})")
    steps = r.save_ms is not None  # vLLM's fs tier has no save or restore call of its own
    size = f"{r.file_bytes or 0:,} bytes"
    console.print(f"    save                 {r.save_ms or 0:10.1f} ms  ({size})" if steps
                  else f"    files written        {size}")
    if control is not None:  # llama.cpp's; mlx-lm's load is a new process, with no cache
        console.print(f"    control (no restore) {ms(control.ttft_s):>13}  "
                      f"(cache_n {_cache(control)})")
    if steps:
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
