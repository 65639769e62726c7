"""llama-server's HTTP API as kvlab uses it: props, slots, save/restore/erase, tokenize, chat.

Each slot action returns the server's own timing (`timings.save_ms` / `restore_ms`) and the
wall time kvlab measured around the HTTP call. A failed action is a generic HTTP 400 from the
server; when its log file is known, the error carries the log's own reason instead. Slot ids
are checked against the server's slot count first, because llama-server wraps an id past the
last slot around to another slot instead of refusing it.

`LlamaTarget` names the server and the few facts /props cannot tell (KV types,
flash-attention mode, slot directory, log file): from the plan when kvlab started the server
in-process, from the record `kvlab llama serve` keeps while it runs, else from settings.
This module knows nothing of manifests (`slotmanifest.py`, `slotstore.py`) and runs no experiment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

import httpx

from kvlab.core import (
    EngineError,
    JsonObject,
    RefusedError,
    Settings,
    UnreachableError,
    dig,
    integer,
    integers,
    number,
    obj,
)
from kvlab.engines.llamacpp import facts
from kvlab.engines.plan import EnginePlan, client_host
from kvlab.observe import ChatResult, chat_body, stream_chat
from kvlab.records import SlotOpLine

DEFAULT_TIMEOUT_S = 600.0  # a cold prefill of a long prompt on two CPU cores takes a while


@dataclass(frozen=True)
class LlamaTarget:
    """One llama-server, and what kvlab knows about how it was started."""

    base_url: str
    slot_dir: Path
    kv_type_k: str
    kv_type_v: str
    flash_attn: str = facts.FLASH_ATTN_DEFAULT
    log_path: Path | None = None
    source: str = "settings"  # where kv types / flash-attn / slot dir came from
    model: str | None = None  # the GGUF the source says it loaded (checked against /props)

    @classmethod
    def from_plan(cls, plan: EnginePlan, log_path: Path | None = None,
                  source: str = "plan") -> LlamaTarget:
        k, v = facts.kv_types(plan)
        slot_dir = plan.flag_value("--slot-save-path") or ""
        return cls(plan.base_url, Path(slot_dir), k, v, facts.flash_attn_mode(plan),
                   log_path, source, plan.model)


def write_serve_record(settings: Settings, plan: EnginePlan, log_path: Path) -> Path:
    """Leave what `kvlab llama serve` started where `kvlab llama save|restore` will look."""
    target = LlamaTarget.from_plan(plan, log_path, source="kvlab llama serve")
    path = settings.paths().llama_serve_record(plan.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(target).items()}
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def target_from_settings(settings: Settings, port: int | None = None) -> LlamaTarget:
    """The server at LLAMA_PORT (or `port`), as its serve record or the settings describe it."""
    port = port or settings.llama_port
    record_path = settings.paths().llama_serve_record(port)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        raw = json.loads(record_path.read_text(encoding="utf-8"))
        return LlamaTarget(
            base_url=str(raw["base_url"]), slot_dir=Path(raw["slot_dir"]),
            kv_type_k=str(raw["kv_type_k"]), kv_type_v=str(raw["kv_type_v"]),
            flash_attn=str(raw["flash_attn"]),
            log_path=Path(raw["log_path"]) if raw.get("log_path") else None,
            source=f"{raw['source']} ({record_path})", model=raw.get("model"),
        )
    host = client_host(settings.serve_host)
    log = settings.paths().log(f"serve-llama-{port}")
    return LlamaTarget(
        base_url=f"http://{host}:{port}",
        slot_dir=Path(settings.llama_slot_save_path).expanduser(),
        kv_type_k=settings.llama_cache_type, kv_type_v=settings.llama_cache_type,
        log_path=log if log.is_file() else None, source="settings",
    )


@dataclass(frozen=True)
class SlotOp:
    """One slot action: the server's own figures and the wall time around the call."""

    action: str
    slot: int
    filename: str | None
    n_tokens: int
    n_bytes: int | None
    server_ms: float | None
    wall_ms: float

    def as_dict(self) -> dict[str, object]:
        return self.as_record().model_dump(mode="json")

    def as_record(self) -> SlotOpLine:
        return SlotOpLine(action=self.action, slot=self.slot, filename=self.filename,
                          n_tokens=self.n_tokens, n_bytes=self.n_bytes, server_ms=self.server_ms,
                          wall_ms=round(self.wall_ms, 3))


