"""Trace replay: a published request trace, its prefix blocks rebuilt in the served model's
tokens, sent at its own arrival times.

The format is Mooncake's (kvcache-ai/Mooncake, `FAST25-release/traces/*.jsonl`), one JSON
object a line: `timestamp` (ms since the first request), `input_length` and `output_length`
(tokens), `hash_ids` (the prompt's blocks of `block_tokens` tokens, 512 in the published
traces, numbered so that two requests whose first k ids agree share their first k blocks).

Prompts are token ids, sent to /v1/completions, so every block is exactly `block_tokens` of the
served model's tokens (no chat template shifts them off the cache's block boundaries): block
`h` is drawn, seeded by (seed, h), from the tokens the engine's /tokenize gives for a long
generated passage (`TokenPool`, through the engine adapter), and the tokens past the last
hash id are the request's own. A block cut short by `input_length` is the first tokens of the
same block. Each request asks for its `output_length` tokens (capped at the run's
`max_tokens`, with `ignore_eos`), and is released at `timestamp / speedup`.

`--trace-limit N` takes the file's first N requests; a request over `--trace-max-input` is cut
to fit (its blocks past the limit dropped, the last one cut short: "truncate", the default) or
left out ("filter", so fewer than N are replayed); both are counted in the row. `reuse` is what
an infinite cache would serve: the leading blocks of each request that an earlier request
already held, of the prompts as sent. `synthetic` writes a trace of this format for tests and first
looks. Not here: the schedule (`runner.Schedule.arrivals_ns`) and the row (`level`).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import httpx
import numpy as np

from kvlab.core import InputError, JsonObject, load_tokenizer, server_root
from kvlab.engines import engine_for
from kvlab.loadgen import workloads
from kvlab.records import TraceEvidence

BLOCK_TOKENS = 512  # the published Mooncake traces' block size
POOL_WORDS = 2000  # the passage whose tokens every block is drawn from
MOONCAKE_TRACES = "https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release/traces"


@dataclass(frozen=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def as_dict(self) -> JsonObject:
        return {"timestamp": self.timestamp_ms, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}


@dataclass(frozen=True)
class TraceSpec:
    """Which trace, how its blocks are sized, how fast it is replayed."""

    path: str
    block_tokens: int = BLOCK_TOKENS
    speedup: float = 1.0  # 2.0 replays twice as fast
    limit: int | None = None  # the trace's first N requests (before any is left out)
    max_input: int | None = None  # longer prompts are cut to fit or left out (counted)
    over: Literal["truncate", "filter"] = "truncate"  # what becomes of a longer prompt

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise InputError(f"--trace-block-size {self.block_tokens}: give at least 1 token")
        if not self.speedup > 0:
            raise InputError(f"--trace-speedup {self.speedup}: must be above 0")
        if self.limit is not None and self.limit < 1:
            raise InputError(f"--trace-limit {self.limit}: give at least 1 request")


@dataclass(frozen=True)
class Trace:
    requests: tuple[TraceRequest, ...]
    sha256: str
    left_out: int  # longer than `max_input`, filtered out
    truncated: int = 0  # longer than `max_input`, cut to fit

    def offsets_ns(self, speedup: float) -> tuple[int, ...]:
        first = self.requests[0].timestamp_ms if self.requests else 0.0
        return tuple(round((r.timestamp_ms - first) * 1e6 / speedup) for r in self.requests)


def _request(obj: object, where: str) -> TraceRequest:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: a trace line is a JSON object")
    try:
        stamp, length = float(obj["timestamp"]), int(obj["input_length"])
        request = TraceRequest(stamp, length, int(obj["output_length"]),
                               tuple(int(h) for h in obj["hash_ids"]))
    except KeyError as exc:
        raise InputError(f"{where}: no {exc.args[0]!r} (a Mooncake trace line has timestamp, "
                         "input_length, output_length, hash_ids)") from None
    except (TypeError, ValueError):
        raise InputError(f"{where}: timestamp, input_length, output_length and hash_ids must "
                         "be numbers (hash_ids a list of whole numbers)") from None
    if request.input_length < 1 or request.output_length < 0 or request.timestamp_ms < 0:
        raise InputError(f"{where}: input_length must be at least 1, output_length and "
                         "timestamp at least 0")
    return request


def truncated(request: TraceRequest, max_input: int, block_tokens: int) -> TraceRequest:
    """`request` cut to `max_input` tokens: the blocks that still hold a token, the last one
    cut short as a block cut by `input_length` always is."""
    return replace(request, input_length=max_input,
                   hash_ids=request.hash_ids[:-(-max_input // block_tokens)])


def read(spec: TraceSpec) -> Trace:
    """The trace's first `limit` requests (in the file, before any is left out) in arrival
    order, each over `max_input` cut to fit or left out as `over` says."""
    path = Path(spec.path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--trace {path}: cannot read it ({exc.strerror})") from None
    out: list[TraceRequest] = []
    read_, left_out, cut = 0, 0, 0
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not raw.strip():
            continue
        if spec.limit is not None and read_ == spec.limit:
            break
        try:
            obj = json.loads(raw)
        except ValueError:
            raise InputError(f"{path}:{number}: not a JSON line") from None
        request, read_ = _request(obj, f"{path}:{number}"), read_ + 1
        if spec.max_input is not None and request.input_length > spec.max_input:
            if spec.over == "filter":
                left_out += 1
                continue
            request, cut = truncated(request, spec.max_input, spec.block_tokens), cut + 1
        out.append(request)
    if not out:
        raise InputError(f"--trace {path}: no request to replay"
                         + (f" ({left_out} longer than --trace-max-input)" if left_out else ""))
    out.sort(key=lambda r: r.timestamp_ms)  # stable: simultaneous requests keep their order
    return Trace(tuple(out), hashlib.sha256(data).hexdigest(), left_out, cut)


# --- tokens -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenPool:
    """The served model's tokens every block is drawn from, and who counted them."""

    tokens: tuple[int, ...]
    source: str

    def block(self, seed: int, salt: int, hash_id: int, count: int) -> list[int]:
        """Block `hash_id`'s first `count` tokens: the same for every request of one replay
        (`salt`: a level's own, so a second replay finds nothing of the first cached)."""
        return self._draw((seed, salt, 0, hash_id), count)

    def own(self, seed: int, salt: int, index: int, count: int) -> list[int]:
        """Request `index`'s own tokens past its last block."""
        return self._draw((seed, salt, 1, index), count)

    def _draw(self, key: tuple[int, ...], count: int) -> list[int]:
        rng = np.random.default_rng([abs(k) for k in key])
        pool = np.asarray(self.tokens, dtype=np.int64)
        return [int(t) for t in pool[rng.integers(0, len(pool), count)]]


