"""Per-request files: every request of one load level, one JSON line each, beside the notebook.

A notebook `load` row names its file (`requests_file`, relative to the notebook's folder) and
the file's sha256 (`requests_sha256`); a reader refuses a file whose digest differs, so a row
and the requests it summarises cannot drift apart. Lines are `RequestLine`s; the file is
written whole (temporary file, then rename) with mode 0600, because prompts' sizes and
timings are a user's data. This module computes no statistic.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from kvlab.core import InputError, write_private
from kvlab.records.base import Strict

REQUESTS_DIR = "kvlab-requests"  # beside the notebook
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class Gaps(Strict):
    """A request's inter-token gaps, summarised (seconds)."""

    n: int
    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class ProxyTimeline(Strict):
    """One request through kvlab's proxy: the proxy's parts (`proxy/app.py` defines them,
    each timed on the proxy's clock) and two the client times, which together add up to the
    request's `ttft_s`."""

    prefill_s: float = Field(description="Prefill's request sent to its whole answer read.")
    handover_s: float = Field(description="Prefill's answer read to decode's request sent "
                              "(NIXL: the kv_transfer_params round trip through the proxy).")
    decode_s: float = Field(description="Decode's request sent to its first byte (for NIXL "
                            "and the stores, the KV's arrival is inside it).")
    proxy_s: float = Field(description="The proxy's own time besides the hand-over.")
    to_token_s: float = Field(description="The answer's first event to its first token, on "
                              "the client: bytes decode sent before a token (vLLM's role "
                              "chunk, a token still being detokenised).")
    wire_s: float = Field(description="The rest: the way between client and proxy, both "
                          "ways, and the client's wake-up.")


class RequestLine(Strict):
    """One request of a load level, as measured."""

    id: int = Field(description="The request's index within its level, in sending order "
                    "(warm-up requests first).")
    level: int = Field(description="The level's concurrency.")
    repeat: int | None = Field(None, description="Which repeat of the run (0-based).")
    conversation: int | None = Field(None, description="multi-turn: the conversation.")
    turn: int | None = Field(None, description="multi-turn: the turn, 0-based.")
    prompt_index: int | None = Field(None, description="The workload's prompt index: the set, "
                                     "seed and this index give the prompt's text again.")
    warmup: bool = Field(False, description="Sent to warm up; excluded from the statistics.")
    sent_s: float | None = Field(None, description="Seconds from the level's start (its "
                                 "warm-up's start when it had one).")
    first_token_s: float | None = None
    end_s: float | None = None
    schedule_lag_s: float | None = Field(None, description="Sent minus when the schedule "
                                         "released it: the client's own delay.")
    ttft_s: float | None = Field(None, description="To the first token, answer or reasoning "
                                 "(`observe/sse.py` defines it).")
    ttft_answer_s: float | None = Field(None, description="To the first answer token "
                                        "(`delta.content`, `text`).")
    ttft_reasoning_s: float | None = Field(None, description="To the first reasoning token "
                                           "(`delta.reasoning[_content]`); None when none came.")
    tpot_s: float | None = None
    itl_s: Gaps | None = None
    burst_read: bool | None = Field(None, description="True: its tokens reached the client "
                                    "together, faster than an engine decodes one stream; its "
                                    "TPOT is the client's, left out of TPOT intervals.")
    prompt_tokens_requested: int | None = Field(
        None, description="The size asked of the prompt's sized text (the shared preamble, "
        "the mixed set's document, a conversation's opening), in the sizing's tokens; of a "
        "random prompt or a trace's, its token ids (sent as text: those its text was made "
        "from, which the server may count differently).")
    prompt_tokens: int | None = Field(None, description="The server's usage count.")
    cached_tokens: int | None = Field(None, description="usage.prompt_tokens_details.")
    oracle_cached_tokens: int | None = Field(None, description="What the cache oracle says "
                                             "the engine's cache could have served.")
    output_tokens: int | None = None
    status: Literal["ok", "failed", "cancelled"]
    http_status: int | None = None
    error: str | None = None
    error_detail: str | None = Field(None, description="The first 200 characters the "
                                     "server or the client said about the failure.")
    failed_leg: str | None = Field(None, description="prefill or decode, through the proxy.")
    blank_output: bool | None = Field(None, description="True: a success whose output tokens "
                                      "(the server's usage) decoded to no visible text; timed "
                                      "from its first choice-carrying event.")
    request_id: str | None = Field(None, description="The X-Request-Id the client sent.")
    response_id: str | None = Field(None, description="The id the server gave its answer "
                                    "(vLLM's is `chatcmpl-` and the request id).")
    timeline: ProxyTimeline | None = Field(None, description="Through kvlab's proxy: its "
                                           "timeline of this request.")


def file_name(label: str, concurrency: int, repeat: int | None = None,
              suffix: str | None = None) -> str:
    """`<label>-c<concurrency>[-r<repeat>]-<suffix>.jsonl`, the label made safe for a file
    name; the suffix (random unless given) keeps two runs of one label apart."""
    safe = _UNSAFE.sub("_", label).strip("._") or "load"
    tail = f"-r{repeat}" if repeat is not None else ""
    return f"{safe}-c{concurrency}{tail}-{suffix or uuid.uuid4().hex[:8]}.jsonl"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(path: Path, lines: Iterable[RequestLine]) -> str:
    """Write the file whole, private, atomically; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(path, "".join(json.dumps(line.model_dump(mode="json"), sort_keys=True,
                                           allow_nan=False) + "\n" for line in lines))
    return sha256_of(path)


def write_beside(notebook: Path, label: str, concurrency: int, repeat: int | None,
                 lines: Iterable[RequestLine]) -> tuple[str, str]:
    """Write a level's file into the notebook's `kvlab-requests` folder under a fresh name;
    (its path relative to the notebook's folder, its sha256)."""
    while True:
        relative = f"{REQUESTS_DIR}/{file_name(label, concurrency, repeat)}"
        path = location(notebook, relative)
        if not path.exists():
            return relative, write(path, lines)


def location(notebook: Path, relative: str) -> Path:
    """Where a row's `requests_file` is, refusing one that leaves the notebook's folder."""
    base = notebook.resolve().parent
    path = (base / relative).resolve()
    if base not in path.parents:
        raise InputError(f"requests_file {relative!r} is outside the notebook's folder {base}")
    return path


def of_row(notebook: Path, relative: str | None, sha256: str | None
           ) -> list[RequestLine] | None:
    """A notebook row's per-request lines; None when the row names no file or its file is
    absent (a notebook read without its `kvlab-requests` folder): what needs them is left
    out and the report says so (`absent`). A file that is there but changed is refused."""
    if relative is None:
        return None
    path = location(notebook, relative)
    return read(path, sha256) if path.exists() else None


def absent(notebook: Path, relatives: Iterable[str | None]) -> list[str]:
    """The per-request files the rows name that are not beside the notebook."""
    return sorted({r for r in relatives if r is not None and not location(notebook, r).exists()})


def read(path: Path, sha256: str | None) -> list[RequestLine]:
    """Every line of a per-request file; refuses a missing, changed or malformed file."""
    try:
        if sha256 is not None and sha256_of(path) != sha256:
            raise InputError(f"{path}: its sha256 differs from the notebook row's "
                             "requests_sha256; the file changed after the run")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: the per-request file named by the notebook is missing") \
            from None
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        try:
            out.append(RequestLine.model_validate_json(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            raise InputError(f"{path}:{number}: {where}: {first['msg']}") from None
    return out
