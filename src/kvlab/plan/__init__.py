"""Planning past one machine: how many replicas, which routing, how much host tier, for a
given workload, by simulating N replicas of one measured profile (`kvlab plan`).

`stream` (the requests: a trace or user sessions, with the keys the proxy routes by) ->
`routing` (the policies, as kvlab's proxy and vllm-router choose) -> `simulate` (each
replica's cache, the oracle's LRU, and a queue per replica) -> `answers` (percentiles, the
highest rate, the fewest replicas, what the model leaves out); `args` its arguments,
`profile` the replica profile read from a file or measured on an engine.

Ranked with `cluster`: it reads loadgen (traces, think times), measure (the oracle's cache)
and proxy (the routing rules), and experiments and the CLI read it.
"""

from kvlab.plan.answers import point
from kvlab.plan.measure import measure
from kvlab.plan.routing import POLICIES
from kvlab.plan.simulate import simulate
from kvlab.plan.stream import Body, Stream, closed_loop

__all__ = ["POLICIES", "Body", "Stream", "closed_loop", "measure", "point", "simulate"]
