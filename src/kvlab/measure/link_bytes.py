"""Did the cache cross the link? Bytes per request three ways, against the prediction.

The arithmetic prediction (KV bytes per token times the prompt tokens, given or the servers'
own mean) beside what moved per request as each source saw it: the interface's or RDMA port's
counters, NIXL's own byte histogram (and its timing), a shared store's growth and what decode
read from it. The most specific source gives the verdict (`CROSSED`, `NOT_CROSSED`,
`UNCLEAR`); a shared store whose decodes computed few of their prompt tokens themselves crossed
it however few bytes a request shows (`DECODE_DID_NOT_PREFILL`).

Deliberately not here: the bytes per leg of an XpYd split (`leg_bytes.py`), which rows and
link line are compared (`pairing.py`), and the lines a comparison prints about the link
(`compare.py`). Pure functions of the link and load records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlab.core import connectors
from kvlab.records import BytesEvidence, LinkRecord, LoadRecord, NixlTransfer, leg_of

CROSSED = "the cache crossed the link"
NOT_CROSSED = "it did not: decode is prefilling by itself"
UNCLEAR = "unclear: the link carried between 1% and 10% of the predicted cache"
DECODE_DID_NOT_PREFILL = (
    "the cache crossed the store: decode computed only {share:.0%} of its prompt tokens itself "
    "(the rest it loaded, once per distinct prefix, and then found in its own prefix cache)"
)


@dataclass
class Bytes:
    """Bytes per request: predicted, and observed as each source saw it."""

    predicted: float | None = None
    prompt_tokens: float | None = None
    prompt_tokens_from: str | None = None
    observed: dict[str, float] = field(default_factory=dict)  # source -> bytes/request
    verdict: str | None = None
    verdict_source: str | None = None
    decode_computed_share: float | None = None
    transfer: NixlTransfer | None = None  # NIXL's own count and timing of its transfers

    def as_record(self) -> BytesEvidence:
        """The bytes as a comparison line holds them (observed to one decimal)."""
        return BytesEvidence(
            predicted_bytes_per_request=self.predicted, prompt_tokens=self.prompt_tokens,
            prompt_tokens_from=self.prompt_tokens_from,
            observed_bytes_per_request_by_source={k: round(v, 1)
                                                  for k, v in self.observed.items()},
            verdict=self.verdict, verdict_source=self.verdict_source,
            decode_computed_share=self.decode_computed_share, nixl_transfer=self.transfer)


def _mean_prompt_tokens(rows: dict[int, LoadRecord], levels: list[int]) -> float | None:
    pairs: list[tuple[float, int]] = []
    for level in levels:
        mean, ok = rows[level].prompt_tokens_mean, rows[level].ok or 0
        if mean is not None and ok > 0:
            pairs.append((float(mean), ok))
    total = sum(n for _, n in pairs)
    return sum(m * n for m, n in pairs) / total if total else None


def _nixl_total(link: LinkRecord) -> float | None:
    values = [float(v.nixl_bytes) for v in (link.nixl or {}).values()
              if v.nixl_bytes is not None]
    return sum(values) if values else None


def nixl_timing(link: LinkRecord) -> NixlTransfer | None:
    """NIXL's transfers over the run, by its own histograms: how many, bytes and seconds
    each, and the rate they imply (None when the engine exported no timing)."""
    per_url = list((link.nixl or {}).values())
    count = sum(float(v.nixl_transfers or 0) for v in per_url)
    seconds = sum(float(v.nixl_transfer_s or 0) for v in per_url)
    moved = sum(float(v.nixl_bytes or 0) for v in per_url)
    if not count or not seconds:
        return None
    return NixlTransfer(transfers=count, bytes_per_transfer=round(moved / count, 1),
                        seconds_per_transfer=round(seconds / count, 6),
                        gbit_per_s=round(moved * 8 / seconds / 1e9, 3))


def bytes_three_ways(link: LinkRecord | None, rows: dict[int, LoadRecord], levels: list[int],
                     kv_bytes_per_token: float | None, prompt_tokens: float | None) -> Bytes:
    """Arithmetic prediction against interface, RDMA and NIXL bytes, per request."""
    out = Bytes()
    if prompt_tokens:
        out.prompt_tokens, out.prompt_tokens_from = prompt_tokens, "flag"
    else:
        out.prompt_tokens = _mean_prompt_tokens(rows, levels)
        out.prompt_tokens_from = "server usage" if out.prompt_tokens else None
    if kv_bytes_per_token and out.prompt_tokens:
        out.predicted = kv_bytes_per_token * out.prompt_tokens
    # the link's counters ran over every request sent, each level's warm-up included
    requests = sum(rows[lv].requests + (rows[lv].warmup_requests or 0) for lv in levels)
    if link is None or not requests:
        return out
    if link.rx_bytes is not None and link.tx_bytes is not None:
        out.observed["iface"] = max(link.rx_bytes, link.tx_bytes) / requests
    if link.rdma is not None:
        out.observed["rdma"] = max(link.rdma.rx_bytes, link.rdma.tx_bytes) / requests
    nixl = _nixl_total(link)
    if nixl is not None:
        out.observed["nixl"] = nixl / requests
        out.transfer = nixl_timing(link)
    if link.store_bytes is not None:
        out.observed["store"] = link.store_bytes / requests
    loaded = _external_tokens(link)
    if connectors.is_shared_store(link.connector) and loaded is not None and kv_bytes_per_token:
        # a shared store is written once per distinct prompt but read by every request that
        # hits it: the tokens decode took from it are the bytes that crossed
        out.observed["store_read"] = loaded * kv_bytes_per_token / requests
    # a shared-directory store moves KV through files: on loopback, the interface counters
    # are only the HTTP around it (and every other local conversation)
    via_store = connectors.is_shared_store(link.connector)
    _verdict(out, iface_blind=via_store and (link.iface or "").startswith("lo"))
    share = _decode_computed_share(link)
    if via_store and share is not None:
        out.decode_computed_share = round(share, 4)
        if share <= 0.5:  # bytes per request undercount a store read once and then cached
            out.verdict, out.verdict_source = DECODE_DID_NOT_PREFILL.format(share=share), \
                "decode's prompt tokens by source"
        elif share >= 0.9:
            out.verdict, out.verdict_source = NOT_CROSSED, "decode's prompt tokens by source"
    return out


def _decode_computed_share(link: LinkRecord) -> float | None:
    """The share of the decodes' prompt tokens they computed themselves (needs the link's
    `legs`; every decode leg of an XpYd split counts)."""
    urls = [u for role, u in (link.legs or {}).items() if leg_of(role)[0] == "decode"]
    found = [(d.get("prompt_tokens_local_compute"), d.get("prompt_tokens"))
             for u in urls if (d := link.metric_deltas.get(u)) is not None]
    pairs = [(float(c), float(t)) for c, t in found if c is not None and t is not None]
    total = sum(t for _, t in pairs)
    return sum(c for c, _ in pairs) / total if pairs and total else None


def _external_tokens(link: LinkRecord) -> float | None:
    """Prompt tokens the engines loaded through the connector during the run."""
    found = [float(loaded) for d in link.metric_deltas.values()
             if (loaded := d.get("prompt_tokens_external_kv_transfer")) is not None]
    return sum(found) if found else None


def _verdict(out: Bytes, iface_blind: bool = False) -> None:
    # NIXL's own count is the most specific; RDMA next; what decode read from a shared store
    # next, then the store's growth; the whole interface last
    sources = [s for s in ("nixl", "rdma", "store_read", "store", "iface") if s in out.observed
               and not (s == "iface" and iface_blind)]
    if out.predicted is None or not sources:
        return
    source = sources[0]
    share = out.observed[source] / out.predicted if out.predicted else 0.0
    out.verdict_source = source
    out.verdict = CROSSED if share >= 0.1 else NOT_CROSSED if share < 0.01 else UNCLEAR
