"""The labs' table rows, once: which label's lines fill each, what the row is called, its side
of a pair, and which startup lines belong to it.

Experiments write their lines under these labels, the report reads each row by them, the plots
and the CLI's `--part` filters pick by them; nothing else spells a label that ties an
experiment to its report row. A row's capacity search writes its lines under
`capacity_label(row.label)` (`loadgen/capacity.py` names every search so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvlab.records.base import LAB_OFFLOAD, LAB_PD

Side = Literal["off", "on", "split", "baseline", "candidate", "one"]
CAPACITY_SUFFIX = "-capacity"


def capacity_label(label: str) -> str:
    """The label a capacity search of `label`'s load writes its lines under."""
    return label + CAPACITY_SUFFIX


@dataclass(frozen=True)
class Row:
    """One row of a lab's "Expected outcome" table, or a line a row reads beside its own."""

    label: str
    lab: str
    title: str
    how: str = ""
    side: Side = "one"
    startup: tuple[str, ...] = ()  # labels of the startup lines of its engines ("": its own)
    pressure: bool = False  # a load run under pressure (`run offload --part pressure`)
    command: str = ""  # the kvlab command that measures the row

    @property
    def capacity(self) -> str:
        return capacity_label(self.label)

    def capacity_row(self) -> Row:
        """The row's capacity search, as a row of its own (for a not-run line)."""
        return Row(self.capacity, self.lab, f"{self.title}: the most load at the target",
                   self.how, self.side, self.startup, self.pressure, self.command)

    def starts(self, label: str) -> bool:
        """Whether a startup line of `label` belongs to this row's engines."""
        return label == self.label or label in self.startup


# --- the offload lab -----------------------------------------------------------------------
QUIET_OFF = Row("offload-off", LAB_OFFLOAD, "None, quiet server", "turns of one conversation, "
                "one instance", side="off",
    command="kvlab run offload --part quiet --tier off")
QUIET_ON = Row("offload-on", LAB_OFFLOAD, "Host memory, quiet server", "turns of one "
               "conversation, one instance", side="on",
    command="kvlab run offload --part quiet --tier on")
PRESSURE_OFF = Row("offload-off-load", LAB_OFFLOAD, "None, cache under pressure",
                   "load generator under pressure", side="off", startup=("offload-off",),
                   pressure=True,
    command="kvlab run offload --part pressure")
PRESSURE_ON = Row("offload-on-load", LAB_OFFLOAD, "Host memory, cache under pressure",
                  "load generator under pressure", side="on", startup=("offload-on",),
                  pressure=True,
    command="kvlab run offload --part pressure")
# the shared-first-block control (`experiments/tier_why.py`): the pressure pair's sessions with
# each conversation's own opening, on the same engines; read beside the pair, not a row of its own
PRESSURE_OFF_DISTINCT = Row("offload-off-load-distinct", LAB_OFFLOAD,
                            "None, under pressure, no block shared across conversations",
                            "the pressure sessions, each conversation's own first block",
                            side="off", startup=("offload-off",), pressure=True,
                            command="kvlab run offload --part pressure --why")
PRESSURE_ON_DISTINCT = Row("offload-on-load-distinct", LAB_OFFLOAD,
                           "Host memory, under pressure, no block shared across conversations",
                           "the pressure sessions, each conversation's own first block",
                           side="on", startup=("offload-on",), pressure=True,
                           command="kvlab run offload --part pressure --why")
COPY_RATE = Row("copy-rate", LAB_OFFLOAD, "The machine's copy rate under the host tier",
                "the engine's framework copying a pinned host buffer into the device",
                command="kvlab run offload --part pressure --why")
SMALLER_ON = Row("offload-on-load", LAB_OFFLOAD,
                 "Host memory smaller than the working set, under pressure",
                 "load generator under pressure", side="on", startup=("offload-on",),
                 pressure=True,
    command="kvlab run offload --part pressure --tier-gb N")
