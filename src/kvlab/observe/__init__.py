"""Evidence read from outside the workload: engine /metrics, the chat client and its streamed
chunks, fingerprints, interface byte counters.

This module is the package's surface: other packages import observe's names (and the
`fingerprint`, `metrics` and `netdev` modules) from here, never from its other modules.
"""

from kvlab.observe import fingerprint, metrics, netdev
from kvlab.observe.chat import (
    LOGPROB_TOLERANCE,
    ChatResult,
    chat_body,
    logprob_gap,
    stream_chat,
)
from kvlab.observe.fingerprint import Fingerprint
from kvlab.observe.metrics import CounterTable, GaugeTable, Snapshot, hit_rate
from kvlab.observe.netdev import RdmaPort
from kvlab.observe.sampler import sampling
from kvlab.observe.sse import carries, chunk, data_of, timeline_of

__all__ = [
    "LOGPROB_TOLERANCE",
    "ChatResult",
    "CounterTable",
    "Fingerprint",
    "GaugeTable",
    "RdmaPort",
    "Snapshot",
    "carries",
    "chat_body",
    "chunk",
    "data_of",
    "fingerprint",
    "hit_rate",
    "logprob_gap",
    "metrics",
    "netdev",
    "sampling",
    "stream_chat",
    "timeline_of",
]
