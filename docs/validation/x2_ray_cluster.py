"""A two-node Ray cluster on one host, one node per GPU (for docs/validation/h200-x2-ray.sh).

Each node's raylet is started with CUDA_VISIBLE_DEVICES naming its own GPU and one GPU
resource, so the kvlab agent Ray places there (which claims its node's GPUs) and the engines
it starts see only that GPU. The nodes are labelled kvlab-host=gpu0 and gpu1, the names
PREFILL_HOST and DECODE_HOST give. Writes the address to ADDRESS_FILE and holds the cluster
until killed. With --gpus 0 (a CPU rehearsal) the nodes have no GPU.

With --veth the second node runs in the network namespace `kvb` of x2_veth.py (run `x2_veth.py
up` first), so the two nodes are 10.77.0.1 and 10.77.0.2 and everything between them crosses
the shaped kv0 pair: there the nodes are started with Ray's own `ray start`, as on two
machines, since Ray's test Cluster starts every node in the caller's namespace.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LABEL = "kvlab-host"
VETH = Path(__file__).with_name("x2_veth.py")
HEAD, WORKER, PORT = "10.77.0.1", "10.77.0.2", 6399


def _ray(args: list[str], index: int, gpus: int, cpus: int, netns: bool = False) -> None:
    """`ray start` for node gpu<index> (inside `kvb` when netns)."""
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": str(index)} if gpus else {})}
    command = [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start",
               *args, "--num-cpus", str(cpus), "--num-gpus", str(gpus),
               "--labels", f"{LABEL}=gpu{index}", "--disable-usage-stats"]
    if netns:
        command = [sys.executable, str(VETH), "exec", "--", *command]
    subprocess.run(command, env=env, check=True)


def _stop() -> None:
    subprocess.run([sys.executable, "-c", "from ray.scripts.scripts import main; main()",
                    "stop", "--force"], check=False)


def veth_cluster(address_file: Path, gpus: int, cpus: int) -> None:
    """Node gpu0 at 10.77.0.1 here, node gpu1 at 10.77.0.2 in `kvb`; held until SIGTERM."""
    _ray(["--head", "--node-ip-address", HEAD, "--port", str(PORT)], 0, gpus, cpus)
    _ray(["--address", f"{HEAD}:{PORT}", "--node-ip-address", WORKER], 1, gpus, cpus,
         netns=True)
    address_file.write_text(f"{HEAD}:{PORT}")
    print(f"cluster at {HEAD}:{PORT}: gpu0 ({HEAD}) and gpu1 ({WORKER}, namespace kvb)",
          flush=True)
    _hold()
    _stop()


def _hold() -> None:
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address_file", type=Path)
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node (0: rehearsal)")
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--veth", action="store_true",
                        help="the second node in namespace kvb, across the shaped kv0 pair")
    args = parser.parse_args()
    if args.veth:
        veth_cluster(args.address_file, args.gpus, args.cpus)
        return
    from ray.cluster_utils import Cluster

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
    _hold()
    cluster.shutdown()


if __name__ == "__main__":
    main()
