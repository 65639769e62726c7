"""`vllm bench serve`'s figures and result document, from a level's records.

`--percentile-metrics` (ttft, tpot, itl, e2el, client_queue_time,
e2el_including_client_queue; default ttft,tpot,itl) and `--metric-percentiles` (default 99)
choose what the console and the document show; `--save-result` writes one JSON document per
level with the fields `vllm bench serve` (0.32, `benchmarks/serve.py`) writes, named as it
names them, into `--result-dir` (default: the current folder) as `--result-filename` (default:
its own name, `{label}-{rate}qps-concurrency{N}-{model}-{date}.json`). The kvlab row of the
level names the file (`result_file`) and carries the chosen figures (`vllm_metrics`).

The figures follow vllm bench's definitions, over the successful requests: TTFT; TPOT =
(latency - TTFT) / (output tokens - 1) for answers of two tokens or more (goodput counts a
shorter one's TPOT as 0); ITL = the gaps between output chunks; E2EL = latency; the client
queue = kvlab's scheduling lag; std with the n divisor (kvlab's rows use n - 1); percentiles
interpolated as numpy's default. What differs is said in the README: the input tokens are the
server's `usage.prompt_tokens` (vllm bench counts its own prompts), `generated_texts` is never
written (kvlab keeps no text), and the peak figures count output chunks, as vllm bench does.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import InputError, JsonObject
from kvlab.loadgen.record import RequestRecord
from kvlab.loadgen.runner import LevelResult

NS = 1e9
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el", "client_queue_time",
                      "e2el_including_client_queue")
DEFAULT_METRICS = ("ttft", "tpot", "itl")
DEFAULT_PERCENTILES = (99.0,)


@dataclass(frozen=True)
class BenchAsk:
    """Which of vllm bench's figures to show and whether to save its document."""

    metrics: tuple[str, ...] = DEFAULT_METRICS
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    shown: bool = False  # the user chose metrics or percentiles, or asked for the document
    save: bool = False
    directory: str = ""  # "" = the current folder
    filename: str = ""  # "" = vllm bench's own name
    detailed: bool = False
    goodput_ms: tuple[tuple[str, float], ...] = ()  # vllm's goodput keys: ttft, tpot, e2el
    metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, metrics: str | None, percentiles: str | None, **rest: object) -> BenchAsk:
        """`--percentile-metrics` and `--metric-percentiles` as vllm bench takes them."""
        chosen = tuple(m.strip() for m in (metrics or ",".join(DEFAULT_METRICS)).split(",")
                       if m.strip())
        unknown = [m for m in chosen if m not in PERCENTILE_METRICS]
        if unknown or not chosen:
            raise InputError(f"--percentile-metrics {metrics!r}: choose from "
                             f"{', '.join(PERCENTILE_METRICS)}")
        try:
            qs = tuple(float(p) for p in (percentiles or "99").split(","))
        except ValueError:
            raise InputError(f"--metric-percentiles {percentiles!r}: give percentiles "
                             "separated by commas, e.g. 50,90,99") from None
        if any(not 0 <= q <= 100 for q in qs):
            raise InputError(f"--metric-percentiles {percentiles!r}: each from 0 to 100")
        shown = metrics is not None or percentiles is not None or bool(rest.get("save"))
        return cls(chosen, qs, shown, **rest)  # type: ignore[arg-type]


@dataclass(frozen=True)
class LevelFacts:
    """What the document says about the level beside its records."""

    label: str
    model: str
    endpoint: str  # chat or completions
    rate: float | None
    burstiness: float
    concurrency: int
    planned: int


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _q_word(q: float) -> str:
    return str(int(q)) if int(q) == q else str(q)


@dataclass(frozen=True)
class _Request:
    """One successful request in vllm bench's terms (seconds)."""

    ttft: float
    latency: float
    output: int
    itl: list[float]
    queue: float

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output - 1) if self.output > 1 else None


def _request(r: RequestRecord) -> _Request:
    return _Request(ttft=(r.token_ns[0] - r.sent_ns) / NS, latency=(r.end_ns - r.sent_ns) / NS,
                    output=r.output_tokens,
                    itl=[(b - a) / NS for a, b in zip(r.token_ns, r.token_ns[1:], strict=False)],
                    queue=(r.sent_ns - r.scheduled_ns) / NS)


def _values(ok: list[_Request], metric: str) -> list[float]:
    if metric == "ttft":
        return [x.ttft for x in ok]
    if metric == "tpot":
        return [t for x in ok if (t := x.tpot) is not None]
    if metric == "itl":
        return [g for x in ok for g in x.itl]
    if metric == "e2el":
        return [x.latency for x in ok]
    if metric == "client_queue_time":
        return [x.queue for x in ok]
    return [x.latency + x.queue for x in ok]  # e2el_including_client_queue


