"""Malformed guidellm 0.8 `--profile`, `--constraint` and `--override` values (`kvlab load`):
whatever the text, reading them gives kvlab's levels and limits, all of them usable (rates
finite and above 0, levels and counts whole numbers from 1 to 500,000), or one InputError
line naming the flag, never another exception (no ValueError from a number, no
RecursionError from nesting, no OverflowError from 1e308).

- arbitrary text, and text made of the grammar's own pieces (kinds, keys, `[i]`, `=`, `,`,
  numbers of every shape), for each flag (hypothesis);
- hand-picked values: nan, inf, negative, huge, booleans as numbers, JSON whose kind or
  values are the wrong type, list indices out of order or huge, deep brackets, an empty
  value, a key given twice.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.core.errors import InputError
from kvlab.loadgen.guidellm import MOST, GuideRun, guide_run

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = ["synchronous", "concurrent", "throughput", "constant", "poisson", "async", "sweep",
         "max_duration", "max_requests", "min_requests", "max_errors", "", "x"]
KEYS = ["kind", "rate", "streams", "max_concurrency", "seconds", "count", "warmup",
        "rampup_duration", "cooldown", "stopping_scope", "streams[0]", "streams[1]",
        "rate[0]", "rate[7]", "", "KIND"]
VALUES = st.sampled_from(["1", "4", "0", "-1", "2.5", "1e308", "1e400", "nan", "inf", "-inf",
                          "true", "null", "[3]", "[]", "[[1]]", "", "500000", "500001",
                          "0x10", "1_0", "∞", "٣"]) | st.text(max_size=6)
PAIR = st.tuples(st.sampled_from(KEYS) | st.text(max_size=6), VALUES).map(
    lambda kv: f"{kv[0]}={kv[1]}")
SHAPED = st.tuples(st.sampled_from(KINDS), st.lists(PAIR, max_size=4)).map(
    lambda made: ",".join([f"kind={made[0]}", *made[1]]))
TEXT = SHAPED | st.text(max_size=40)
OVERRIDE = st.lists(st.sampled_from(["profile.rate", "profile.streams", "constraints[0]"])
                    | st.text(max_size=8) | VALUES, max_size=4)


def usable_or_one_line(profile: str | None, constraints: tuple[str, ...],
                       overrides: tuple[str, ...]) -> GuideRun | None:
    try:
        run = guide_run(profile, constraints, overrides)
    except InputError as exc:
        text = str(exc)
        assert text.startswith(("--profile", "--constraint", "--override")), text
        assert "\n" not in text or any("\n" in v for v in (profile or "", *constraints,
                                                             *overrides))
        return None
    if run is None:
        return None
    assert all(math.isfinite(r) and r > 0 for r in run.rates)
    assert all(isinstance(n, int) and 1 <= n <= MOST for n in run.levels)
    assert run.requests is None or 1 <= run.requests <= MOST
    assert run.max_s is None or (math.isfinite(run.max_s) and run.max_s > 0)
    return run


@PROPS
@given(TEXT | st.none(), st.lists(TEXT, max_size=3), OVERRIDE)
def test_any_profile_constraint_and_override(profile: str | None, constraints: list[str],
                                            overrides: list[str]) -> None:
    usable_or_one_line(profile, tuple(constraints), tuple(overrides))


@pytest.mark.parametrize("profile", [
    "kind=constant,rate=nan", "kind=constant,rate=inf", "kind=constant,rate=-inf",
    "kind=constant,rate=-1", "kind=constant,rate=1e400", "kind=constant,rate=true",
    "kind=concurrent,streams=1e308", "kind=concurrent,streams=500001",
    "kind=concurrent,streams=true", "kind=concurrent,streams=[]", "kind=concurrent,streams=[[1]]",
    "kind=concurrent,streams[0]=1,streams[2]=3", "kind=concurrent,streams[999]=1",
    "kind=concurrent,streams[99999999999]=1", "kind=concurrent,streams=", "kind=",
    "kind=concurrent,streams=4,streams=5", "kind=concurrent,streams=4,streams[0]=5",
    "kind=constant,rate=1,max_concurrency=1e9", "kind=constant,rate=1,max_concurrency=[1,2]",
    "=", ",", "=,=", "kind", "{", "{}", "[1]", '{"kind": ["constant"]}', '{"kind": null}',
    '{"kind": "constant", "rate": {"a": 1}}', '{"kind": "constant", "rate": [true]}',
    '{"kind": "constant", "rate": "1"}', '{"kind": "concurrent", "streams": [1e400]}',
    '{"kind": "constant", "rate": 1, "warmup": {"mode": "x"}}', "[" * 5000 + "]" * 5000,
    "kind=constant,rate=" + "[" * 5000 + "1" + "]" * 5000, "kind=constant,rate=1" + "0" * 5000,
    "kind=constant,rate=0." + "0" * 400 + "1", "kind=constant,rate=\x00",
])
def test_malformed_profiles_are_one_line(profile: str) -> None:
    assert usable_or_one_line(profile, (), ()) is None


@pytest.mark.parametrize("constraint", [
    "kind=max_duration,seconds=nan", "kind=max_duration,seconds=0", "kind=max_duration",
    "kind=max_duration,seconds=[1,2]", "kind=max_duration,seconds=[]",
    "kind=max_requests,count=1e308", "kind=max_requests,count=-3",
    "kind=max_requests,count=true", '{"kind": "max_requests", "count": [1, 2]}',
    '{"kind": "max_requests", "count": [[1]]}', "kind=max_duration,seconds=5,count=3",
    "kind=max_duration,seconds=5,stopping_scope=[all]",
])
def test_malformed_constraints_are_one_line(constraint: str) -> None:
    assert usable_or_one_line(None, (constraint,), ()) is None


@pytest.mark.parametrize("overrides", [
    ("profile.rate", "nan"), ("profile.rate", ""), ("profile.rate", ","),
    ("profile.rate", "1,inf"), ("profile.rate", "[1,2]"), ("profile.rate", "1", "x"),
    ("profile.rate", "1", "profile.rate", "2"), ("profile.streams", "1"),
])
def test_malformed_overrides_are_one_line(overrides: tuple[str, ...]) -> None:
    assert usable_or_one_line("kind=constant,rate=1", (), overrides) is None
