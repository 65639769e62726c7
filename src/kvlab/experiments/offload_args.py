"""The arguments of the offload lab's tier experiments (`kvlab run offload`, `mlx-cache`)
and the specs they make with the settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from kvlab.core import LoadedSettings, SettingError
from kvlab.experiments.args import (
    AUTO_HELP,
    REPEAT_HELP,
    SLO_HELP,
    LocalArgs,
    PlannedArgs,
    capacity_ask,
    repeat_asked,
)

if TYPE_CHECKING:
    from kvlab.experiments.mlx_cache import MlxCacheSpec
    from kvlab.experiments.offload import OffloadSpec
    from kvlab.experiments.vllm_disk import VllmDiskSpec


WORKING_SET = "working-set"  # `run offload --tier-gb`: a tier sized to hold the working set


class MlxCacheArgs(LocalArgs):
    """Time mlx-lm's prompt-cache file: cold prefill, save, load in a new process."""

    prompt_tokens: int = Field(2000, ge=16, description="Length of the prompt, in the "
                               "model's tokens.")
    keep_file: bool = Field(False, description="Keep the cache file (in KVLAB_HOME's stores, "
                            "removed by `kvlab clean`).")
    part: tuple[Literal["file", "turns", "all"], ...] = Field(
        ("all",), description="The file's stopwatch, turns of one conversation on "
        "mlx_lm.server, or both (repeatable; default all).")
    turns: int = Field(6, ge=2, description="--part turns: turns of the conversation.")

    def spec(self, loaded: LoadedSettings) -> MlxCacheSpec:
        from kvlab.experiments.mlx_cache import PARTS, MlxCacheSpec

        parts = PARTS if "all" in self.part else tuple(p for p in PARTS if p in self.part)
        return MlxCacheSpec(prompt_tokens=self.prompt_tokens, keep_file=self.keep_file,
                            parts=parts, turns=self.turns)


class VllmDiskArgs(PlannedArgs):
    """Time vLLM's fs tier: cold prefill, restart vLLM, the same prompt from its block files."""

    preamble_words: int = Field(3000, ge=64, description="Length of the prompt, in words "
                                "(about 4,000 tokens at the default).")
    max_tokens: int = Field(8, ge=1, description="Tokens of each answer.")
    tier_gb: float | None = Field(None, gt=0, description="The CPU tier under the fs tier, "
                                  "GiB (default: KV_OFFLOAD_GB).")

    def spec(self, loaded: LoadedSettings) -> VllmDiskSpec:
        from kvlab.experiments.vllm_disk import VllmDiskSpec

        return VllmDiskSpec(preamble_words=self.preamble_words, max_tokens=self.max_tokens,
                            tier_gib=self.tier_gb)


