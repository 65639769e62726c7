"""One pydantic model per notebook record kind: what writers build and readers parse.

Every line kvlab writes is one of these, serialised by `notebook.append`. The envelope (`lab`,
`record`, `label`, `recorded_at`, `kvlab_version`, `schema`, `run_id`) is common; each kind
names the fields the seed scripts write or read (their names are kept, so `compare-disagg.py`
and `measure-reuse.py` read kvlab's lines) and the evidence kvlab adds. Nested evidence that
only its writer and the report interpret stays an open mapping; `extra="allow"` keeps fields a
newer kvlab or a seed script added, so reading an old or foreign notebook never fails.

Readers go through `parse`, which picks the model by the `record` field (a seed load row has
none: it is recognised by its concurrency and TTFT percentiles) and falls back to the bare
envelope for anything it cannot validate, counting it rather than failing.
"""

from __future__ import annotations

import copy
import time
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from kvlab import SCHEMA, __version__

LAB_OFFLOAD = "part-22/lab-kv-cache-offload-and-sharing"
LAB_PD = "part-22/lab-two-machine-prefill-decode"

Json = dict[str, Any]


def now_stamp() -> str:
    """Local time with offset, the seed scripts' `%Y-%m-%dT%H:%M:%S%z` format."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Percentiles(BaseModel):
    """A latency distribution in seconds, as the seed's load rows carry it."""

    model_config = ConfigDict(extra="allow")

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    std: float | None = Field(None, description="Sample standard deviation (n - 1).")
    n: int | None = Field(None, description="How many values the percentiles are of.")


class Record(BaseModel):
    """The envelope every notebook line carries."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    kind: ClassVar[str] = ""

    lab: str = Field(description="Which lab the line belongs to.")
    record: str = Field(description="The record kind.")
    label: str = Field(description="The run's label, as the seed scripts use it.")
    recorded_at: str = Field(default_factory=now_stamp)
    kvlab_version: str = __version__
    schema_version: int = Field(SCHEMA, alias="schema")
    run_id: str | None = Field(None, description="The `kvlab run` that wrote it, if any.")

    _line: Json | None = PrivateAttr(None)

    def line(self) -> Json:
        """The JSON object written to the notebook (seed field names, `schema` by its alias)."""
        if self._line is None:
            out = self.model_dump(by_alias=True, mode="json")
            if out.get("run_id") is None:
                out.pop("run_id", None)
            self._line = out
        return copy.deepcopy(self._line)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name != "_line":
            self._line = None  # the line is cached; a changed field makes it stale

    def with_fields(self, **fields: Any) -> Self:
        """A copy with fields added or replaced, validated again."""
        return self.model_validate({**self.line(), **fields})

    def get(self, key: str, default: Any = None) -> Any:
        """A field or extra field by its notebook name, as the line holds it."""
        self.line()
        assert self._line is not None
        return copy.deepcopy(self._line.get(key, default))

    def __contains__(self, key: object) -> bool:
        self.line()
        assert self._line is not None
        return key in self._line

    def __getitem__(self, key: str) -> Any:
        """Read a record as its notebook line: `row["ttft_s"]["p50"]`."""
        self.line()
        assert self._line is not None
        return copy.deepcopy(self._line[key])


class StartupRecord(Record):
    """What an instance said about its KV capacity as it started."""

    kind: ClassVar[str] = "startup"
    record: Literal["startup"] = "startup"
    engine: str
    engine_version: str = "unknown"
    role: str
    model: str = ""
    served_name: str = ""
    base_url: str = ""
    argv: list[str] = Field(default_factory=list)
    ready_s: float | None = None
    capacity: Json = Field(default_factory=dict)
    context_tokens: int | None = Field(None, description="The context length it was started "
                                       "with (vLLM's --max-model-len, llama.cpp's --ctx-size).")
    memory_fraction: float | None = Field(None, description="vLLM's --gpu-memory-utilization.")
    engine_choice: Json | None = Field(None, description="Which build ran (command, origin: "
                                       "VLLM_CMD, PATH or kvlab venv, platform) and why.")
    added_flags: list[str] | None = Field(None, description="Flags kvlab passed beyond the "
                                          "seed script's, the same on every compared role.")
    memory_kind: str | None = Field(None, description="unified (the GPU's memory is the "
                                    "host's), discrete, none (CPU build) or unknown.")
    host_memory: Json | None = Field(None, description="The host tier against available "
                                     "memory and swap, in bytes, as checked before start.")
    side_channel: Json | None = Field(None, description="NIXL's side-channel address and "
                                      "port, what it resolves to, and its interface.")
    node: Json | None = Field(None, description="The Ray node it ran on (kvlab run --cluster): "
                              "node id, host name, address, machine id, interface, link speed.")


class ReuseRow(BaseModel):
    """One turn of a conversation (measure-reuse.py's row, kvlab's evidence added)."""

    model_config = ConfigDict(extra="allow")

    turn: int
    endpoint: str
    ttft_s: float | None = None
    total_s: float | None = None
    chunks: int | None = None


class ReuseRecord(Record):
    """The seed's measure-reuse.py record: a growing conversation, TTFT per turn."""

    kind: ClassVar[str] = "reuse"
    record: Literal["reuse"] = "reuse"
    model: str | None = None
    endpoints: list[str] = Field(default_factory=list)
    turns: int | None = None
    preamble_words: int | None = None
    max_tokens: int | None = None
    rows: list[ReuseRow] = Field(default_factory=list)
    metric_deltas: dict[str, Json] = Field(default_factory=dict)
    note: str | None = None
    nonce: str | None = Field(None, description="The run's own opening (kvlab reuse): no "
                              "earlier run's cache can serve its turn 1.")
    fitted: Json | None = Field(None, description="The preamble fitted to the served context "
                                "in the model's own tokens: words asked and used, context, the "
                                "last turn's estimated prompt tokens, how they were counted.")