OFFLOAD_CURVE = Row("offload-curve-load", LAB_OFFLOAD, "vLLM host tier size curve, under "
                    "pressure", "user sessions, every size's engine started at once",
                    side="on", pressure=True,
    command="kvlab run offload --part curve")
OFFLOAD_BOUNDARY = Row("offload-boundary-load", LAB_OFFLOAD, "vLLM host tier against opening "
                       "length, under pressure", "user sessions at several opening lengths, "
                       "tier off and on", side="on", pressure=True,
                       startup=("offload-curve-load",),  # run on the curve's engines
    command="kvlab run offload --part boundary")


def _store_rows(label: str, title: str, held_by: str, role: str, command: str
                ) -> tuple[Row, Row, Row]:
    """A shared store's three rows: the turns alternating between two instances, the same
    turns on one instance (the control), and the proof cases."""
    return (Row(label, LAB_OFFLOAD, f"{title}, two instances",
                f"turns alternating between the instances{held_by}",
                startup=(f"{role}-a", f"{role}-b"), command=command),
            Row(f"{label}-single", LAB_OFFLOAD, f"{title}, the control",
                "the same turns on one instance", startup=(f"{role}-a",), command=command),
            Row(f"{label}-proof", LAB_OFFLOAD, f"{title}, the proof",
                "cold, identical, changed prefix, growing turns", command=command))


SHARED_STORE, SHARED_SINGLE, SHARED_PROOF = _store_rows(
    "shared-store", "Shared store", "", "shared-store", "kvlab run shared")
SHARED_LMCACHE, SHARED_LMCACHE_SINGLE, SHARED_LMCACHE_PROOF = _store_rows(
    "shared-store-lmcache", "Shared store by prefix (LMCache)", ", one LMCache server",
    "shared-lmcache", "kvlab run shared --store lmcache")
SHARED_FS, SHARED_FS_SINGLE, SHARED_FS_PROOF = _store_rows(
    "shared-store-fs", "Shared store by prefix (vLLM's fs tier)", ", one fs tier directory",
    "shared-fs", "kvlab run shared --store fs")
SHARED_ROWS: dict[str, tuple[Row, Row, Row]] = {
    "shared": (SHARED_STORE, SHARED_SINGLE, SHARED_PROOF),
    "lmcache": (SHARED_LMCACHE, SHARED_LMCACHE_SINGLE, SHARED_LMCACHE_PROOF),
    "fs": (SHARED_FS, SHARED_FS_SINGLE, SHARED_FS_PROOF)}
"""The shared-store lab's rows by the store both instances use (a connector's name):
alternating, the control, the proof."""
DISK = Row("disk", LAB_OFFLOAD, "Disk, llama.cpp slot save and restore",
           "save, erase, restore, timed",
    command="kvlab run disk")
MLX_CACHE = Row("mlx-cache", LAB_OFFLOAD, "Disk, mlx-lm prompt-cache file",
                "prefill, save, load in a new process, timed",
    command="kvlab run mlx-cache")
VLLM_DISK = Row("vllm-disk", LAB_OFFLOAD, "Disk, vLLM's fs tier under the host tier",
                "prefill, restart vLLM, the same prompt from the block files, timed",
                startup=("vllm-disk", "vllm-disk-restart"), command="kvlab run vllm-disk")
MLX_TURNS = Row("mlx-turns", LAB_OFFLOAD, "mlx-lm, prompt cache across turns",
                "turns of one conversation, mlx_lm.server",
    command="kvlab run mlx-cache --part turns")
SHARED_SLOTS = Row("shared-slots", LAB_OFFLOAD, "llama.cpp slot store, two servers",
                   "save on one server, restore on the other",
                   startup=("shared-slots-a", "shared-slots-b"),
    command="kvlab run shared-slots")
# llama.cpp's path through tasks 2 and 3 (`kvlab run llama-tiers`): one llama-server at a time
LLAMA_PROMPT_OFF = Row("llama-prompt-off", LAB_OFFLOAD, "llama.cpp, prompt caching off",
                       "turns of one conversation, one llama-server", side="off",
    command="kvlab run llama-tiers --part turns")
