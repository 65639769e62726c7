"""A split's link row taken apart per leg: each engine's requests and prompt tokens from its own
/metrics (the link row's deltas by URL), and the KV bytes the prediction gives it (its requests
times the payload per request) beside those its own counters show it moved (NIXL's bytes, else
the tokens it loaded through the connector times the bytes per token). With several prefills or
decodes (XpYd) this is what says each leg was used and what crossed it."""

from __future__ import annotations

from kvlab.core import human_bytes
from kvlab.records import Deltas, LegFigures, LinkRecord, PredictionRecord


def per_leg(link: LinkRecord, prediction: PredictionRecord | None,
            nodes: dict[str, str | None]) -> list[LegFigures]:
    """One entry per leg of `link.legs` (role -> metrics URL), in its order."""
    return [_leg(link, role, url, prediction, nodes.get(role))
            for role, url in (link.legs or {}).items()]


def _leg(link: LinkRecord, role: str, url: str, prediction: PredictionRecord | None,
         node: str | None) -> LegFigures:
    deltas: Deltas = link.metric_deltas.get(url, {})
    requests = _number(deltas.get("requests_succeeded"))
    loaded = _number(deltas.get("prompt_tokens_external_kv_transfer"))
    leg = LegFigures(role=role, metrics_url=url, node=node, requests=requests,
                     prompt_tokens=_number(deltas.get("prompt_tokens")),
                     computed_tokens=_number(deltas.get("prompt_tokens_local_compute")),
                     loaded_tokens=loaded)
    payload = prediction.payload_bytes if prediction else None
    if payload and requests is not None:
        leg.predicted_bytes = round(payload * requests, 1)
    nixl = (link.nixl or {}).get(url)
    per_token = prediction.bytes_per_token if prediction else None
    if nixl is not None and nixl.nixl_bytes is not None:
        leg.observed_bytes, leg.observed_from = nixl.nixl_bytes, "nixl"
    elif loaded is not None and per_token:
        leg.observed_bytes, leg.observed_from = round(loaded * per_token, 1), "loaded_tokens"
    return leg


def line(leg: LegFigures) -> str:
    """One leg in words: where, how many requests its counters saw, its KV bytes."""
    where = f" on {leg.node}" if leg.node else ""
    served = "no request counter" if leg.requests is None else f"{leg.requests:.0f} requests"
    predicted = human_bytes(leg.predicted_bytes) if leg.predicted_bytes else "not predicted"
    moved = (f"{human_bytes(leg.observed_bytes)} by {leg.observed_from}"
             if leg.observed_bytes is not None else "none counted by it")
    return f"leg {leg.role}{where}: {served}; KV predicted {predicted}, moved {moved}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