class ProofRecord(Record):
    """`kvlab prove`: cold, identical, changed-prefix control, each with its verdict."""

    kind: ClassVar[str] = "proof"
    record: Literal["proof"] = "proof"
    model: str
    endpoints: list[str]
    cases: list[Json]
    verdicts: dict[str, str | None]
    explanations: list[str] = Field(default_factory=list)
    note: str = ""


class Placement(BaseModel):
    """Where a load or link row's engines ran: what the report places the row by."""

    topology: str | None = Field(None, description="loopback (prefill and decode on one "
                                 "machine), two machines, one instance or unknown.")
    single_machine: bool | None = Field(None, description="Prefill, decode and proxy on one "
                                        "machine (None: not known).")
    hosts: dict[str, str] | None = Field(None, description="Host by role (prefill, decode, "
                                         "proxy), as written; unknown where not known.")
    link: str | None = Field(None, description="What the KV crossed: loopback, the cluster "
                             "interface, or unknown.")
    topology_from: str | None = Field(None, description="How the topology was known.")
    placement: str | None = Field(None, description="Who placed the processes: local (kvlab, "
                                  "on this machine), ray (kvlab, on Ray nodes) or manual.")
    nodes: dict[str, Json] | None = Field(None, description="Ray only: per role, the node id, "
                                          "host name, address, machine id, interface holding "
                                          "the address and its link speed.")
    same_machine: bool | None = Field(None, description="Prefill and decode on one machine "
                                      "(Ray: by machine id); None when not known.")
    link_speed_mbps: int | None = Field(None, description="Link speed of the interface that "
                                        "carried the split's traffic, Mb/s, where known.")
    node_counters: dict[str, Json] | None = Field(None, description="Ray only: per role, that "
                                                  "node's interface, RDMA and store byte "
                                                  "deltas (a load row: since the previous "
                                                  "level ended; a link row: the whole run).")


class LoadRecord(Record, Placement):
    """One load-generator level (the seed's load-test.py row, as compare-disagg.py reads it)."""

    kind: ClassVar[str] = "load"
    record: Literal["load"] = "load"
    concurrency: int
    requests: int
    model: str | None = None
    prompt_set: str | None = None
    max_tokens: int | None = None
    ttft_s: Percentiles | None = None  # None when no request of the level succeeded
    tpot_s: Percentiles | None = None
    itl_s: Percentiles | None = None
    e2e_s: Percentiles | None = None
    output_tokens_per_s: float | None = None
    ok: int | None = None
    failed: int | None = None
    prompt_tokens_mean: float | None = None
    metric_deltas: Json = Field(default_factory=dict, description="The engine's evidence "
                                "counters over the level, by name.")
    requests_file: str | None = Field(None, description="The level's per-request file, "
                                      "relative to the notebook's folder.")
    requests_sha256: str | None = Field(None, description="That file's sha256.")
    warmup_requests: int | None = Field(None, description="Requests sent first and left out "
                                        "of every statistic.")
    repeat: int | None = Field(None, description="Which repeat of the run (0-based).")
    connector: str | None = Field(None, description="The split's connector (CONNECTOR).")
    workload: Json | None = Field(None, description="The workload's kind (prompt set, "
                                  "sessions, trace) and its level: users, think time, "
                                  "arrivals; a trace's in-flight cap.")
    sessions: Json | None = Field(None, description="User sessions: conversations, "
                                  "returning turns, how many came back after eviction, the "
                                  "working set, the eviction rule and its cache block.")
    trace: Json | None = Field(None, description="A replayed trace: path, sha256, requests, "
                               "block size, speed-up, what an infinite cache would reuse.")
    capacity_probe: Json | None = Field(None, description="A capacity search's probe: the "
                                        "knob, its load, the step.")


