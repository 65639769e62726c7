#!/usr/bin/env python3
"""`kvlab plan`'s simulator speed: --requests requests (1,000,000) over --replicas replicas
(256), each policy, against the oracle's own replay of the same stream measured in the same run.

The stream, in the Mooncake trace format (`loadgen.trace.TraceRequest`): --conversations
conversations (50,000) open with one of --systems shared system prompts (16, 4 blocks each),
then grow by one block a turn; a turn is a random live conversation's next (a seeded
shuffle that keeps each conversation's order), and a conversation ends after 2-30 turns,
another starting in its place. Blocks of 64 tokens, about 12 a request; Poisson arrivals at
--rate requests a second (40,000: about 160 a second a replica). Each replica's cache holds
--device-blocks blocks (2,048) with no tier; its costs are a 1.7B-shaped GPU's (prefill
0.05 ms a token, decode step 8 + 0.1 x batch ms, 256 sequences).

Timed (perf_counter, best of --repeat): `simulate` per policy; the anchor, `oracle.replay_lru`
(the same LRU moved block by block through one cache of all the replicas' blocks) over the
same stream, and the stack pass (`oracle.replay`). Building the stream is not timed. The
machine is shared: read the figures with the load average printed beside them; run it alone,
under `flock /tmp/kvlab-engines.lock`.

  .venv/bin/python benchmarks/plan_speed.py
  .venv/bin/python benchmarks/plan_speed.py --requests 100000 --replicas 16
"""

from __future__ import annotations

import argparse
import os
import random
import time

from kvlab.loadgen.trace import TraceRequest
from kvlab.measure import CacheModel, oracle
from kvlab.plan.routing import POLICIES
from kvlab.plan.simulate import Outcome, simulate
from kvlab.plan.stream import Stream, from_trace
from kvlab.records import ReplicaProfile
from oracle_speed import (
    best,  # the same best-of-N timer (run from benchmarks/: its folder is on sys.path)
)

BLOCK = 64


def trace(requests: int, conversations: int, systems: int, rate: float, seed: int
          ) -> list[TraceRequest]:
    rng = random.Random(f"plan-speed:{seed}")
    fresh = 1_000_000

    def opening() -> list[int]:
        nonlocal fresh
        fresh += 1
        system = rng.randrange(systems)
        return [system * 4 + k for k in range(4)] + [fresh]

    live = [opening() for _ in range(conversations)]
    left = [rng.randint(2, 30) for _ in range(conversations)]
    out, at = [], 0.0
    for _ in range(requests):
        c = rng.randrange(conversations)
        ids = live[c]
        length = len(ids) * BLOCK - rng.randint(0, BLOCK - 1)
        out.append(TraceRequest(at * 1000, length, rng.randint(16, 256), tuple(ids)))
        at += rng.expovariate(rate)
        left[c] -= 1
        if left[c]:
            fresh += 1
            live[c] = [*ids, fresh]
        else:
            live[c], left[c] = opening(), rng.randint(2, 30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=256)
    parser.add_argument("--conversations", type=int, default=50_000)
    parser.add_argument("--systems", type=int, default=16)
    parser.add_argument("--rate", type=float, default=40_000.0)
    parser.add_argument("--device-blocks", type=int, default=2048)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    load_before = os.getloadavg()
    started = time.perf_counter()
    stream: Stream = from_trace(trace(args.requests, args.conversations, args.systems,
                                      args.rate, args.seed), BLOCK, trace_block=BLOCK)
    built = time.perf_counter() - started
    profile = ReplicaProfile(block_tokens=BLOCK, device_blocks=args.device_blocks,
                             prefill_s_per_token=5e-5, decode_step_s=0.008,
                             decode_step_per_seq_s=1e-4, max_seqs=256)
    blocks = sum(len(r.hashes) for r in stream.blocks)
    one = CacheModel(BLOCK, args.device_blocks * args.replicas)
    rows = [("anchor: oracle.replay_lru, one cache",
             best(args.repeat, lambda: oracle.replay_lru(stream.blocks, one)), None),
            ("oracle.replay (stack pass), one cache",
             best(args.repeat, lambda: oracle.replay(stream.blocks, one)), None)]
    for policy in args.policies.split(","):
        found: list[Outcome] = []
        seconds = best(args.repeat, lambda p=policy, kept=found: kept.append(
            simulate(stream, profile, args.replicas, p)))  # type: ignore[arg-type]
        o = found[-1]
        hit = float((o.device_blocks.sum() + o.tier_blocks_hit.sum()) * BLOCK
                    / o.prompt_tokens.sum())
        rows.append((f"simulate {policy}", seconds, hit))
    load_after = os.getloadavg()
    print(f"stream: {len(stream):,} requests, {blocks / len(stream):.1f} blocks of {BLOCK} "
          f"tokens each on average (built in {built:.1f} s, not timed); {args.replicas} "
          f"replicas of {args.device_blocks:,} blocks; {os.cpu_count()} CPUs; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    anchor = rows[0][1]
    print(f"{'step':<42} {'seconds':>8} {'requests/s':>11} {'x anchor':>9} {'hit share':>10}")
    for name, seconds, hit in rows:
        shown = "" if hit is None else f"{hit:.3f}"
        print(f"{name:<42} {seconds:>8.2f} {len(stream) / seconds:>11,.0f} "
              f"{seconds / anchor:>9.2f} {shown:>10}")


if __name__ == "__main__":
    main()
