"""The plan's prediction for `kvlab run replicas`' own arms, made before each arm runs and
kept on its line beside what the replicas measured.

Once, before the arms: a replica profile measured on the first replica (`plan.measure`: two
closed-loop levels of prompts no arm sends, read from its own counters), written as a
`replica_profile` line. Then for each of kvlab's arms, before its load: the arm's own prompts
in the order the load generator sends them, each as the exact tokens the replica's /tokenize
gives (the chat template applied), keyed as the proxy keys them (`affinity.PrefixKey` with the
arm's tokenizer, block size and one block; `affinity.conversation_key`), the replicas named by
their URLs so the ring places each key where the proxy does, and the closed loop of
concurrency c modelled as the load generator runs it: the first c at once, each later prompt,
in order, as soon as any request ends (`plan.closed_loop`). The simulation's figures
(`plan.point`) go on the arm's line as `predicted`.

vllm-router's arms get none: its `cache_aware` record is matched by character, which the plan
models by whole blocks, and it names no replica per request to check the assignment by.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvlab.plan import POLICIES, Body, closed_loop, measure, point, simulate
from kvlab.records import PlanPoint, ProfileRecord, ReplicaProfile

SHAPE_FROM = "vllm:cache_config_info on the first replica's /metrics"
MAX_SEQS_FROM = "--max-num-seqs on the replicas' argv (kvlab's settings)"
NOT_ROUTER = ("vllm-router's arms are not predicted: its cache_aware record is matched by "
              "character, the plan's by whole blocks")
CALIBRATION_SEED = 9_000_000  # far from every arm's seed: its prompts share nothing with theirs


async def calibrate(url: str, model: str, api_key: str, *, block: int, device: int,
                    max_seqs: int, concurrency: int, preamble_tokens: int, max_tokens: int,
                    run_id: str | None, label: str) -> ProfileRecord:
    """The first replica's profile (see the module's docstring)."""
    return await measure(url, model, api_key=api_key, block_tokens=block,
                         device_blocks=device, max_seqs=max_seqs, shape_from=SHAPE_FROM,
                         max_seqs_from=MAX_SEQS_FROM, concurrency=max(2, concurrency),
                         requests=max(4, concurrency * 2), preamble_tokens=preamble_tokens,
                         max_tokens=max(2, max_tokens), seed=CALIBRATION_SEED,
                         label=f"{label}-profile", run_id=run_id, engine="vllm")


def predict(profile: ReplicaProfile, arm: str, urls: Sequence[str], prompts: Sequence[Body],
            tokens: Mapping[int, Sequence[int]], concurrency: int, max_tokens: int,
            prefix_key: Callable[[dict[str, object]], int] | None,
            load_factor: float) -> PlanPoint:
    """The plan's figures for one arm of kvlab's over the replicas at `urls`: `prompts` in
    the order the load sends them, `tokens` each one's exact tokens by index, `prefix_key`
    the proxy's prefix-affinity key (None where the arm reads none)."""
    policy = next((p for p in POLICIES if p == arm), None)
    if policy is None:
        raise ValueError(f"the plan has no policy {arm!r}")
    stream = closed_loop(prompts, tokens, profile.block_tokens, concurrency, max_tokens,
                         prefix_key, f"{arm}: {len(prompts)} prompts at concurrency "
                         f"{concurrency}")
    return point(simulate(stream, profile, len(urls), policy, names=list(urls),
                          load_factor=load_factor))