class LinkRecord(Record, Placement):
    """run-load.sh's interface counters around one load run."""

    kind: ClassVar[str] = "link"
    record: Literal["link"] = "link"
    base_url: str | None = None
    connector: str | None = None
    context_length: int | None = None
    prompt_set: str | None = None
    concurrency: str | int | None = None
    requests: int | None = None
    iface: str | None = None
    wall_s: float | None = None
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rdma: Json | None = None
    store_bytes: int | None = None
    legs: dict[str, str] | None = Field(None, description="The proxy's upstreams by role.")
    metric_deltas: dict[str, Json] = Field(default_factory=dict,
                                           description="Each engine's evidence deltas, by URL.")
    nixl: dict[str, Json] | None = Field(None, description="NIXL's own counters, by URL.")
    side_channel: Json | None = Field(None, description="NIXL/Mooncake: the interface "
                                      "SIDE_CHANNEL_ADDR is on, every interface's bytes over "
                                      "the run, and which network the run crossed.")


class ComparisonRecord(Record):
    """compare-disagg.py's record: two labels' load rows paired level by level."""

    kind: ClassVar[str] = "comparison"
    record: Literal["comparison"] = "comparison"
    disagg_label: str | None = None
    baseline_label: str | None = None
    levels: list[Json] = Field(default_factory=list, description="Per shared level: both "
                               "sides' figures and, under `intervals`, each metric's ratio "
                               "with its 95% interval and words.")
    interval_method: Json | None = Field(None, description="How the intervals were drawn: "
                                         "confidence, resamples, seed, scheme.")


class PredictionRecord(Record):
    """The P/D lab's prediction, written before any run."""

    kind: ClassVar[str] = "prediction"
    record: Literal["prediction"] = "prediction"
    model: str | None = None
    prompt_tokens: int | None = None
    bytes_per_token: float | None = None


class CrossingRecord(Record):
    """`kvlab proxy --check`: did one request cross both legs of the split."""

    kind: ClassVar[str] = "crossing"
    record: Literal["crossing"] = "crossing"
    crossed: bool
    reasons: list[str] = Field(default_factory=list)


class NotRunRecord(Record):
    """A lab row that cannot be measured on this machine, and why."""

    kind: ClassVar[str] = "not-run"
    record: Literal["not-run"] = "not-run"
    row: str
    reason: str


class DiskRecord(Record):
    """llama.cpp slot save and restore, timed against a cold prefill."""

    kind: ClassVar[str] = "disk"
    record: Literal["disk"] = "disk"
    engine: str
    model: str
    prompt_tokens: int
    cold_ttft_s: float | None = None
    save_ms: float | None = None
    restore_ms: float | None = None
    verdict: str
    reasons: list[str] = Field(default_factory=list)


class ProcedureRecord(Record):
    """A P/D lab procedure step, checked (`kvlab run disagg --part cancel`)."""

    kind: ClassVar[str] = "procedure"
    record: Literal["procedure"] = "procedure"
    step: str = Field(description="cancel-restart: a request cancelled mid-stream through the "
                      "proxy, then the decode worker restarted.")
    verdict: Literal["pass", "fail"]
    checks: list[Json] = Field(default_factory=list, description="Each check in order: name, "
                               "passed, detail (the figures that decided it).")
    failed: list[str] = Field(default_factory=list, description="Names of the failed checks.")
    evidence: Json = Field(default_factory=dict, description="The raw figures the checks read.")


