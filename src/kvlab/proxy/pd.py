"""The prefill -> decode request protocol, per KV connector's hand-over, as pure functions.

Given the client's request body, these functions say what the prefill leg receives, what the
decode leg receives, and whether the hand-over carried what decode needs. They do no I/O and
know no HTTP; the server (`app.py`) calls them and moves bytes.

Which hand-over a connector uses is `core/connectors.py`'s (`Connector.handover`); these
functions take the connector and never compare its name.

- `content` (`shared` = vLLM's ExampleConnector directory, `lmcache`):
  prefill gets the request cut to one token (`max_tokens: 1`, and `max_completion_tokens: 1`
  where the client used it), `stream: false`, no `stream_options`, no `min_tokens`; decode
  gets the client's request unchanged and finds the KV by content.
- `pull` (`nixl`): prefill also gets `kv_transfer_params` with `do_remote_decode: true`;
  the `kv_transfer_params` prefill answers with go to decode. vLLM returns none when the
  prefill request did not end length-capped; decode then recomputes the whole prompt without
  any error, so the caller is told (`DecodePlan.params_missing`) to count and mark it.
- `bootstrap` (`mooncake`): both legs share a transfer id made from the request id; decode
  also gets the prefill instance's bootstrap address and engine id (discovered at start,
  `PrefillPeer`).

A client's own `kv_transfer_params` never reaches an engine: they name hosts the engines
would connect to, and only the proxy may choose those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvlab.core import Connector

PARAMS = "kv_transfer_params"
# fields of a generation request that make no sense on a one-token, non-streamed prefill
_PREFILL_DROPS = ("stream_options", "min_tokens")


@dataclass(frozen=True)
class PrefillPeer:
    """What decode must be told about a prefill instance (mooncake only)."""

    bootstrap_addr: str | None = None  # "http://host:port" of its bootstrap server
    engine_id: str | None = None


@dataclass(frozen=True)
class DecodePlan:
    """The decode leg's body (None: forward the client's bytes unchanged) and the verdict."""

    body: dict[str, object] | None
    params_missing: bool = False


def transfer_id(request_id: str) -> str:
    """The id both legs rendezvous on (mooncake)."""
    return f"xfer-{request_id}"


def prefill_body(body: dict[str, object], connector: Connector,
                 request_id: str) -> dict[str, object]:
    """The prefill leg's request: one token, not streamed, with the connector's params."""
    out = {k: v for k, v in body.items() if k not in _PREFILL_DROPS and k != PARAMS}
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        # vLLM's chat endpoint prefers max_completion_tokens over max_tokens
        out["max_completion_tokens"] = 1
    if connector.handover == "pull":
        out[PARAMS] = {"do_remote_decode": True, "do_remote_prefill": False,
                       "remote_engine_id": None, "remote_block_ids": None,
                       "remote_host": None, "remote_port": None}
    elif connector.handover == "bootstrap":
        out[PARAMS] = {"do_remote_decode": True, "do_remote_prefill": False,
                       "transfer_id": transfer_id(request_id)}
    return out


def prefill_reply_needed(connector: Connector) -> bool:
    """Whether decode's body depends on what prefill answered (else it is not parsed)."""
    return connector.handover == "pull"


def decode_plan(body: dict[str, object], connector: Connector, request_id: str,
                prefill_reply: dict[str, object] | None = None,
                peer: PrefillPeer | None = None) -> DecodePlan:
    """The decode leg's request, and whether the KV hand-over is known to be missing."""
    if connector.handover == "content":
        if PARAMS not in body:
            return DecodePlan(None)
        return DecodePlan({k: v for k, v in body.items() if k != PARAMS})
    out = {k: v for k, v in body.items() if k != PARAMS}
    if connector.handover == "pull":
        params = (prefill_reply or {}).get(PARAMS)
        if not isinstance(params, dict) or not params:
            return DecodePlan(out, params_missing=True)
        out[PARAMS] = params
        return DecodePlan(out)
    peer = peer or PrefillPeer()
    if not (peer.bootstrap_addr and peer.engine_id):
        return DecodePlan(out, params_missing=True)
    out[PARAMS] = {"do_remote_decode": False, "do_remote_prefill": True,
                   "transfer_id": transfer_id(request_id),
                   "remote_bootstrap_addr": peer.bootstrap_addr,
                   "remote_engine_id": peer.engine_id}
    return DecodePlan(out)


def parse_reply(raw: bytes) -> dict[str, object] | None:
    """Prefill's JSON answer as a dict; None when it is not a JSON object."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def dumps(body: dict[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
