"""The labs' closing decisions, written from the measured rows with the figures behind them.

The offload lab's task 6 asks three questions (did the host tier pay, did the store pay, what
did the disk tier cost and save); the P/D lab asks which configuration you would actually use,
and its replicas row which router to put in front of them.
Each answer is one sentence carrying its figures and the settings it depends on, or "not
enough evidence" with the reason the rows do not decide it: a run that is missing or was not
run here, a cache that was never under pressure, two runs that are not the same experiment, a
split whose cache did not cross, a topology that was not recorded, or a difference whose 95%
interval spans 1 (`intervals.py`: no measurable difference). Rows without per-request files
have no interval: their point ratio decides as before (within 10% of 1 is no difference), and
the answer says "no interval: no per-request data". Where capacity searches were recorded,
the host tier's answer adds the most users at the target with the tier off and on, and the P/D
answer the baseline's and the split's request rate at the target. Read from the notebook and
the per-request files it names; nothing here measures.

This module owns the order the decisions come in (`decide`) and what is said after more than
one of them: each side's capacity at the target, and the user's own answer (`kvlab note`). It
answers no question itself: the host tier's three are `decisions_host.py`'s, the store's, the
disk tier's and the quantised cache's `decisions_tiers.py`'s, the P/D lab's
`decisions_pd.py`'s, the router's `replicas.py`'s, and the `Decision` they all return
`decisions_common.py`'s.
"""

from __future__ import annotations

from dataclasses import replace

from kvlab.records import (
    BASELINE,
    DISK,
    MLX_CACHE,
    PRESSURE_OFF,
    PRESSURE_ON,
    SHARED_STORE,
    VLLM_DISK,
    Notebook,
    NoteRecord,
    capacity_label,
)
from kvlab.report.common import not_run
from kvlab.report.decisions_common import Decision
from kvlab.report.decisions_host import (
    HOST_Q,
    host_tier,
    tier_length,
    tier_size,
    with_llama,
    with_smaller_tier,
)
from kvlab.report.decisions_pd import PD_Q, configuration
from kvlab.report.decisions_tiers import (
    DISK_Q,
    STORE_Q,
    disk,
    quantised,
    store,
    with_mlx,
    with_vllm,
)
from kvlab.report.llama import QUANT_Q
from kvlab.report.offload import capacity_line, capacity_words
from kvlab.report.placement import split_groups
from kvlab.report.replicas import router


def decide(book: Notebook) -> list[Decision]:
    """The offload lab's answers (the host tier, with llama.cpp's where it ran; the store;
    the disk tier; the quantised cache; the tier's size and the length it pays from), then
    the P/D lab's (the configuration, with the capacities; the router in front of
    replicas)."""
    tier = [(PRESSURE_OFF.label, "tier off"), (PRESSURE_ON.label, "tier on")]
    split = [(BASELINE.label, "baseline"), *((g.label, f"split `{g.label}`")
                                             for g in split_groups(book))]
    host = replace(host_tier(book), rows=(PRESSURE_ON.label, PRESSURE_OFF.label,
                                          PRESSURE_ON.label + "-smaller"))
    pd = configuration(book)
    pd = replace(pd, rows=(*pd.rows, BASELINE.label, *(g.label for g in split_groups(book))))
    shared = store(book)  # its rows: each store judged (the seed's where none ran)
    drafted = [with_capacity(with_llama(with_smaller_tier(host, book), book), book, tier,
                             smaller_tier=False),
               replace(shared, rows=shared.rows or (SHARED_STORE.label,)),
               replace(with_mlx(with_vllm(disk(book), book), book),
                       rows=(DISK.label, VLLM_DISK.label, MLX_CACHE.label)),
               quantised(book), tier_size(book), tier_length(book),
               with_capacity(pd, book, split), router(book)]
    return [with_yours(d, book) for d in drafted]


def with_capacity(found: Decision, book: Notebook, sides: list[tuple[str, str]], *,
                  smaller_tier: bool | None = None) -> Decision:
    """The answer with each side's capacity at the target (or why it was not measured),
    where a search was recorded or recorded as not run (`capacity_words`' `smaller_tier`)."""
    said = [f"{name}: " + capacity_words(book, label, smaller_tier=smaller_tier)
            .removeprefix("capacity at the target: ")
            for label, name in sides
            if capacity_line(book, label, smaller_tier=smaller_tier) is not None
            or not_run(book, capacity_label(label)) is not None]
    if not said:
        return found
    return found.extended(f"Capacity at the target, {'; '.join(said)}")


# ---------------------------------------------------------------- the user's own answers

def with_yours(found: Decision, book: Notebook) -> Decision:
    """The decision with the user's newest own answer to its question (`kvlab note`)."""
    topics = {"host-tier": HOST_Q, "store": STORE_Q, "disk": DISK_Q, "quantised": QUANT_Q,
              "configuration": PD_Q}
    notes = [n for n in book.of(NoteRecord) if topics[n.about] == found.question]
    return replace(found, yours=notes[-1].text) if notes else found
