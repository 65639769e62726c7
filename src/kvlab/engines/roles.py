"""A lab role's engine plan, as `kvlab serve ROLE` starts it, and the plan's summary as the
engine will really run it.

The roles are the seed scripts', each played by the engine whose adapter lists it: vLLM's
(baseline, offload, shared-a, shared-b, prefill, decode), llama-server's (`llama`) and
mlx-lm's server (`mlx`). Arguments after `--` come last on an
engine's command line and win, so the summary states the context, slots and block size they
set rather than the settings'.
"""

from __future__ import annotations

from kvlab.core import LoadedSettings
from kvlab.engines.plan import EnginePlan, PlanRequest
from kvlab.engines.registry import (
    all_engines,
    engine_of_role,
    known_engine,
    make_plan,
    refuse_missing_model,
)

ENGINE_ROLES = tuple(role for engine in all_engines() for role in engine.roles)
TITLES = {role: title for engine in all_engines() for role, title in engine.titles.items()}


def plan_for_role(loaded: LoadedSettings, role: str, model: str | None, port: int | None,
                  extra: tuple[str, ...], *, probe: bool) -> EnginePlan:
    """The plan for `role`, probing the engine's flags only where the plan needs them
    (`probe`: the engine must exist, as for a start; a dry run only shows the plan)."""
    settings = loaded.values
    engine = engine_of_role(role)
    install = engine.install(settings)
    if probe:
        install.require()
    # what `kvlab serve` asks beyond the settings, where the engine has it: MONOLITHIC honoured
    # as serve-decode.sh does, the user's store already there, its flags read at a start
    has = engine.plan_fields
    request = PlanRequest(model=model, port=port, extra_args=extra,
                          monolithic_switch="monolithic_switch" in has,
                          store_must_exist="store_must_exist" in has,
                          probe_flags=probe and "probe_flags" in has)
    plan = make_plan(settings, engine.name, role, install, request)
    refuse_missing_model(settings, plan)
    return plan.with_secrets(settings.known_secrets())


def as_started(plan: EnginePlan) -> list[tuple[str, str]]:
    """The plan's summary with the context, block size and slots the engine will really use:
    arguments after `--` come last on its command line, and the last value wins."""
    engine = known_engine(plan.engine)
    summary = list(plan.summary)
    if engine is None or not plan.extra_args:
        return summary
    own = engine.launch_settings(plan.own_argv())
    real = engine.launch_settings(plan.argv())
    ctx = real.context_tokens or own.context_tokens
    slots = real.slots or own.slots
    changed = {
        "context": (own.context_tokens, real.context_tokens),
        "slots": (own.slots, real.slots),
        "per slot": ((own.context_tokens or 0) // (own.slots or 1),
                     (ctx or 0) // (slots or 1) if ctx and slots else None),
        "block": (own.block_size, real.block_size),
    }
    out = []
    for key, value in summary:
        word = _summary_word(key)
        before, after = changed.get(word, (None, None)) if word else (None, None)
        if after is not None and str(before) == value and after != before:
            value = f"{after} (set by the engine arguments after --; the settings say {before})"
        out.append((key, value))
    if real.block_size is not None and own.block_size is None:
        out.append(("block size", f"{real.block_size} (set by the engine arguments after --)"))
    return out


def _summary_word(key: str) -> str | None:
    """Which launch setting a summary line states, by its words (plans name them so)."""
    if "per slot" in key:
        return "per slot"
    if "context" in key or "model length" in key:
        return "context"
    if key == "slots":
        return "slots"
    return "block" if "block" in key else None