def metrics(records: Sequence[RequestRecord], ask: BenchAsk) -> dict[str, float]:
    """mean_/median_/std_/pNN_ of each chosen metric, ms, over the successes (0 when none, as
    vllm bench writes an empty list's)."""
    ok = [_request(r) for r in records if r.ok]
    out: dict[str, float] = {}
    for metric in ask.metrics:
        values = _values(ok, metric) or [0.0]
        out[f"mean_{metric}_ms"] = statistics.fmean(values) * 1000
        out[f"median_{metric}_ms"] = statistics.median(values) * 1000
        out[f"std_{metric}_ms"] = statistics.pstdev(values) * 1000
        for q in ask.percentiles:
            out[f"p{_q_word(q)}_{metric}_ms"] = _pct(values, q) * 1000
    return {k: round(v, 6) for k, v in out.items()}


def _peaks(records: Sequence[RequestRecord]) -> tuple[float, int]:
    """The most output chunks in one second, and the most requests live in one second."""
    ok = [r for r in records if r.ok]
    if not ok:
        return 0.0, 0
    first = min(r.sent_ns for r in ok)
    seconds = math.ceil((max(r.end_ns for r in ok) - first) / NS) + 1
    tokens, live = [0] * seconds, [0] * seconds
    for r in ok:
        for stamp in r.token_ns:
            tokens[min(int((stamp - first) / NS), seconds - 1)] += 1
        for s in range(int((r.sent_ns - first) / NS), int((r.end_ns - first) / NS) + 1):
            live[min(s, seconds - 1)] += 1
    return float(max(tokens)), max(live)


def _goodput(ok: list[_Request], ask: BenchAsk, duration: float) -> float | None:
    if not ask.goodput_ms:
        return None
    bounds = dict(ask.goodput_ms)

    def good(x: _Request) -> bool:
        values = {"ttft": x.ttft, "tpot": x.tpot or 0.0, "e2el": x.latency}
        return all(values[k] * 1000 <= v for k, v in bounds.items())
    return sum(good(x) for x in ok) / duration


def document(ask: BenchAsk, level: LevelFacts, result: LevelResult,
             date: str) -> JsonObject:
    """The level's result as vllm bench serve writes it (its field names and order)."""
    records = result.records
    ok = [_request(r) for r in records if r.ok]
    duration = max((result.end_ns - result.start_ns) / NS, 1e-9)
    prompt = sum(r.prompt_tokens or 0 for r in records if r.ok)
    output = sum(x.output for x in ok)
    backend = "openai-chat" if level.endpoint == "chat" else "openai"
    doc: JsonObject = {
        "date": date, "endpoint_type": backend, "backend": backend, "label": level.label,
        "model_id": level.model, "tokenizer_id": level.model, "num_prompts": level.planned}
    doc.update(dict(ask.metadata))
    doc.update({
        "request_rate": level.rate if level.rate is not None else "inf",
        "burstiness": level.burstiness, "max_concurrency": level.concurrency,
        "duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
        "total_input_tokens": prompt, "total_output_tokens": output,
        "request_throughput": len(ok) / duration,
        "request_goodput": _goodput(ok, ask, duration),
        "output_throughput": output / duration,
        "total_token_throughput": (prompt + output) / duration})
    if ask.detailed:
        doc.update(_detailed(records))
    peak_tokens, peak_live = _peaks(records)
    doc["latencies"] = [_request(r).latency if r.ok else 0.0 for r in records]
    doc["queue_times"] = [(r.sent_ns - r.scheduled_ns) / NS if r.sent_ns else 0.0
                          for r in records]
    doc.update({"max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_live,
                "rtfx": 0.0})
    doc.update(metrics(records, ask))
    return doc


def _detailed(records: Sequence[RequestRecord]) -> JsonObject:
    """`--save-detailed`'s per-request lists, in request order (a failure: zeros and its
    error)."""
    shown = [_request(r) if r.ok else None for r in records]
    start = min((r.sent_ns for r in records if r.sent_ns), default=0)
    return {"input_lens": [r.prompt_tokens or 0 for r in records],
            "output_lens": [x.output if x else 0 for x in shown],
            "ttfts": [x.ttft if x else 0.0 for x in shown],
            "itls": [x.itl if x else [] for x in shown],
            "start_times": [(r.sent_ns - start) / NS if r.sent_ns else 0.0 for r in records],
            "errors": ["" if r.ok else (r.error or "cancelled") for r in records]}


def file_name(ask: BenchAsk, level: LevelFacts, date: str) -> Path:
    """Where the document goes: `--result-dir`/`--result-filename`, else vllm bench's name."""
    rate = "inf" if level.rate is None else str(float(level.rate))
    name = ask.filename or (f"{level.label}-{rate}qps-concurrency{level.concurrency}-"
                            f"{level.model.split('/')[-1]}-{date}.json")
    return Path(ask.directory or ".") / name


def write(ask: BenchAsk, level: LevelFacts, result: LevelResult) -> Path:
    """Write the level's document; its path."""
    date = time.strftime("%Y%m%d-%H%M%S")
    path = file_name(ask, level, date)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document(ask, level, result, date)), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--result-dir {path.parent}: cannot write {path.name} "
                         f"({exc.strerror})") from None
    return path


__all__ = ["DEFAULT_METRICS", "PERCENTILE_METRICS", "BenchAsk", "LevelFacts", "document",
           "file_name", "metrics", "write"]
