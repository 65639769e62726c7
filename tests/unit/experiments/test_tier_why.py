"""When the offload lab runs the controls after its pressure pair (#46)."""

from __future__ import annotations

from kvlab.experiments import tier_why
from kvlab.records import PRESSURE_OFF, PRESSURE_ON, LoadRecord, Percentiles, notebook


def rows(on: float | None, off: float | None) -> list[LoadRecord]:
    return [LoadRecord(label=label, lab=notebook.LAB_OFFLOAD, concurrency=8, requests=4, ok=4,
                       model="m", prompt_set="sessions", max_tokens=8,
                       ttft_s=Percentiles(p50=p50) if p50 is not None else None)
            for label, p50 in ((PRESSURE_ON.label, on), (PRESSURE_OFF.label, off))]


def test_auto_runs_them_unless_the_tier_clearly_paid() -> None:
    assert tier_why.wanted("auto", rows(0.427, 0.119)) == (
        True, "the tier did not pay (TTFT p50 x3.59 of the tier off)")
    assert tier_why.wanted("auto", rows(0.11, 0.119))[0] is True  # 0.92x: within the noise
    assert tier_why.wanted("auto", rows(0.05, 0.119)) == (
        False, "the tier paid (TTFT p50 x0.42)")
    assert tier_why.wanted("auto", rows(None, 0.119))[0] is False
    assert tier_why.wanted("auto", [])[0] is False


def test_always_and_never_are_the_users() -> None:
    assert tier_why.wanted("always", rows(0.05, 0.119))[0] is True
    assert tier_why.wanted("never", rows(0.427, 0.119))[0] is False