class OffloadArgs(PlannedArgs):
    """The host-memory tier: off and on, quiet and under found pressure.

    --part curve: the tier at several sizes against none; --part boundary: tier off and on at
    several opening lengths.
    """

    turns: int = Field(6, ge=2, description="Turns of the quiet conversation.")
    preamble_words: int | None = Field(None, ge=1, description="Default: PREAMBLE_WORDS.")
    concurrency: int = Field(8, ge=1, description="Concurrency of the pressure runs (the lab "
                             "uses 8).")
    min_requests: int = Field(0, ge=0, description="At least this many requests per pressure "
                              "run.")
    part: Literal["all", "quiet", "pressure", "curve", "boundary"] = Field(
        "all", description="Run only the quiet pair or only the pressure pair; curve: the "
        "pressure runs with the tier off and at each of --tier-sizes (every size's engine "
        "started at once), beside the oracle's curve; boundary: tier off and on at each of "
        "--lengths.")
    tier_sizes: str = Field("", description="--part curve: host tier sizes, each GiB (12) or "
                            "a multiple of the working set (0.5x) [default: "
                            "0.25x,0.5x,1x,1.5x].")
    lengths: str = Field("", description="--part boundary: opening lengths in the model's "
                         "tokens, e.g. 1000,2000,4000 [default: a quarter, a half and all of "
                         "PREAMBLE_TOKENS, fitted to CTX].")
    tier: Literal["both", "off", "on"] = Field(
        "both", description="The pressure runs' sides: one alone runs its repeats (and "
        "capacity search) back to back, for a call too short for both; give --think-time the "
        "other side's so that the tier stays the one variable.")
    tier_gb: str = Field("", description="The pressure runs' host tier in GiB, or "
                         "working-set for one sized to hold the working set [default: "
                         "KV_OFFLOAD_GB, as the lab says: start small, raise it only if the "
                         "measurement rewards you]; a tier smaller than the working set is "
                         "said so and has its own report row.")
    method: Literal["sessions", "lab"] = Field(
        "sessions", description="The pressure runs: user sessions against a device cache "
        "kvlab sizes too small, or the lab's own procedure (lower MEM_FRACTION yourself; the "
        "load generator at --concurrency with the shared-prefix set).")
    think_time: str = Field("", description="The pressure runs' think time, e.g. "
                            "exponential:7.0 (seconds) [default: paced to --concurrency by the "
                            "first tier-off run].")
    slo: str = Field("", description=SLO_HELP)
    why: Literal["auto", "always", "never"] = Field(
        "auto", description="After the pressure pair, the controls that say why the tier cost "
        "time: the machine's copy rate and the same sessions with no block shared across "
        "conversations, tier off and on. auto: when the tier-on TTFT p50 was not below 0.9x "
        "the tier-off one.")
    repeat: str = Field("1", description=REPEAT_HELP + " For the pressure pair," + AUTO_HELP,
                        json_schema_extra={"metavar": "N|auto[:CAP]"})

    def shown(self, plan: dict[str, object]) -> bool:
        """`--part quiet|pressure`: only that pair's plans."""
        if self.part not in ("quiet", "pressure"):
            return True
        return str(plan["label"]).endswith("-load") == (self.part == "pressure")

    def experiment(self, name: str) -> str:
        """The curve and the boundary are the tier-sizes experiment's."""
        return "offload-sizes" if self.part in ("curve", "boundary") else name

    def spec(self, loaded: LoadedSettings) -> OffloadSpec:
        from kvlab.experiments.offload import OffloadSpec
        from kvlab.experiments.tier_sizes import check_sizes
        from kvlab.loadgen import ThinkTime

        if self.think_time:
            ThinkTime.parse(self.think_time)  # refused now, before any engine starts
        count, rule = repeat_asked(self.repeat, self._no_rule())
        s = loaded.values
        return OffloadSpec(turns=self.turns, preamble_words=self.preamble_words
                           or s.preamble_words, concurrency=self.concurrency,
                           min_requests=self.min_requests, part=self.part,
                           load_max_tokens=s.max_tokens, preamble_tokens=s.preamble_tokens,
                           capacity=capacity_ask(self.slo), repeat=count, rule=rule,
                           tier=self.tier,
                           tier_gb=_tier_gb(self.tier_gb), think_time=self.think_time,
                           method=self.method, requests=loaded.values.requests, why=self.why,
                           tier_sizes=check_sizes(_items(self.tier_sizes)),
                           lengths=_lengths(self.lengths))

    def _no_rule(self) -> str:
        """Why `--repeat auto` cannot run with these options ("": it can)."""
        if self.part in ("curve", "boundary"):
            return (f"the rule settles the pressure pair (--part all or pressure), not "
                    f"--part {self.part}")
        if self.tier != "both":
            return f"--tier {self.tier} runs one side alone, with no ratio to settle"
        return ""


def _items(given: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in given.split(",") if item.strip())


def _lengths(given: str) -> tuple[int, ...]:
    """`--lengths`: whole token counts of at least 16."""
    try:
        found = tuple(int(item) for item in _items(given))
    except ValueError:
        found = (0,)
    if any(n < 16 for n in found):
        raise SettingError(f"--lengths {given!r}: give opening lengths in tokens, each at "
                           "least 16 (e.g. 1000,2000,4000)")
    return found


def _tier_gb(given: str) -> float | str | None:
    """`--tier-gb`: GiB, or the word working-set (None: KV_OFFLOAD_GB)."""
    if not given or given == WORKING_SET:
        return given or None
    try:
        value = float(given)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise SettingError(f"--tier-gb {given!r}: give GiB above 0 (e.g. 12) or {WORKING_SET}")
    return value
