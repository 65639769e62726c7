"""kvlab's engines placed on an existing Ray cluster (`kvlab run ... --cluster ADDRESS`).

- `nodes`: the cluster's nodes as data, and a host name (PREFILL_HOST, DECODE_HOST, `--node`)
  resolved to exactly one of them, or refused naming the host and listing the nodes;
- `placement`: which node each role goes to, from the settings and flags (no Ray import: the
  single-machine path reads it and never imports Ray);
- `agent`: the Ray actor pinned to one node that checks paths, starts, watches and stops that
  node's engines and reads its counters;
- `session`: one run's connection to the cluster: its agents, their facts, the checks made
  before anything starts, the run's API key;
- `runner`: the engines of one step started through the agents, watched while the step runs,
  always stopped; each node's counters around each load level;
- `serve`: `kvlab serve ROLE --node NAME`, one engine in the foreground on a node.

kvlab never starts or stops the cluster itself, and only the driver (the `kvlab` process)
writes the notebook. Ray is the optional `cluster` extra: only these modules import it.
"""

# the modules other packages read, each imported on use: `placement` imports no Ray, and the
# single-machine path reads only it
__all__ = ["placement", "runner", "serve", "session", "survey"]