class LlamaClient:
    """An HTTP client for one llama-server; `async with` closes it."""

    def __init__(self, target: LlamaTarget, api_key: str = "",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # no keep-alive: llama-server may close a connection just after a stream ends, and a
        # request sent on it then fails with no answer; a fresh loopback connection per call
        # costs well under a millisecond (the seed's curl did the same)
        self.http = httpx.AsyncClient(base_url=target.base_url, headers=headers,
                                      timeout=timeout_s, trust_env=False,
                                      limits=httpx.Limits(max_keepalive_connections=0))
        self._api_key = api_key

    async def __aenter__(self) -> LlamaClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.http.aclose()

    async def _json(self, method: str, path: str,
                    body: JsonObject | None = None) -> tuple[int, object]:
        try:
            response = await self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise UnreachableError(
                f"llama-server at {self.target.base_url} did not answer ({exc or type(exc)}); "
                "start it with `kvlab llama serve` or set LLAMA_PORT"
            ) from None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, {"error": {"message": response.text[:200]}}

    async def props(self) -> dict[str, object]:
        code, body = await self._json("GET", facts.PROPS_PATH)
        if code != 200 or not isinstance(body, dict):
            raise EngineError(f"{self.target.base_url}{facts.PROPS_PATH} answered HTTP {code}")
        return body

    async def slots(self) -> list[dict[str, object]]:
        code, body = await self._json("GET", facts.SLOTS_PATH)
        if code != 200 or not isinstance(body, list):
            raise EngineError(f"{self.target.base_url}{facts.SLOTS_PATH} answered HTTP {code}"
                              " (the server needs --slots)")
        return [obj(slot) for slot in body]

    async def check_slot(self, slot: int) -> int:
        """Refuse a slot id the server does not have (it would wrap around silently)."""
        count = integer((await self.props()).get(facts.PROPS_SLOTS)) or 0
        if not 0 <= slot < count:
            raise RefusedError(
                f"slot {slot} does not exist: this server has {count} slot(s) "
                f"(--parallel {count}), ids 0-{count - 1}; llama-server would silently use "
                f"slot {slot % count if count else 0} instead"
            )
        return count

    async def save(self, slot: int, filename: str) -> SlotOp:
        return await self._slot_action("save", slot, facts.check_slot_filename(filename))

    async def restore(self, slot: int, filename: str) -> SlotOp:
        return await self._slot_action("restore", slot, facts.check_slot_filename(filename))

    async def erase(self, slot: int) -> SlotOp:
        return await self._slot_action("erase", slot, None)

    async def _slot_action(self, action: str, slot: int, filename: str | None) -> SlotOp:
        url = facts.slot_url("", slot, action)
        body: JsonObject | None = {"filename": filename} if filename is not None else None
        offset = self._log_size()
        started = time.perf_counter()
        code, answer = await self._json("POST", url, body)
        wall_ms = (time.perf_counter() - started) * 1000
        if code != 200 or not isinstance(answer, dict):
            raise EngineError(await self._failure(action, slot, filename, code, answer, offset))
        tokens_key, bytes_key, ms_key = facts.SLOT_RESULT_KEYS[action]
        return SlotOp(
            action=action, slot=slot, filename=filename,
            n_tokens=integer(answer.get(tokens_key)) or 0,
            n_bytes=integer(answer.get(bytes_key)) if bytes_key else None,
            server_ms=number(dig(answer, "timings", ms_key)) if ms_key else None,
            wall_ms=wall_ms,
        )

    def _log_size(self) -> int:
        log = self.target.log_path
        try:
            return log.stat().st_size if log else 0
        except OSError:
            return 0

    async def _failure(self, action: str, slot: int, filename: str | None, code: int,
                       answer: object, offset: int) -> str:
        message = ""
        if isinstance(answer, dict):
            err = answer.get("error")
            message = str(dig(err, "message") or "") if isinstance(err, dict) else str(err or "")
        what = f"{action} of slot {slot}" + (f" as {filename}" if filename else "")
        reason = await self._log_reason(offset)
        if reason:
            return f"{what} failed (HTTP {code}); the server log says: {reason}"
        where = f" ({self.target.log_path})" if self.target.log_path else ""
        return (f"{what} failed (HTTP {code}: {message or 'no message'}); llama-server gives "
                f"its reason only in its own log{where}")

    async def _log_reason(self, offset: int) -> str | None:
        log = self.target.log_path
        if log is None:
            return None
        for _ in range(5):  # the server may flush its error line a moment after answering
            try:
                with open(log, "rb") as f:  # noqa: ASYNC230 - a local file read once
                    f.seek(offset)
                    text = f.read().decode("utf-8", "replace")
            except OSError:
                return None
            reason = facts.slot_failure_reason(text)
            if reason:
                return reason
            await asyncio.sleep(0.05)
        return None

    async def _answer(self, path: str, body: JsonObject) -> JsonObject:
        """The JSON object a POST to `path` answers (EngineError naming the path if none)."""
        code, answer = await self._json("POST", path, body)
        if code != 200 or not isinstance(answer, dict):
            raise EngineError(f"{path} answered HTTP {code}")
        return answer

    async def tokenize(self, text: str) -> list[int]:
        body = await self._answer(facts.TOKENIZE_PATH, {"content": text})
        if (tokens := integers(body.get("tokens"))) is None:
            raise EngineError(f"{facts.TOKENIZE_PATH} answered no token list")
        return tokens

    async def detokenize(self, tokens: list[int]) -> str:
        body = await self._answer(facts.DETOKENIZE_PATH, {"tokens": list(tokens)})
        return str(body.get("content", ""))

    async def chat_tokens(self, messages: list[dict[str, str]]) -> int:
        """Tokens a chat conversation takes once this server's template is applied."""
        body = await self._answer(facts.APPLY_TEMPLATE_PATH, {"messages": list(messages)})
        return len(await self.tokenize(str(body.get("prompt", ""))))

    async def chat(self, prompt: str, *, slot: int | None = None, max_tokens: int = 8,
                   top_logprobs: int = 5, model: str = "local-chat") -> ChatResult:
        """One greedy streamed chat turn on `slot`: TTFT, timings.cache_n/prompt_n, logprobs."""
        extra: JsonObject = {"cache_prompt": True, "logprobs": True, "top_logprobs": top_logprobs}
        if slot is not None:
            extra["id_slot"] = slot
        body = chat_body(model, [{"role": "user", "content": prompt}], max_tokens, extra=extra)
        return await stream_chat(self.http, self.target.base_url, body, self._api_key)
