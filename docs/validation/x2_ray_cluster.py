"""A two-node Ray cluster on one host, one node per GPU (for docs/validation/h200-x2-ray.sh).

Each node's raylet is started with CUDA_VISIBLE_DEVICES naming its own GPU and one GPU
resource, so the kvlab agent Ray places there (which claims its node's GPUs) and the engines
it starts see only that GPU. The nodes are labelled kvlab-host=gpu0 and gpu1, the names
PREFILL_HOST and DECODE_HOST give. Writes the address to ADDRESS_FILE and holds the cluster
until killed. With --gpus 0 (a CPU rehearsal) the nodes have no GPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

from ray.cluster_utils import Cluster

LABEL = "kvlab-host"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address_file", type=Path)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node (0: rehearsal)")
    parser.add_argument("--cpus", type=int, default=4)
    args = parser.parse_args()
    nodes = []
    for index in range(2):
        if args.gpus:  # the raylet (and every worker it starts) inherits this
            os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        node_args = {"num_cpus": args.cpus, "num_gpus": args.gpus,
                     "labels": {LABEL: f"gpu{index}"}}
        if index == 0:
            cluster = Cluster(initialize_head=True, head_node_args=node_args)
        else:
            nodes.append(cluster.add_node(**node_args))
    cluster.wait_for_nodes()
    args.address_file.write_text(cluster.address)
    print(f"cluster at {cluster.address}: gpu0 and gpu1", flush=True)
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(1)
    cluster.shutdown()


if __name__ == "__main__":
    main()
