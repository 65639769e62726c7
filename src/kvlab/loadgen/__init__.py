"""kvlab's load generator: raw streaming client, open/closed-loop levels, pure statistics.

`workloads` (the deterministic prompt sets, sized before any engine starts by a local
tokenizer, `tokens`) -> `spec` (what a sweep is asked: levels, rates, prompt sets and prefix
groups, user sessions, a trace) -> `sizing` (prompts in the served model's tokens, through the
engine adapter's /tokenize) -> `client` (one keep-alive connection, raw stamps) -> `runner`
(one level's schedule, by count, by time or at a trace's times) or `sessions` (users whose
next turn waits for the reply and a think time) -> `record` (decode events after the level)
-> `stats` and `returning` (pure functions), `rows` (the notebook row) and `perrequest` (each
request as a line of the level's file) -> `sweep` (the levels in order; `inputs` what they
share, `payloads` a level's prompts and request bytes, `level` one level's warm-up, metrics
deltas and row) and `linkrun` (the seed's run-load.sh); `trace` reads and rebuilds a
Mooncake-format trace; `capacity` searches the load for the highest that meets a latency
target; `served` settles the model name a load sends and `fit` its prompt sizes against the
served context, both before the first request. It knows no engine beyond the OpenAI
streaming shapes and what the engine adapter answers.

This module is the package's surface: other packages import loadgen's names (and the
`fit`, `served`, `stats`, `topology`, `trace` and `workloads` modules) from here, never from
its other modules.
"""

from kvlab.loadgen import fit, served, stats, topology, trace, workloads
from kvlab.loadgen.args import (
    CapacityArgs,
    LoadArgs,
    NoteText,
    TargetArgs,
    lab_named,
    link_spec,
    load_spec,
    openai_key,
    understood_url,
)
from kvlab.loadgen.benchargs import BenchArgs
from kvlab.loadgen.capacity import (
    CapacityAsk,
    CapacityResult,
    Knob,
    LatencyTarget,
    SearchPlan,
    search,
)
from kvlab.loadgen.client import Endpoint
from kvlab.loadgen.dataset import Dataset
from kvlab.loadgen.linkrun import LinkSpec, run_load
from kvlab.loadgen.load_test_entry import write_launcher
from kvlab.loadgen.payloads import level_prompts
from kvlab.loadgen.record import RequestRecord, decode_events
from kvlab.loadgen.runner import LevelResult, LevelRun, Schedule
from kvlab.loadgen.sessions import SessionSpec, ThinkTime
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import (
    ProgressHook,
    SweepResult,
    default_requests,
    run_sweep,
)
from kvlab.loadgen.tokens import ChatTokens
from kvlab.loadgen.workloads import Prompt, Sizing

__all__ = [
    "BenchArgs",
    "CapacityArgs",
    "CapacityAsk",
    "CapacityResult",
    "ChatTokens",
    "Dataset",
    "Endpoint",
    "Knob",
    "LatencyTarget",
    "LevelResult",
    "LevelRun",
    "LinkSpec",
    "LoadArgs",
    "LoadSpec",
    "NoteText",
    "ProgressHook",
    "Prompt",
    "RequestRecord",
    "Schedule",
    "SearchPlan",
    "SessionSpec",
    "Sizing",
    "SweepResult",
    "TargetArgs",
    "ThinkTime",
    "decode_events",
    "default_requests",
    "fit",
    "lab_named",
    "level_prompts",
    "link_spec",
    "load_spec",
    "openai_key",
    "run_load",
    "run_sweep",
    "search",
    "served",
    "stats",
    "topology",
    "trace",
    "understood_url",
    "workloads",
    "write_launcher",
]