def server_roots(urls: Iterable[str]) -> list[str]:
    """The servers behind `urls`, in order, each once (a --metrics-url: its server's root)."""
    return list(dict.fromkeys(server_root(u.rstrip("/").removesuffix("/metrics"))
                              for u in urls if u))


async def token_pool(engine: str, urls: Iterable[str], seed: int,
                     client: httpx.AsyncClient, *, tokenizer: str = "",
                     asked_by: str = "--trace") -> TokenPool:
    """The distinct tokens of a long generated passage, in the served model's tokens: by the
    local `tokenizer` (a model directory or its tokenizer.json) when given, else by the first
    server whose /tokenize answers; `asked_by` names the option that needs them."""
    text = workloads.passage(random.Random(f"trace-pool:{seed}"), POOL_WORDS)
    if tokenizer:
        return local_pool(tokenizer, text)
    adapter = engine_for(engine)
    roots = server_roots(urls)
    for root in roots:
        tokens = await adapter.tokenize(client, root, text)
        if tokens:
            return TokenPool(tuple(sorted(set(tokens))), f"{engine} tokenizer at {root}")
    raise InputError(f"{asked_by}: no /tokenize answered ({', '.join(roots) or 'no server'}); "
                     "its prompts are made of the served model's tokens: give --tokenizer "
                     "with the model's directory or tokenizer.json, or --tokenize-url an "
                     "engine that serves the model")


def local_pool(tokenizer: str, text: str) -> TokenPool:
    """The passage's distinct tokens by a tokenizer.json on this machine."""
    tokens = load_tokenizer(tokenizer, "to make the prompts in its tokens here").encode(
        text, add_special_tokens=False).ids
    return TokenPool(tuple(sorted(set(tokens))), f"tokenizer.json at {tokenizer}")


