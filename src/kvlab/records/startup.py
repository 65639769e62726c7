"""The `startup` line: what an instance said about its KV capacity as it started, and what
kvlab chose while planning it (the build and why, the flags beyond the seed script's, the host
figures it checked), or, for an engine kept from an earlier experiment of the pass, the reset
that proved its cache empty.

It holds no figure of a load run (`load.py`) and no reuse measured through the engine
(`reuse.py`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from kvlab.records.base import Record, Strict
from kvlab.records.evidence import EngineArgs, KvCapacity, NodeInfo


class EngineChoice(Strict):
    """Which build of an engine ran, from where, and why."""

    command: str
    origin: str = Field(description="VLLM_CMD, PATH or the kvlab venv.")
    platform: str
    reason: str


class HostTierCheck(Strict):
    """The host tier against available memory and swap, as checked before start (bytes)."""

    tier_bytes: int
    available_bytes: int
    swap_free_bytes: int
    engine_share_bytes: int
    fits: bool
    allowed_by: str | None = None


class SideChannelAddress(Strict):
    """NIXL's side-channel address and port as started, and what it resolves to."""

    addr: str | None = None
    port: int | None = None
    resolves_to: list[str] = Field(default_factory=list)
    iface: str | None = None
    cluster_iface: str | None = None
    note: str | None = Field(None, description="What is wrong with the address, if anything.")


class DevicePlanned(Strict):
    """The engine's part of a device it shares with other engines, as planned before the
    start (bytes): its KV cache (vLLM's --kv-cache-memory-bytes, which skips the memory
    profile engines starting together would spoil for each other) and what the plan counted
    beside it, how the engines were started and why."""

    start: Literal["together", "one at a time"] = Field(
        description="Started at once with the others, or each after the last was ready.")
    engines: int = Field(description="Engines on the device at once.")
    device_bytes: int = Field(description="The device's memory, as nvidia-smi says it (host "
                              "memory available, for a CPU build).")
    share_fraction: float = Field(description="Its share of the device, as the engine was "
                                  "given it (vLLM's --gpu-memory-utilization).")
    cache_bytes: int
    weights_bytes: int
    activation_bytes: int = Field(description="Its largest forward pass's activations.")
    graph_bytes: int = Field(description="A reserve for CUDA graphs (0: eager).")
    fixed_bytes: int = Field(description="Its context and memory outside the allocator.")
    why: str = Field(description="The plan's reason, in a sentence.")
    retried_after: str | None = Field(None, description="Set when this start retried one that "
                                      "failed for memory: that failure, in the engine's words.")


class StartupFacts(Strict):
    """What kvlab chose while planning an instance: the build and why, the flags beyond the seed
    script's, the host figures it checked."""

    engine_choice: EngineChoice | None = None
    added_flags: list[str] | None = Field(None, description="Flags kvlab passed beyond the "
                                          "seed script's, the same on every compared role.")
    memory_kind: str | None = Field(None, description="unified (the GPU's memory is the "
                                    "host's), discrete, none (CPU build) or unknown.")
    host_memory: HostTierCheck | None = None
    side_channel: SideChannelAddress | None = None
    visible_devices: str | None = Field(None, description="The cards it was given "
                                        "(PREFILL_DEVICES/DECODE_DEVICES), as the variable set.")
    device_plan: DevicePlanned | None = Field(None, description="Its planned part of a "
                                              "device other engines share.")


class ResetProbe(Strict):
    """The check that a kept engine's prefix cache was emptied before it served another
    experiment: one prompt sent twice (the second must hit, or a miss would prove nothing),
    the cache reset, the prompt again (it must miss)."""

    method: str = Field(description="The reset as sent, e.g. POST /reset_prefix_cache.")
    prompt_tokens: int = Field(description="The probe prompt's tokens, as the engine counted.")
    cached_before: int = Field(description="Cached tokens of its second send, before the reset.")
    cached_after: int = Field(description="Cached tokens of its send after the reset.")
    reset_s: float = Field(description="Seconds for the whole check, probe and resets.")

    @property
    def ok(self) -> bool:
        return self.cached_before > 0 and self.cached_after == 0


class EngineReuse(Strict):
    """This startup line's engine was not started for it: it is the one the line labelled
    `started_as` started earlier in the pass, kept with an identical plan and reset."""

    started_as: str
    start_ready_s: float | None = Field(None, description="That start's time to ready: what "
                                        "this reuse saved.")
    probe: ResetProbe


class StartupRecord(Record, StartupFacts):
    """What an instance said about its KV capacity as it started."""

    kind: ClassVar[str] = "startup"
    record: Literal["startup"] = "startup"
    engine: str
    engine_version: str = "unknown"
    version_note: str | None = Field(None, description="Said when the engine is not the "
                                     "build kvlab's facts for it are pinned for.")
    role: str
    model: str = ""
    served_name: str = ""
    base_url: str = ""
    argv: list[str] = Field(default_factory=list)
    ready_s: float | None = None
    capacity: KvCapacity = Field(default_factory=KvCapacity)
    context_tokens: int | None = Field(None, description="The context length it was started "
                                       "with (vLLM's --max-model-len, llama.cpp's --ctx-size).")
    memory_fraction: float | None = Field(None, description="vLLM's --gpu-memory-utilization.")
    node: NodeInfo | None = Field(None, description="The Ray node it ran on.")
    instance: str | None = Field(None, description="Its process's identity on this machine "
                                 "(session and start time): the key a load row that "
                                 "measured it finds this line by.")
    engine_args: EngineArgs | None = Field(None, description="Its effective arguments as the "
                                           "engine logged them at start, else its argv.")
    reused: EngineReuse | None = Field(None, description="Set when the engine was kept from "
                                       "an earlier experiment of the pass and reset, not "
                                       "started: ready_s is then the reset's check.")
    start_batch: str | None = Field(None, description="Shared by the engines started "
                                    "together (their starts overlapped: the run's time in "
                                    "starts counts the batch's longest time to ready once).")
