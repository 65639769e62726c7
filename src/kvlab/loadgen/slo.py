"""The one `--slo` grammar: bounds on each request (goodput) and on a level's percentiles (a
capacity target), in explicit units, with the older spellings and `vllm bench`'s understood.

    term   := METRIC "<=" NUMBER UNIT          a bound on each request: goodput counts the
                                                requests that meet every one
            | METRIC "_p" Q "<=" NUMBER UNIT   a bound on the level's Q-th percentile: the
                                                target `--find-capacity` searches for
            | "errors<=" SHARE                 the share of requests a target lets fail
    METRIC := ttft | tpot | itl | e2e (e2el too)     UNIT := ms | s     Q := 50 | 90 | 95 | 99

Terms are separated by commas or spaces: `ttft<=500ms,tpot<=50ms` (goodput),
`ttft_p90<=500ms,errors<=0.01` (a target). ITL has no per-request bound (a request has many
gaps): give it a percentile. Understood as well, and said when used:
- `ttft_ms=500` (kvlab's older goodput spelling, milliseconds) is `ttft<=500ms`;
- `ttft_p90<=0.5` (kvlab's older target spelling, a bare number: seconds) is `ttft_p90<=500ms`;
- `ttft:500` (`vllm bench serve --goodput`: milliseconds; e2el for e2e) is `ttft<=500ms`;
  aiperf's `time_to_first_token:500`, `inter_token_latency:50` and `request_latency:2000`
  (milliseconds) are ttft, tpot and e2e.
A per-request bound with a bare number is refused: its unit would be a guess.

This module only reads the text; `stats.Slo` judges requests by the per-request bounds and
`capacity.LatencyTarget` levels by the percentile ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from kvlab.core import InputError

METRICS = ("ttft", "tpot", "itl", "e2e")
REQUEST_METRICS = ("ttft", "tpot", "e2e")  # a per-request bound (vllm bench's goodput keys)
QUANTILES = (50, 90, 95, 99)
DEFAULT_ERRORS = 0.01
EXAMPLE = "e.g. ttft<=500ms,tpot<=50ms (each request) or ttft_p90<=500ms (a percentile)"
_NEW = re.compile(r"^(?P<m>[a-z0-9]+?)(?:_p(?P<q>\d+))?<=(?P<v>[^a-z]+)(?P<u>ms|s)?$")
_OLD_GOODPUT = re.compile(r"^(?P<m>ttft|tpot|e2e)_ms=(?P<v>.+)$")
_VLLM = re.compile(r"^(?P<m>ttft|tpot|e2el|e2e):(?P<v>.+)$")
_ERRORS = re.compile(r"^errors<=(?P<v>.+)$")
# aiperf's --goodput names, as its metric tags (milliseconds): its inter-token latency is
# vllm bench's TPOT, (latency - TTFT) / (output tokens - 1)
_AIPERF = re.compile(r"^(?P<m>time_to_first_token|inter_token_latency|request_latency)"
                     r":(?P<v>.+)$")
_AIPERF_NAMES = {"time_to_first_token": "ttft", "inter_token_latency": "tpot",
                 "request_latency": "e2e"}


@dataclass(frozen=True)
class Term:
    """One bound: `q` None is a bound on each request, else on the level's q-th percentile."""

    metric: str
    q: int | None
    limit_s: float

    def text(self) -> str:
        where = f"_p{self.q}" if self.q is not None else ""
        return f"{self.metric}{where}<={self.limit_s * 1000:g}ms"


@dataclass(frozen=True)
class Objectives:
    """What an `--slo` asked: per-request bounds, percentile bounds, the share that may fail,
    and how each older spelling was understood (to be said)."""

    terms: tuple[Term, ...]
    errors: float = DEFAULT_ERRORS
    errors_given: bool = False
    understood: tuple[str, ...] = field(default=())

    @property
    def per_request(self) -> tuple[Term, ...]:
        return tuple(t for t in self.terms if t.q is None)

    @property
    def percentiles(self) -> tuple[Term, ...]:
        return tuple(t for t in self.terms if t.q is not None)


def parse(text: str, option: str = "--slo") -> Objectives:
    """Every term of `text` (commas or spaces between them); one line naming the term and
    what to write when one is not understood."""
    terms: list[Term] = []
    understood: list[str] = []
    errors, errors_given = DEFAULT_ERRORS, False
    for part in (p for p in re.split(r"[,\s]+", text.strip().lower()) if p):
        if m := _ERRORS.match(part):
            errors, errors_given = _share(option, part, m.group("v")), True
            continue
        term, how = _term(option, part)
        terms.append(term)
        if how:
            understood.append(f"{option} {part}: understood as {term.text()} ({how})")
    if not terms:
        raise InputError(f"{option} {text!r}: give at least one bound, {EXAMPLE}")
    return Objectives(tuple(terms), errors, errors_given, tuple(understood))


def _term(option: str, part: str) -> tuple[Term, str]:
    """One latency term and, for an older spelling, the words that say how it was read."""
    if m := _OLD_GOODPUT.match(part):
        return Term(m.group("m"), None, _ms(option, part, m.group("v"))), \
            "kvlab's older goodput spelling, milliseconds"
    if m := _VLLM.match(part):
        metric = "e2e" if m.group("m") == "e2el" else m.group("m")
        return Term(metric, None, _ms(option, part, m.group("v"))), \
            "vllm bench's --goodput, milliseconds"
    if m := _AIPERF.match(part):
        return Term(_AIPERF_NAMES[m.group("m")], None, _ms(option, part, m.group("v"))), \
            "aiperf's --goodput, milliseconds"
    m = _NEW.match(part)
    metric = "e2e" if m and m.group("m") == "e2el" else m.group("m") if m else ""
    if m is None or metric not in METRICS:
        raise InputError(f"{option} {part!r}: not a bound; {EXAMPLE} (ttft, tpot, itl, e2e; "
                         "ms or s), and errors<=0.01")
    q = int(m.group("q")) if m.group("q") else None
    if q is not None and q not in QUANTILES:
        raise InputError(f"{option} {part!r}: percentiles are p50, p90, p95 or p99")
    if q is None and metric not in REQUEST_METRICS:
        raise InputError(f"{option} {part!r}: a request has many gaps; bound a percentile, "
                         "e.g. itl_p99<=100ms")
    unit = m.group("u")
    if unit is None and q is None:
        raise InputError(f"{option} {part!r}: give the unit, e.g. {metric}<={m.group('v')}ms")
    value = _number(option, part, m.group("v"))
    how = "" if unit else "kvlab's older target spelling, seconds"
    return Term(metric, q, value / 1000 if unit == "ms" else value), how


def _number(option: str, part: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{option} {part!r}: {raw!r} is not a number") from None
    if not 0 < value < math.inf:
        raise InputError(f"{option} {part!r}: the bound must be above 0")
    return value


def _ms(option: str, part: str, raw: str) -> float:
    return _number(option, part, raw) / 1000


def _share(option: str, part: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{option} {part!r}: {raw!r} is not a number") from None
    if not 0 <= value <= 1:
        raise InputError(f"{option} {part!r}: errors is a share from 0 to 1")
    return value
