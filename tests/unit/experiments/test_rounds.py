"""A sequential run's round loop (`experiments.rounds`), driven by a fake stint that writes
per-request files with known TTFT distributions instead of starting engines."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kvlab.core.errors import InputError
from kvlab.engines.vllm.selection import VllmInstall
from kvlab.experiments import disagg, offload
from kvlab.experiments.repeats import Sequential, Stint, asked
from kvlab.experiments.rounds import Rounds
from kvlab.loadgen import topology
from kvlab.measure import compare
from kvlab.records import notebook
from kvlab.records.evidence import Where
from kvlab.records.models import LoadRecord, Record
from kvlab.records.rows import PRESSURE_OFF, PRESSURE_ON
from kvlab.report import export
from kvlab.report.offload import offload_table, tier_against_none
from kvlab.report.pd import pd_table
from perrequest import lognormal, run_row, where_fields

OFF, ON = PRESSURE_OFF.label, PRESSURE_ON.label  # side 0 runs first, the ratio is on / off
RUN = "20250101-000000"


def fake_stint(book: Path, rounds: Rounds, medians: Callable[[int, int], float],
               ran: list[tuple[int, int | None]], levels: tuple[int, ...] = (8,),
               sigma: float = 0.4, labels: tuple[str, str] = (OFF, ON),
               lab: str = notebook.LAB_OFFLOAD, **extra: Any) -> Callable[[Stint], None]:
    """One engine start's repeats, each a load row per level whose per-request file holds
    60 TTFTs around `medians(side, repeat)`, written through the rounds' writer."""
    write = rounds.writer(lambda row: notebook.append(book, row))

    def measure(stint: Stint) -> None:
        for repeat in stint.repeats:
            ran.append((stint.side, repeat))
            seed = 1000 * stint.side + 10 * (repeat or 0)
            for level in levels:
                write(run_row(book, labels[stint.side], level,
                              lognormal(seed + level, 60, medians(stint.side, repeat or 0),
                                        sigma),
                              repeat=repeat, lab=lab,
                              write=False, run_id=RUN, **extra))

    return measure


def sequential(book: Path, cap: int) -> Rounds:
    return Rounds(cap, Sequential(cap), book, top=ON, bottom=OFF)


def _rows(book: Path) -> list[LoadRecord]:
    return notebook.read(book).of(LoadRecord)


def clear(side: int, _: int) -> float:
    """Tier on ten times faster: with two repeats a side Welch's t at 98.75% has one to two
    degrees of freedom (t up to 51), so only a difference this clear shows after round 2."""
    return 0.02 if side else 0.2