LLAMA_PROMPT_ON = Row("llama-prompt-on", LAB_OFFLOAD, "llama.cpp, prompt caching on",
                      "turns of one conversation, one llama-server", side="on",
    command="kvlab run llama-tiers --part turns")
LLAMA_RAM_OFF = Row("llama-ram-off-load", LAB_OFFLOAD, "llama.cpp, no RAM cache, slots under "
                    "pressure", "user sessions on few slots", side="off", pressure=True,
    command="kvlab run llama-tiers --part pressure")
LLAMA_RAM_ON = Row("llama-ram-on-load", LAB_OFFLOAD, "llama.cpp RAM cache (host tier), slots "
                   "under pressure", "user sessions on few slots", side="on", pressure=True,
    command="kvlab run llama-tiers --part pressure")
LLAMA_RAM_SMALL = Row("llama-ram-small-load", LAB_OFFLOAD, "llama.cpp RAM cache smaller than "
                      "the working set, under pressure", "user sessions on few slots",
                      side="on", pressure=True,
    command="kvlab run llama-tiers --part pressure")
LLAMA_RAM_CURVE = Row("llama-ram-curve-load", LAB_OFFLOAD, "llama.cpp RAM cache size curve, "
                      "under pressure", "user sessions on few slots, one run per size",
                      side="on", pressure=True,
    command="kvlab run llama-tiers --part curve")
LLAMA_KV_QUANT = Row("llama-kv-quant", LAB_OFFLOAD, "llama.cpp quantised KV (q8_0) against "
                     "f16, same memory", "one llama-server per KV type",
                     startup=("llama-kv-f16", "llama-kv-q8_0"),
    command="kvlab run llama-tiers --part quant")

# --- the P/D lab ---------------------------------------------------------------------------
BASELINE = Row("baseline", LAB_PD, "One machine, no split (baseline)", "none", side="baseline",
    command="kvlab run disagg")
SPLIT = Row("disagg", LAB_PD, "Prefill/decode split", side="split",
            startup=("disagg-prefill", "disagg-decode"),
    command="kvlab run disagg")
TWO_MACHINES_SHARED = Row("disagg-two-machines", LAB_PD,
                          "Two machines, shared-directory connector", "house Ethernet",
                          side="split",
    command="kvlab run disagg --cluster ADDRESS")
TWO_MACHINES_NIXL = Row("disagg-nixl", LAB_PD, "Two machines, NixlConnector",
                        "direct RDMA cable", side="split",
    command="CONNECTOR=nixl kvlab run disagg --cluster ADDRESS")
SPLIT_LOOPBACK = Row("disagg-loopback", LAB_PD, "Two processes on one device", "loopback",
               side="split",
    command="kvlab run disagg")
PREDICTION = Row("prediction", LAB_PD, "The prediction, before any run",
    command="kvlab run disagg")
CANCEL = Row("cancel-restart", LAB_PD,
             "A request cancelled mid-stream, then the decode worker restarted",
             "through the proxy, counters before and after", startup=SPLIT.startup,
    command="kvlab run disagg --part cancel")
BOUNDARY = Row("boundary", LAB_PD, "Long against short prompts: where the split pays",
               "prompt length swept, split against baseline",
    command="kvlab run disagg --part boundary")
BOUNDARY_SPLIT = Row("boundary-split", LAB_PD, "The boundary sweep, split side", side="split",
    command="kvlab run disagg --part boundary")
BOUNDARY_BASELINE = Row("boundary-baseline", LAB_PD, "The boundary sweep, baseline side",
                        side="baseline",
    command="kvlab run disagg --part boundary")
INTERFERENCE = Row("interference", LAB_PD, "llama-server, 4 slots against 1 slot",
                   "one llama-server, --parallel 4 then 1", side="candidate",
    command="kvlab run interference")

