"""What a measurement means: KV arithmetic, reuse across turns and its verdicts,
`prove`, the compatibility check, comparisons with their intervals, pressure, the cache oracle.

This module is the package's surface: other packages import measure's names (and the modules
it lists in `__all__`) from here, never from its other modules.
"""

from kvlab.measure import (
    compare,
    compat,
    intervals,
    kvmath,
    leg_bytes,
    oracle,
    oracle_gap,
    pressure,
    slot_oracle,
)
from kvlab.measure.compare import compare_runs, ttft_difference
from kvlab.measure.compat import Compatibility, listed_models, pick_model, probe
from kvlab.measure.conversation import PREAMBLE_WORDS, TURN_MAX_TOKENS, preamble
from kvlab.measure.crossing import Judgement, Point, judge_crossing
from kvlab.measure.link_bytes import NOT_CROSSED
from kvlab.measure.oracle_gap import shortfall
from kvlab.measure.oracle_model import Blocks, CacheModel, Prediction
from kvlab.measure.pairing import load_rows, paired_rows, tier_backends, tier_pair, tier_sides
from kvlab.measure.pressure import judge_pressure, preemptions, tier_holds, tier_too_small
from kvlab.measure.prove import ProofRun, ProveOptions, proof_record, run_proof
from kvlab.measure.reuse import (
    WARM_UP,
    Probe,
    ReuseOptions,
    ReuseRun,
    reuse_record,
    run_reuse,
    store_hits,
)
from kvlab.measure.same_experiment import experiment_warnings, label_facts
from kvlab.measure.verdict import FAILED

__all__ = [
    "FAILED",
    "NOT_CROSSED",
    "PREAMBLE_WORDS",
    "TURN_MAX_TOKENS",
    "WARM_UP",
    "Blocks",
    "CacheModel",
    "Compatibility",
    "Judgement",
    "Point",
    "Prediction",
    "Probe",
    "ProofRun",
    "ProveOptions",
    "ReuseOptions",
    "ReuseRun",
    "compare",
    "compare_runs",
    "compat",
    "experiment_warnings",
    "intervals",
    "judge_crossing",
    "judge_pressure",
    "kvmath",
    "label_facts",
    "leg_bytes",
    "listed_models",
    "load_rows",
    "oracle",
    "oracle_gap",
    "paired_rows",
    "pick_model",
    "preamble",
    "preemptions",
    "pressure",
    "probe",
    "proof_record",
    "reuse_record",
    "run_proof",
    "run_reuse",
    "shortfall",
    "slot_oracle",
    "store_hits",
    "tier_backends",
    "tier_holds",
    "tier_pair",
    "tier_sides",
    "tier_too_small",
    "ttft_difference",
]