def test_clearly_different_sides_stop_after_two_rounds(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    rounds = sequential(book, 5)
    ran: list[tuple[int, int | None]] = []
    for stint in rounds.stints():
        fake_stint(book, rounds, clear, ran, sigma=0.2)(stint)
    # A0 | B0 B1 | A1, and the A stint's second repeat (A2) never started
    assert ran == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert rounds.stop == "the interval excluded 1 after 2 rounds"
    rows = _rows(book)
    assert [r.repeat_stop for r in rows] == [None, None, None, rounds.stop]


def test_identical_noisy_sides_run_to_the_cap(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    rounds = sequential(book, 4)
    drift = np.random.default_rng(7).lognormal(0, 0.25, (2, 4))  # each run its own median
    ran: list[tuple[int, int | None]] = []
    for stint in rounds.stints():
        fake_stint(book, rounds, lambda side, r: 0.2 * float(drift[side, r]), ran)(stint)
    assert sorted(ran) == [(s, r) for s in (0, 1) for r in range(4)]
    assert rounds.stop == "the cap of 4 rounds" and rounds.done == 4
    assert _rows(book)[-1].repeat_stop == "the cap of 4 rounds"


def test_the_rows_state_the_rule_and_the_stop_is_on_the_row_it_was_decided_on(
        tmp_path: Path) -> None:
    """Every row of both sides carries the rule and its level; with two levels the run
    stops once both settled, and the last row written (the round's last level) says why."""
    book = tmp_path / "labbook.md"
    rounds = sequential(book, 5)
    ran: list[tuple[int, int | None]] = []
    for stint in rounds.stints():
        fake_stint(book, rounds, clear, ran, (1, 4), 0.2)(stint)
    rows = _rows(book)
    assert len(rows) == 8 and all(r.repeat_confidence == pytest.approx(0.9875) for r in rows)
    assert all(r.repeat_rule == Sequential(5).rule() for r in rows)
    assert [r.repeat_stop for r in rows[:-1]] == [None] * 7
    assert rows[-1].repeat_stop == ("c=1: the interval excluded 1 after 2 rounds; "
                                    "c=4: the interval excluded 1 after 2 rounds")


def test_a_fixed_count_runs_every_repeat_and_stamps_nothing(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    rounds = Rounds(3)
    ran: list[tuple[int, int | None]] = []
    for stint in rounds.stints():
        fake_stint(book, rounds, clear, ran, sigma=0.2)(stint)
    assert ran == [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2)]
    assert all(r.repeat_rule is None and r.repeat_confidence is None for r in _rows(book))


@pytest.mark.parametrize(("text", "found"), [("3", 3), ("1", 1), ("auto", Sequential(5)),
                                             ("auto:3", Sequential(3))])
def test_repeat_is_a_count_or_auto_with_a_cap(text: str, found: object) -> None:
    assert asked(text) == found


@pytest.mark.parametrize("text", ["auto:1", "auto:x", "auto:", "0", "-1", "x", "2:3"])
def test_a_bad_repeat_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(InputError, match=r"^--repeat ") as refused:
        asked(text)
    assert "\n" not in str(refused.value)


def test_run_offload_with_repeat_auto_stops_the_pressure_pair_by_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvlab run offload --repeat auto`: the pressure pair's stints come from the rule,
    each stint's rows written through its writer (a fake stint for the engines)."""
    book = tmp_path / "labbook.md"
    ran: list[tuple[int, int | None]] = []

    async def fake_pressure(lab: Any, spec: Any, on: bool, pressure: Any, stint: Stint,
                            rounds: Rounds, given: Any = None) -> list[Record]:
        fake_stint(book, rounds, clear, ran, sigma=0.2)(stint)
        return []

    monkeypatch.setattr(offload, "under_pressure", fake_pressure)
    monkeypatch.setattr(offload, "pressure_plan", lambda lab, spec: object())
    lab = SimpleNamespace(install=lambda engine: VllmInstall(("vllm",), "cuda", "PATH"),
                          say=lambda _: None,
                          settings=SimpleNamespace(labbook=str(book)))
    spec = offload.OffloadSpec(part="pressure", repeat=5, rule=Sequential(5))
    asyncio.run(offload.run(lab, spec))  # type: ignore[arg-type]
    assert ran == [(0, 0), (1, 0), (1, 1), (0, 1)]
    assert _rows(book)[-1].repeat_stop == "the interval excluded 1 after 2 rounds"


def test_run_disagg_with_repeat_auto_stops_the_load_by_the_rule(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvlab run disagg --repeat auto`: the split (first) over the baseline at every level;
    the load's rows go through the rule's writer (a fake load for the engines)."""
    book = tmp_path / "labbook.md"
    lab = SimpleNamespace(settings=SimpleNamespace(labbook=str(book)), say=lambda _: None,
                          api_key=lambda: "")
    spec = disagg.DisaggSpec(levels=(1, 4), repeat=5, rule=Sequential(5))
    got = disagg._Measured(disagg._rounds(lab, spec))  # type: ignore[arg-type]

    async def fake_load(load: Any, link: Any, labbook: str, write: Callable[[Record], object],
                        api_key: str = "") -> tuple[object, object]:
        rows = [run_row(book, load.label, level, lognormal(
            10 * (load.repeat or 0) + level, 60, 0.02 if load.label == "baseline" else 0.2,
            0.2), repeat=load.repeat, write=False, run_id=RUN) for level in spec.levels]
        for row in rows:
            write(row)
        return object(), SimpleNamespace(rows=rows)

    monkeypatch.setattr(disagg, "run_load", fake_load)
    monkeypatch.setattr(disagg, "_load_spec", lambda lab, spec, label, url, where, repeat=None:
                        SimpleNamespace(label=label, repeat=repeat))
    monkeypatch.setattr(disagg, "_writer", lambda lab, roles, store="", prediction=None:
                        lambda row: notebook.append(book, row) if isinstance(row, LoadRecord)
                        else None)
    sides = []
    for stint in got.rounds.stints():
        label = spec.label if stint.side == 0 else "baseline"
        loads = disagg._loads(lab, spec, got, label, "", Where(),  # type: ignore[arg-type]
                              None, (), stint)  # type: ignore[arg-type]
        asyncio.run(loads)
        sides.append(label)
    assert sides == ["disagg", "baseline", "disagg"]
    rows = _rows(book)
    assert [(r.label, r.repeat) for r in rows[::2]] == [
        ("disagg", 0), ("baseline", 0), ("baseline", 1), ("disagg", 1)]
    assert rows[-1].repeat_stop == ("c=1: the interval excluded 1 after 2 rounds; "
                                    "c=4: the interval excluded 1 after 2 rounds")


RULE = ("98.75% interval, sequential: stopped because the interval excluded 1 after 2 rounds; "
        "the rule: after each round from 2 to 5, stop when the 98.75% interval (Bonferroni "
        "over 4 looks: at least 95% over all) excludes 1 or is narrower than 1.2x")


def test_the_offload_report_reads_the_run_at_its_rules_level_and_says_so(
        tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    rounds = sequential(book, 5)
    for stint in rounds.stints():
        fake_stint(book, rounds, clear, [], sigma=0.2)(stint)
    read = notebook.read(book)
    against = tier_against_none(read)
    assert against is not None and against.ttft.confidence == pytest.approx(0.9875)
    assert against.ttft.cell().endswith("] faster (98.75% interval)")
    line = offload_table(read).lines[3]  # the tier on, under pressure
    assert line.cells[3].startswith(against.ttft.cell()) and RULE in line.evidence


def test_the_pd_report_and_compare_read_the_run_at_its_rules_level(tmp_path: Path) -> None:
    book = tmp_path / "labbook.md"
    rounds = Rounds(5, Sequential(5), book, top="disagg", bottom="baseline")
    loop = where_fields(topology.loopback_split("shared", "test"))
    for stint in rounds.stints():
        fake_stint(book, rounds, lambda side, _: 0.02 if side else 0.2, [], (1, 4), 0.2,
                   ("disagg", "baseline"), notebook.LAB_PD, **loop)(stint)
    found = compare.compare_runs(notebook.read(book).records, str(book), "disagg", "baseline")
    assert "==> Ratios with 98.75% intervals (bootstrap over requests and repeats, seed 16)" \
        in found.lines
    assert found.record.interval_method is not None
    assert found.record.interval_method.confidence == pytest.approx(0.9875)
    notebook.append(book, found.record.model_copy(update=loop))
    spans = [row for row in export.interval_rows(notebook.read(book)) if row[0] == "disagg"]
    assert {row[-1] for row in spans if row[3] == "ttft_p50"} == {0.9875}
    table = pd_table(notebook.read(book))
    split = next(line for line in table.lines if line.name == "Two processes on one device")
    against = next(e for e in split.evidence if e.startswith("TTFT p50 against the baseline"))
    assert against.count("slower (98.75% interval)") == 2
    assert RULE.replace("the interval excluded 1 after 2 rounds", "c=1: the interval excluded "
                        "1 after 2 rounds; c=4: the interval excluded 1 after 2 rounds") \
        in split.evidence