REPLICAS = Row("replicas", LAB_PD, "N replicas behind one front, one arm per routing choice",
               "plain vLLM replicas; kvlab's proxy (round-robin, least-outstanding, prefix or "
               "conversation affinity) against vllm-router's policies", side="candidate",
               command="kvlab run replicas")

ROWS: tuple[Row, ...] = (
    QUIET_OFF, QUIET_ON, PRESSURE_OFF, PRESSURE_ON, OFFLOAD_CURVE, OFFLOAD_BOUNDARY,
    SHARED_STORE, SHARED_SINGLE, SHARED_PROOF, SHARED_LMCACHE, SHARED_LMCACHE_SINGLE,
    SHARED_LMCACHE_PROOF, SHARED_FS, SHARED_FS_SINGLE, SHARED_FS_PROOF, DISK, VLLM_DISK, MLX_CACHE,
    MLX_TURNS, SHARED_SLOTS, LLAMA_PROMPT_OFF,
    LLAMA_PROMPT_ON, LLAMA_RAM_OFF, LLAMA_RAM_ON, LLAMA_RAM_SMALL, LLAMA_RAM_CURVE,
    LLAMA_KV_QUANT, BASELINE, SPLIT,
    TWO_MACHINES_SHARED, TWO_MACHINES_NIXL, SPLIT_LOOPBACK, PREDICTION, CANCEL, BOUNDARY,
    BOUNDARY_SPLIT, BOUNDARY_BASELINE, INTERFERENCE, REPLICAS,
)


PROXY_LABEL = f"{SPLIT.label}-proxy"  # the startup line of kvlab's proxy in front of a split


def serve_label(role: str, host_tier: bool) -> str:
    """The label of a startup line of `kvlab serve ROLE`: the seed's name for the offload
    role (`offload-off`, `offload-on`: the quiet rows' labels), else the role."""
    if role == "offload":
        return (QUIET_ON if host_tier else QUIET_OFF).label
    return role


def interference_label(parallel: int) -> str:
    """The load label of the interference run with `parallel` slots."""
    return f"{INTERFERENCE.label}-parallel-{parallel}"


def comparison_label(disagg: str, baseline: str) -> str:
    """The label of the comparison line that pairs two labels' load rows."""
    return f"{disagg}-vs-{baseline}"


def replicas_label(label: str, arm: str, prompt_set: str) -> str:
    """The lines of one arm of `kvlab run replicas` on one prompt set."""
    return f"{label}-{arm.replace(':', '-')}-{prompt_set}"


def prediction_label(split_label: str) -> str:
    """The prediction line of a split run labelled `split_label`."""
    return PREDICTION.label if split_label == SPLIT.label else f"{PREDICTION.label}-{split_label}"


LEG_SIDES = ("prefill", "decode")


def leg_role(side: str, index: int) -> str:
    """The role of a split's `index`-th engine on `side` (XpYd: PREFILL_HOSTS, DECODE_HOSTS):
    the first keeps the side's name, so a 1P1D split is named as before; the others are
    numbered from 2 (`prefill-2`)."""
    return side if index == 0 else f"{side}-{index + 1}"


def leg_of(role: str) -> tuple[str, int]:
    """`prefill-2` -> (`prefill`, 1); any other role -> (role, 0)."""
    side, _, number = role.rpartition("-")
    if side in LEG_SIDES and number.isdigit() and int(number) >= 2:
        return side, int(number) - 1
    return role, 0


def leg_roles(prefills: int, decodes: int) -> tuple[str, ...]:
    """A split's engine roles, every prefill then every decode."""
    return (*(leg_role("prefill", i) for i in range(prefills)),
            *(leg_role("decode", i) for i in range(decodes)))


def row_of(label: str) -> Row | None:
    """The row a record of `label` measures, if it is one of the labs' rows."""
    return next((row for row in ROWS if row.label == label), None)


def row_of_startup(label: str) -> Row | None:
    """The row whose engines a startup line of `label` belongs to, if any."""
    return next((row for row in ROWS if row.startup and label in row.startup), None)
