#!/usr/bin/env python3
"""Cache-oracle speed: hashing and replaying a user-session stream, and a tier-size curve.

The stream: --conversations conversations (500) of --turns turns (20), 10,000 requests. Every
conversation opens with one of --systems shared system prompts (4, --system-tokens tokens
each), then its own first message; each turn appends an answer and a message
(--turn-tokens, 120 on average), so prompts grow from about 700 to 3,000 tokens (about 1,900
on average). Turns are sent in a random order that keeps each conversation's own order (a
seeded shuffle). Blocks of 16 tokens; the device holds --device-share of the stream's
distinct blocks, the tier --tier-share, so the device alone is smaller than the working set.

Timed (perf_counter, best of --repeat): hashing every prompt into chained block hashes,
replaying the hashed stream (device + tier, on_evict: the stack pass), the same with tokens
given (hashing included), the block-by-block replay (`replay_lru`), `summarize` (the replay
and the infinite cache), and `curve` over 16 tier sizes (0 to 4x the tier); then `curve` over
20 sizes for the first 2,000 requests, on_evict (one stack pass) and on_write (a replay per
size, timed once). The machine is shared: read the figures with the load average printed
beside them.

  .venv/bin/python benchmarks/oracle_speed.py
  .venv/bin/python benchmarks/oracle_speed.py --conversations 100 --turns 20
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable
from dataclasses import replace

from kvlab.measure import oracle

BLOCK_TOKENS = 16
VOCAB = 150_000


def stream(conversations: int, turns: int, systems: int, system_tokens: int,
           turn_tokens: int, seed: int) -> list[list[int]]:
    """Each request's prompt, in the order they are sent."""
    rng = random.Random(f"oracle-speed:{seed}")
    prompts = [[rng.randrange(VOCAB) for _ in range(system_tokens)] for _ in range(systems)]
    history = [[*prompts[rng.randrange(systems)],
                *(rng.randrange(VOCAB) for _ in range(rng.randint(64, 256)))]
               for _ in range(conversations)]
    order = [c for c in range(conversations) for _ in range(turns)]
    rng.shuffle(order)  # a conversation's turns stay in their order: each one only grows
    out = []
    for c in order:
        out.append(list(history[c]))
        grow = rng.randint(turn_tokens // 2, turn_tokens * 3 // 2)
        history[c] += [rng.randrange(VOCAB) for _ in range(grow)]
    return out


def best(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--turn-tokens", type=int, default=120)
    parser.add_argument("--device-share", type=float, default=0.25)
    parser.add_argument("--tier-share", type=float, default=0.25)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    prompts = stream(args.conversations, args.turns, args.systems, args.system_tokens,
                     args.turn_tokens, args.seed)
    n = len(prompts)
    tokens = sum(map(len, prompts))
    hashed = [oracle.hashed(p, BLOCK_TOKENS) for p in prompts]
    blocks = sum(len(r.hashes) for r in hashed)
    distinct = len({h for r in hashed for h in r.hashes})
    device, tier = int(distinct * args.device_share), int(distinct * args.tier_share)
    cache = oracle.CacheModel(BLOCK_TOKENS, device, tier)
    sizes = [round(tier * 4 * i / 15) for i in range(16)]

    first = hashed[:2000]
    few = [round(tier * 4 * i / 19) for i in range(20)]
    on_write = replace(cache, tier_stores="on_write")
    rows = [
        ("hash", n, best(args.repeat, lambda: [oracle.hashed(p, BLOCK_TOKENS) for p in prompts])),
        ("replay (hashed)", n, best(args.repeat, lambda: oracle.replay(hashed, cache))),
        ("hash + replay", n, best(args.repeat, lambda: oracle.replay(prompts, cache))),
        ("replay_lru (hashed)", n, best(args.repeat, lambda: oracle.replay_lru(hashed, cache))),
        ("summarize (hashed)", n, best(args.repeat, lambda: oracle.summarize(hashed, cache))),
        ("curve, 16 sizes", n, best(args.repeat, lambda: oracle.curve(hashed, sizes, cache))),
        ("curve, 20 sizes", len(first),
         best(args.repeat, lambda: oracle.curve(first, few, cache))),
        ("curve on_write, 20", len(first),
         best(1, lambda: oracle.curve(first, few, on_write))),
    ]
    print(f"stream: {n:,} requests, {tokens / n:,.0f} tokens each on average, {blocks:,} "
          f"blocks of {BLOCK_TOKENS} ({distinct:,} distinct); device {device:,} blocks, "
          f"tier {tier:,}; load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'step':<20} {'requests':>9} {'seconds':>8} {'requests/s':>11}")
    for name, count, seconds in rows:
        print(f"{name:<20} {count:>9,} {seconds:>8.3f} {count / seconds:>11,.0f}")
    summary = oracle.summarize(hashed, cache)
    print(f"hit share: device {summary.device_hit_tokens / tokens:.3f}, tier "
          f"{summary.tier_hit_tokens / tokens:.3f}, together {summary.hit_share:.3f}; "
          f"infinite cache {summary.infinite_cache_share:.3f}")
    shares = ", ".join(f"{p.tier_blocks:,}: {p.hit_share:.3f}"
                       for p in oracle.curve(hashed, sizes[::3], cache))
    print(f"curve (tier blocks: hit share): {shares}")


if __name__ == "__main__":
    main()