class BoundaryPointRecord(Record):
    """One prompt length on one side of the long- against short-prompt sweep."""

    kind: ClassVar[str] = "boundary-point"
    record: Literal["boundary-point"] = "boundary-point"
    side: Literal["split", "baseline"]
    prompt_tokens_target: int = Field(description="The length swept to, in the model's tokens.")
    concurrency: int
    requests: int
    ok: int | None = None
    failed: int | None = None
    prompt_tokens_mean: float | None = Field(None, description="The server's own count.")
    max_tokens: int | None = None
    ttft_s: Percentiles | None = None  # None when no request at this length succeeded
    metric_deltas: Json = Field(default_factory=dict)


class BoundaryRecord(Record):
    """Where the split starts or stops paying in TTFT, found by sweeping the prompt length."""

    kind: ClassVar[str] = "boundary"
    record: Literal["boundary"] = "boundary"
    concurrency: int
    verdict: Literal["pays-above", "pays-below", "pays-everywhere", "pays-nowhere", "mixed",
                     "not-enough-evidence"]
    statement: str
    crossing_tokens: float | None = Field(None, description="Where the split/baseline TTFT "
                                          "p50 ratio crosses 1.0 (interpolated), if once.")
    points: list[Json] = Field(default_factory=list, description="Per length: target, both "
                               "sides' TTFT p50 and prompt tokens, the ratio.")


class CapacityRecord(Record):
    """The highest load that met a latency target (`kvlab load --find-capacity`)."""

    kind: ClassVar[str] = "capacity"
    record: Literal["capacity"] = "capacity"
    knob: Literal["rate", "concurrency", "users", "speedup"] = Field(
        description="What was raised: requests/s (open loop), concurrent requests, users "
        "(sessions), or a trace's replay speed.")
    unit: str
    target: Json = Field(description="The target: `slo` as written, each bound in seconds, "
                         "the share of requests that may fail.")
    capacity: float | None = Field(None, description="The highest load that met the target "
                                   "below the lowest that missed it (None: none met it).")
    met_below: float | None = None
    missed_at: float | None = Field(None, description="The lowest load that missed it.")
    verdict: Literal["found", "not-converged", "at-least", "none-met"]
    statement: str
    steps: list[Json] = Field(default_factory=list, description="Every probe in order: its "
                              "load, met or not and why, each bound's percentile with its 95% "
                              "interval, its per-request files.")
    method: Json = Field(default_factory=dict)
    model: str | None = None
    base_url: str | None = None
    prompt_set: str | None = None
    max_tokens: int | None = None
    workload: Json | None = None
    not_monotonic: list[float] | None = Field(None, description="Loads that met the target "
                                              "above one that missed it.")


KINDS: tuple[type[Record], ...] = (
    StartupRecord, ReuseRecord, ProofRecord, LoadRecord, LinkRecord, ComparisonRecord,
    PredictionRecord, CrossingRecord, NotRunRecord, DiskRecord, ProcedureRecord,
    BoundaryPointRecord, BoundaryRecord, CapacityRecord,
)
BY_KIND: dict[str, type[Record]] = {cls.kind: cls for cls in KINDS}


def build(kind: str, label: str, lab: str, **fields: Any) -> Record:
    """A record of `kind`, validated by that kind's model (a kind kvlab does not know gets the
    bare envelope)."""
    return BY_KIND.get(kind, Record).model_validate(
        {"record": kind, "label": label, "lab": lab, **fields})


def model_for(obj: Json) -> type[Record] | None:
    """The model a notebook object should parse as (None: not a kvlab-shaped record)."""
    kind = obj.get("record")
    if isinstance(kind, str):
        return BY_KIND.get(kind, Record)
    if "concurrency" in obj and isinstance(obj.get("ttft_s"), dict):
        return LoadRecord  # a seed load-test.py row: no `record` field
    return None


def parse(obj: Json) -> Record | None:
    """A notebook object as its typed record; None if it is not one kvlab can read."""
    cls = model_for(obj)
    if cls is None:
        return None
    data = obj if "record" in obj else {"record": cls.kind, **obj}
    data = {"lab": "", "label": "", **data}
    try:
        return cls.model_validate(data)
    except ValidationError:
        try:
            return Record.model_validate(data)
        except ValidationError:
            return None


def json_schemas() -> dict[str, Json]:
    """Each record kind's JSON Schema, by kind (`kvlab schema` prints them)."""
    return {cls.kind: cls.model_json_schema(by_alias=True) for cls in KINDS}
