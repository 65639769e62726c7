"""What a running llama-server's slot files depend on, read from the server itself.

A slot file holds one sequence's KV cells as the server's cache lays them out: its K and V
types, the V layout flash attention chose, and the cache's stream count (one stream per slot,
or one for all slots with a unified cache), which llama.cpp checks on restore (`n_stream
mismatch`). kvlab's settings cannot say these for a server it did not start, nor how the build
resolved `-fa auto`, so each fact is read, in this order, from:

- the server's startup log, when kvlab knows it: `load_model: initializing, n_slots = 2,
  n_ctx_slot = 1024, kv_unified = 'false'` at any verbosity; at debug verbosity (`-lv 4`) also
  the KV cache line (`llama_kv_cache: size = ... (N cells, L layers, S/T seqs), K (q8_0): ...,
  V (q8_0): ...`, T the streams) and `Flash Attention was auto, set to enabled`;
- the command line of the process listening on the server's port, when it runs here: `-ctk`,
  `-ctv` (f16 when absent), `-fa on|off` (`auto` is the build's to resolve), `-kvu`; the stream
  count follows from `-kvu` and `--parallel` (no `--parallel`: one stream, whether the build
  gives one slot or its automatic unified cache);
- else "unknown", which no check refuses on: llama.cpp then checks the file itself, and its
  log's reason is what kvlab says when it refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from kvlab.engines.argv import flag_value

UNKNOWN = "unknown"
KV_CACHE_LINE = re.compile(
    r"llama_kv_cache: size =.*?\(\s*\d+ cells,\s*\d+ layers,\s*(\d+)/(\d+) seqs\),"
    r"\s*K \((\w+)\):.*?V \((\w+)\)")
FA_RESOLVED = re.compile(r"Flash Attention was \w+, set to (enabled|disabled)")
FA_PARAM = re.compile(r"\bflash_attn\s*=\s*(\w+)")
KV_UNIFIED = re.compile(r"\bkv_unified\s*=\s*'?(true|false)")
UNIFIED_FLAGS = ("-kvu", "--kv-unified")
PARALLEL_FLAGS = ("-np", "--parallel")
_ON = {"on": "on", "enabled": "on", "1": "on", "true": "on",
       "off": "off", "disabled": "off", "0": "off", "false": "off"}


@dataclass(frozen=True)
class SlotFacts:
    """The server's facts a slot file depends on; each a value or UNKNOWN."""

    kv_type_k: str = UNKNOWN
    kv_type_v: str = UNKNOWN
    flash_attn: str = UNKNOWN  # on / off, as the build resolved it
    kv_unified: str = UNKNOWN  # true / false
    n_stream: str = UNKNOWN  # the cache's stream count, e.g. "2"
    source: str = ""  # where they were read, in words

    def known(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "source" and getattr(self, f.name) != UNKNOWN}


def from_log(text: str) -> dict[str, str]:
    """The facts a startup log states (its last start's, where it holds several)."""
    out: dict[str, str] = {}
    if lines := KV_CACHE_LINE.findall(text):
        _, streams, k, v = lines[-1]
        out |= {"n_stream": streams, "kv_type_k": k, "kv_type_v": v}
    if resolved := FA_RESOLVED.findall(text):
        out["flash_attn"] = _ON[resolved[-1]]
    elif (asked := FA_PARAM.findall(text)) and asked[-1].lower() in _ON:
        out["flash_attn"] = _ON[asked[-1].lower()]
    if unified := KV_UNIFIED.findall(text):
        out["kv_unified"] = unified[-1]
    return out


def from_argv(argv: list[str], slots: int) -> dict[str, str]:
    """The facts a llama-server command line fixes; `slots` is /props' slot count."""
    out = {"kv_type_k": flag_value(argv, "-ctk", "--cache-type-k") or "f16",
           "kv_type_v": flag_value(argv, "-ctv", "--cache-type-v") or "f16"}
    fa = flag_value(argv, "-fa", "--flash-attn")
    if fa is not None and fa.lower() in _ON:
        out["flash_attn"] = _ON[fa.lower()]
    if any(a in UNIFIED_FLAGS for a in argv):
        out |= {"kv_unified": "true", "n_stream": "1"}
    elif flag_value(argv, *PARALLEL_FLAGS) is None:
        out["n_stream"] = "1"
    elif slots:  # --parallel N without -kvu: one stream per slot
        out |= {"kv_unified": "false", "n_stream": str(slots)}
    return out


def read(log_text: str | None, argv: list[str] | None, slots: int) -> SlotFacts:
    """The facts, the log's first, then the command line's; the rest UNKNOWN."""
    logged = from_log(log_text) if log_text else {}
    if "n_stream" not in logged and logged.get("kv_unified") == "true":
        logged["n_stream"] = "1"
    elif "n_stream" not in logged and logged.get("kv_unified") == "false" and slots:
        logged["n_stream"] = str(slots)
    ran = from_argv(argv, slots) if argv else {}
    found = {**ran, **logged}
    said = [w for w, part in (("its log", logged), ("its command line", ran)) if part]
    source = " and ".join(said) if said else "nothing readable (its log unknown, not on " \
        "this machine)"
    return SlotFacts(**found, source=f"read from {source}")
