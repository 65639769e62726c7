"""llama-server's in-RAM prompt cache (`--cache-ram`), read from the server's own log.

It is llama.cpp's host tier: a slot's prompt is saved there when another conversation takes
the slot, and moved back into a slot when a request matches it better than what the slot
holds. The server logs each save, each load and the cache's state after each update only at
`facts.DEBUG_VERBOSITY`; a run that wants this evidence starts the server at that verbosity.
"""

from __future__ import annotations

from kvlab.engines.llamacpp import facts
from kvlab.records import HostTierUse

SOURCE = "llama-server's log (prompt cache state, saves and loads at --log-verbosity 4)"


def use_in(log_text: str) -> HostTierUse | None:
    """What the RAM cache held and moved in this stretch of log (None: no state logged)."""
    states = [(int(m.group(1)), float(m.group(2)), float(m.group(3)))
              for m in facts.RAM_CACHE_STATE.finditer(log_text)]
    if not states:
        return None
    return HostTierUse(source=SOURCE, limit_bytes=round(states[-1][2] * 2**20),
                       peak_bytes=round(max(s[1] for s in states) * 2**20),
                       peak_entries=max(s[0] for s in states),
                       stores=len(facts.RAM_CACHE_SAVE.findall(log_text)),
                       loads=len(facts.RAM_CACHE_LOAD.findall(log_text)))
