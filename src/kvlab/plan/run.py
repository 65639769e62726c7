"""One plan: the workload over every policy, replica count and tier size asked, and the
answers a TTFT target and a rate ask for, as one `PlanRecord`.

Not here: the simulation (`simulate.py`), the figures and searches (`answers.py`), reading the
arguments (`args.py`) and the profile (`profile.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kvlab.core import InputError, Settings, write_private
from kvlab.plan import answers
from kvlab.plan.args import PlanArgs
from kvlab.plan.profile import read_profile
from kvlab.plan.routing import Policy
from kvlab.plan.simulate import Outcome, simulate
from kvlab.plan.stream import Stream
from kvlab.records import PlanRecord, ProfileRecord, ReplicaProfile

Say = Callable[[str], None]


def _scale(stream: Stream, rate: float | None) -> Stream:
    """The stream at `rate` (None: its own pace)."""
    return stream if rate is None else stream.scaled(rate / answers.base_rate(stream))


def plan_from(args: PlanArgs, say: Say | None = None) -> PlanRecord:
    """`plan` with the profile `--profile` names, its line also written to `--out`."""
    if args.profile is None:
        raise InputError("kvlab plan needs --profile FILE: a replica profile's JSON (its "
                         "fields, or a notebook holding a replica_profile line)")
    record = plan(args, read_profile(args.profile), say)
    if args.out is not None:
        write_private(args.out, json.dumps(record.line(), sort_keys=True) + "\n")
    return record


def measure_from(args: PlanArgs) -> ProfileRecord:
    """`kvlab plan --measure`: the engine's profile, its line also written to `--out`."""
    import asyncio

    from kvlab.plan.measure import measure_url

    if args.base_url is None or args.max_seqs is None:
        raise InputError("kvlab plan --measure needs --base-url URL (the vLLM engine's root) "
                         "and --max-seqs N (its --max-num-seqs)")
    record = asyncio.run(measure_url(args.base_url, args.model, Settings().api_key(),
                                     args.max_seqs, args.measure_concurrency,
                                     args.measure_requests))
    if args.out is not None:
        write_private(args.out, json.dumps(record.line(), sort_keys=True) + "\n")
    return record


def plan(args: PlanArgs, profile: ReplicaProfile, say: Say | None = None,
         label: str = "plan") -> PlanRecord:
    """Every arm's figures, and the answers the target asks for."""
    stream = args.stream(profile.block_tokens)
    if not len(stream):
        raise InputError("the workload has no request to plan for")
    counts, policies, tiers = args.replica_counts(), args.policies(), args.tiers(
        profile.tier_blocks)
    at = _scale(stream, args.rate)
    target = answers.Target(90, args.target_ttft_p90) if args.target_ttft_p90 else None

    def arm(policy: Policy, tier: int) -> answers.Run:
        def run(s: Stream, replicas: int) -> Outcome:
            return simulate(s, profile, replicas, policy, tier, load_factor=args.load_factor)
        return run

    points, rates, fewest = [], [], []
    for policy in policies:
        for tier in tiers:
            for n in counts:
                if say:
                    say(f"{policy}, {n} replicas, tier {tier} blocks")
                points.append(answers.point(arm(policy, tier)(at, n)))
                if target is not None:
                    rates.append(answers.highest_rate(stream, arm(policy, tier), target,
                                                      policy, n, tier))
            if target is not None and args.rate is not None:
                fewest.append(answers.fewest_replicas(stream, arm(policy, tier), target,
                                                      policy, tier, args.rate, max(counts)))
    return PlanRecord(label=label, workload=stream.source, profile=profile, points=points,
                      highest_rates=rates, fewest_replicas=fewest,
                      left_out=list(answers.LEFT_OUT))
