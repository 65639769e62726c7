"""A plan's line reads back as it was written: a figure the simulation has none of (TPOT with
one output token, a hit share with no prompt) is left off the line and read as None."""

from __future__ import annotations

import json

from kvlab.records import PlanPoint, PlanRecord, RateAnswer, ReplicaProfile, ReplicasAnswer
from kvlab.records.models import parse


def test_a_plan_line_without_some_figures_round_trips() -> None:
    point = PlanPoint(policy="round-robin", replicas=2, tier_blocks=0, rate=0.0, requests=3,
                      prompt_tokens=0, hit_share=None, tier_share=None,
                      hit_share_per_replica=[None, None], requests_per_replica=[2, 1],
                      busiest_over_mean=None, ttft_s=None, tpot_s=None)
    record = PlanRecord(label="plan", workload="w", points=[point], left_out=["x"],
                        profile=ReplicaProfile(block_tokens=16, device_blocks=1,
                                               prefill_s_per_token=0.0, decode_step_s=0.0,
                                               max_seqs=1),
                        highest_rates=[RateAnswer(policy="round-robin", replicas=2,
                                                  tier_blocks=0, target="t", rate=None)],
                        fewest_replicas=[ReplicasAnswer(policy="round-robin", tier_blocks=0,
                                                        rate=1.0, target="t", replicas=None)])
    back = parse(json.loads(json.dumps(record.line())))
    assert isinstance(back, PlanRecord), back
    assert back.points == [point]
