"""The `link` line: run-load.sh's interface counters around one load run (its rx/tx bytes keep
the seed's names and places), with the RDMA ports, NIXL's own counters and each leg of a
split against the prediction.

The load rows of the same run are `load.py`'s; the prediction the legs are set against is
`pd.py`'s.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record, Strict
from kvlab.records.evidence import EngineLine, PerUrl, SideChannel, Where


class RdmaPortDelta(Strict):
    """One RDMA port's bytes over a run."""

    rx_bytes: int
    tx_bytes: int
    units: str
    saturated: bool = Field(description="A 32-bit counter that may have wrapped.")


class RdmaCounters(Strict):
    """RDMA port counters over a run: each port that moved, and their sum."""

    ports: dict[str, RdmaPortDelta] = Field(default_factory=dict)
    rx_bytes: int = 0
    tx_bytes: int = 0
    saturated: bool = False


class NixlCounters(Strict):
    """NIXL's own counters on one engine over a run."""

    nixl_bytes: float | None = None
    nixl_transfers: float | None = None
    nixl_transfer_s: float | None = None
    nixl_failed_transfers: float | None = None


class LegFigures(Strict):
    """One engine of a split over a load run (XpYd: each of them), by its own /metrics and
    against the prediction."""

    role: str = Field(description="prefill, prefill-2, ..., decode, decode-2, ...")
    metrics_url: str
    node: str | None = Field(None, description="Its Ray node (None: where kvlab runs).")
    requests: float | None = Field(None, description="Requests it finished "
                                   "(vllm:request_success delta).")
    prompt_tokens: float | None = None
    computed_tokens: float | None = Field(None, description="Prompt tokens it computed itself.")
    loaded_tokens: float | None = Field(None, description="Prompt tokens it loaded through "
                                        "the connector.")
    predicted_bytes: float | None = Field(None, description="Its requests times the "
                                          "prediction's KV payload per request.")
    observed_bytes: float | None = Field(None, description="KV it moved by its own counters: "
                                         "NIXL's bytes, else its loaded tokens times the "
                                         "prediction's bytes per token.")
    observed_from: str | None = Field(None, description="nixl or loaded_tokens.")


class LinkRecord(Record, Where):
    """run-load.sh's interface counters around one load run."""

    kind: ClassVar[str] = "link"
    record: Literal["link"] = "link"
    base_url: str | None = None
    context_length: int | None = None
    prompt_set: str | None = None
    concurrency: str | int | None = None
    requests: int | None = None
    iface: str | None = None
    wall_s: float | None = None
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rdma: RdmaCounters | None = None
    store_bytes: int | None = None
    legs: dict[str, str] | None = Field(None, description="The proxy's upstreams by role.")
    metric_deltas: PerUrl = Field(default_factory=dict,
                                  description="Each engine's evidence deltas, by URL.")
    nixl: dict[str, NixlCounters] | None = Field(None, description="NIXL's own counters, "
                                                 "by URL.")
    side_channel: SideChannel | None = None
    model: str | None = None
    max_tokens: int | None = None
    load_generator: str | None = None
    repeat: int | None = None
    requests_sent: int | None = None
    requests_ok: int | None = None
    requests_failed: int | None = None
    interrupted: bool | None = None
    engines: list[EngineLine] | None = Field(None, description="The engines the run measured, "
                                             "as on its load rows.")
    per_leg: list[LegFigures] | None = Field(None, description="A split's engines, one entry "
                                             "each: requests and KV bytes per leg.")