def prompt_tokens(request: TraceRequest, index: int, pool: TokenPool, seed: int, salt: int,
                  block_tokens: int) -> list[int]:
    """Request `index`'s prompt: its blocks, then its own tokens, `input_length` in all."""
    out: list[int] = []
    for hash_id in request.hash_ids:
        left = request.input_length - len(out)
        if left <= 0:
            break
        out += pool.block(seed, salt, hash_id, min(block_tokens, left))
    if len(out) < request.input_length:
        out += pool.own(seed, salt, index, request.input_length - len(out))
    return out


# --- what the trace asks of a cache -------------------------------------------------------

def reusable_blocks(requests: Sequence[TraceRequest], block_tokens: int) -> list[int]:
    """Per request, its leading whole blocks an earlier request already held in full (what an
    infinite cache that kept everything would serve), short of its last token: an engine
    computes at least one prompt token, so a prompt held whole gets all but its last block
    (vLLM's hit counts then stop a block short)."""
    held: set[int] = set()
    out = []
    for r in requests:
        whole = r.input_length // block_tokens
        usable = min(max(r.input_length - 1, 0) // block_tokens, len(r.hash_ids))
        n = 0
        while n < usable and r.hash_ids[n] in held:
            n += 1
        out.append(n)
        held.update(r.hash_ids[:min(whole, len(r.hash_ids))])
    return out


def describe(spec: TraceSpec, trace: Trace, pool: TokenPool | None = None,
             max_tokens: int | None = None) -> TraceEvidence:
    """What a row says about the trace it replayed."""
    requests = trace.requests
    reuse = reusable_blocks(requests, spec.block_tokens)
    prompt = sum(r.input_length for r in requests)
    offsets = trace.offsets_ns(spec.speedup)
    return TraceEvidence(
        path=spec.path, sha256=trace.sha256, format="mooncake", requests=len(requests),
        limit=spec.limit, max_input=spec.max_input,
        over_max_input=spec.over if spec.max_input is not None else None,
        left_out_over_max_input=trace.left_out, truncated_to_max_input=trace.truncated,
        block_tokens=spec.block_tokens,
        speedup=spec.speedup, span_s=round(offsets[-1] / 1e9, 3) if offsets else 0.0,
        distinct_blocks=len({h for r in requests for h in r.hash_ids}),
        reusable_fraction_infinite_cache=round(sum(reuse) * spec.block_tokens / prompt, 4)
        if prompt else None,
        outputs_capped=sum(r.output_length > max_tokens for r in requests) if max_tokens else 0,
        tokens_from=pool.source if pool else None)


# --- a generated trace --------------------------------------------------------------------

def synthetic(count: int, *, groups: int = 2, shared_blocks: int = 2,
              own_blocks: tuple[int, int] = (1, 2), block_tokens: int = BLOCK_TOKENS,
              rate: float = 1.0, output_length: int = 8, seed: int = 0) -> list[TraceRequest]:
    """`count` requests: each opens with one of `groups` shared prefixes of `shared_blocks`
    blocks, then its own blocks (a number in `own_blocks`, the last one cut short), arriving
    at `rate` per second (seeded Poisson), in the Mooncake format."""
    rng = random.Random(f"synthetic-trace:{seed}")
    roots = [list(range(g * shared_blocks, (g + 1) * shared_blocks)) for g in range(groups)]
    next_id, at, out = groups * shared_blocks, 0.0, []
    for _ in range(count):
        own = rng.randint(*own_blocks)
        ids = [*roots[rng.randrange(groups)], *range(next_id, next_id + own)]
        next_id += own
        length = (len(ids) - 1) * block_tokens + rng.randint(1, block_tokens)
        out.append(TraceRequest(round(at * 1000), length, output_length, tuple(ids)))
        at += rng.expovariate(rate)
    return out


def write(path: Path, requests: Iterable[TraceRequest]) -> Path:
    path.write_text("".join(json.dumps(r.as_dict()) + "\n" for r in requests),
                    encoding="utf-8")
    return path
