"""guidellm 0.8's `guidellm run` options as `kvlab load` reads them: `--profile`,
`--constraint` and `--override` into kvlab's levels and limits (`guide_run`, applied by
`spec.with_load_kind`), `--backend` as the server's URL and model (`guide_backend`). Their
syntax is guidellm's own (`kind=KIND,key=value`, `key[i]=value` a list's item, or a JSON
object: `kind_config`). What kvlab does another way is refused with that way, in one line,
before any request.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from kvlab.core import InputError, Say

Value = float | str | bool | None | list["Value"]
OPEN_LOOP = ("constant", "poisson", "async")  # async is guidellm's constant
PROFILE_KEYS = {"synchronous": (), "concurrent": ("streams",),
                "throughput": ("max_concurrency",),
                **{k: ("rate", "max_concurrency") for k in OPEN_LOOP}}
PHASES = {"rampup_duration": "kvlab starts each level at its full load",
          "warmup": "kvlab's warm-up is a count of requests left out of the statistics: "
                    "--warmup N",
          "cooldown": "kvlab keeps every measured request to the level's end"}
INSTEAD = {"sweep": "kvlab's --find-capacity searches for the highest load that meets a "
                    "latency target (--slo); give that instead",
           "goodput": "--find-capacity --capacity-knob concurrency --slo "
                      "'ttft_p95<=2s' searches the highest concurrency that meets it; give "
                      "that instead",
           "knee": "give the concurrencies with --concurrency 1,2,5,25,50 (one level each), "
                   "or --find-capacity with --slo",
           "replay": "replay a Mooncake trace with --trace FILE (--trace-speedup to compress "
                     "it)",
           "max_errors": "kvlab runs each level to its end and counts its failures on the "
                         "row; leave it out",
           "over_saturation": "kvlab does not stop a level on its TTFT's slope; "
                              "--find-capacity with --slo finds the load that meets a target"}
for _kind in ("max_error_rate", "max_global_error_rate"):
    INSTEAD[_kind] = INSTEAD["max_errors"]
LIMITS = {"max_duration": "seconds", "max_requests": "count", "min_requests": "count"}
OVERRIDES = {"profile.rate": OPEN_LOOP, "profile.streams": ("concurrent",)}
MOST = 500_000  # a whole number's largest (a level's requests at most: spec.WARMUP_OFFSET)


@dataclass(frozen=True)
class GuideRun:
    """What guidellm 0.8's --profile, --constraint and --override ask, in kvlab's terms."""

    kind: str | None = None  # the profile's kind (None: no --profile)
    levels: tuple[int, ...] = ()  # concurrent's streams, or an open loop's max_concurrency
    rates: tuple[float, ...] = ()  # an open loop's requests per second, one level each
    max_s: float | None = None  # max_duration's seconds (--max-seconds)
    requests: int | None = None  # max_requests' or min_requests' count (--requests)
    understood: tuple[str, ...] = ()  # how each was read, said before the run


def kind_config(option: str, text: str) -> dict[str, Value]:
    """guidellm's `kind=KIND,key=value,...` (`key[i]=value` a list's item) or a JSON object,
    as guidellm reads it: numbers, true/false and null as themselves, every key once."""
    if text.lstrip().startswith("{"):
        try:
            found = json.loads(text)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise InputError(f"{option} {text!r}: not a JSON object; give kind=KIND,key=value")
        return _with_kind(option, text, {str(k): v for k, v in found.items()})
    out: dict[str, Value] = {}
    for part in text.split(","):
        key, sep, raw = (p.strip() for p in part.partition("="))
        item = re.fullmatch(r"([a-z_]+)\[(\d{1,3})\]", key)
        if not sep or not (item or re.fullmatch(r"[a-z_]+", key)):
            raise InputError(f"{option} {text!r}: {part.strip()!r} is not key=value; give "
                             "kind=KIND,key=value,... (a list: key[0]=1,key[1]=2)")
        value = _scalar(raw)
        if item is not None:
            name, index = item.group(1), int(item.group(2))
            items = out.setdefault(name, [])
            if not isinstance(items, list) or index != len(items):
                raise InputError(f"{option} {text!r}: give {name}[0], {name}[1], ... in order")
            items.append(value)
        elif key in out:
            raise InputError(f"{option} {text!r}: {key} is given twice")
        else:
            out[key] = value
    return _with_kind(option, text, out)


def _with_kind(option: str, text: str, config: dict[str, Value]) -> dict[str, Value]:
    if not isinstance(config.get("kind"), str):
        raise InputError(f"{option} {text!r}: give its kind, e.g. kind=constant,rate=10")
    return config


def _scalar(raw: str) -> Value:
    """A key=value's value: a number, true/false, null, a list of one ([5]), or the text."""
    if raw.startswith("[") and raw.endswith("]") and len(raw) > 2:
        return [_plain(raw[1:-1].strip())]
    return _plain(raw)


def _plain(raw: str) -> Value:
    lowered = raw.lower()
    if lowered in ("null", "~", "none", ""):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return float(raw)
    except ValueError:
        return raw


def _numbers(where: str, key: str, value: Value, whole: bool) -> tuple[float, ...]:
    """A number or a list of them, each finite and above 0 (whole ones at most MOST)."""
    values = value if isinstance(value, list) else [value]
    if not values or not all(_positive(v, whole) for v in values):
        kind = f"whole numbers from 1 to {MOST:,}" if whole else "numbers above 0"
        raise InputError(f"{where}: give {kind}, e.g. {key}=4 or {key}[0]=1,{key}[1]=4")
    return tuple(float(v) for v in values if isinstance(v, int | float))


def _one(where: str, value: Value, whole: bool) -> float:
    """One number (a list of one is that number, as guidellm takes it)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not _positive(value, whole) or not isinstance(value, int | float):
        kind = f"a whole number from 1 to {MOST:,}" if whole else "one number above 0"
        raise InputError(f"{where}: give {kind} (kvlab's holds every level)")
    return float(value)


def _positive(value: Value, whole: bool) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and 0 < value < math.inf and (not whole or (value == int(value) and value <= MOST))


def guide_run(profile: str | None, constraints: tuple[str, ...] = (),
              overrides: tuple[str, ...] = ()) -> GuideRun | None:
    """guidellm 0.8's --profile, --constraint and --override as kvlab's levels and limits
    (None: none given); what kvlab cannot do is refused, naming what to give instead."""
    if profile is None and not constraints and not overrides:
        return None
    run = _limits(constraints)
    if profile is None:
        if overrides:
            raise InputError("--override: it changes the --profile's rate or streams; give "
                             "--profile kind=constant,rate=R or kind=concurrent,streams=C")
        return run
    kind, config, where = _known_kind("--profile", profile, PROFILE_KEYS,
                                      f"{', '.join(PROFILE_KEYS)} (or sweep's --find-capacity)")
    for key, value in config.items():
        if key in PHASES and value not in (None, 0, 0.0):
            raise InputError(f"{where},{key}: {PHASES[key]}; leave it out")
        if key not in PHASES and key not in PROFILE_KEYS[kind]:
            keys = ", ".join(PROFILE_KEYS[kind]) or "none but its kind"
            raise InputError(f"{where}: {key} is not one of its keys ({keys})")
    listed = _overridden(kind, overrides)
    key = "streams" if kind == "concurrent" else "rate"
    given = listed if listed else config.get(key)
    if key in PROFILE_KEYS[kind] and given is None:
        raise InputError(f"{where}: give its {key}, e.g. {where},{key}=4 (or --override "
                         f"profile.{key} 1,2,4)")
    values = _numbers(f"{where},{key}", key, given, whole=kind == "concurrent") \
        if key in PROFILE_KEYS[kind] else ()
    cap = config.get("max_concurrency")
    levels = tuple(int(v) for v in values) if kind == "concurrent" else () if cap is None \
        else (int(_one(f"{where},max_concurrency", cap, whole=True)),)
    return GuideRun(kind=kind, levels=levels, rates=values if kind in OPEN_LOOP else (),
                    max_s=run.max_s, requests=run.requests, understood=run.understood)


def _known_kind(option: str, text: str, known: Collection[str],
                takes: str) -> tuple[str, dict[str, Value], str]:
    """An option's kind, the rest of its config, and how to name it (`--profile kind=K`):
    a kind kvlab does another way refused with that way, one it lacks with what it `takes`."""
    config = kind_config(option, text)
    kind = str(config.pop("kind"))
    where = f"{option} kind={kind}"
    if kind in INSTEAD:
        raise InputError(f"{where}: {INSTEAD[kind]}")
    if kind not in known:
        raise InputError(f"{where}: kvlab takes {takes}")
    return kind, config, where


BACKENDS = ("openai_http",)  # guidellm 0.8's --backend kinds kvlab speaks: OpenAI's API


def guide_backend(text: str | None, base_url: str | None, model: str | None,
                  say: Say) -> tuple[str | None, str | None]:
    """guidellm 0.8's `--backend kind=openai_http,target=URL[,model=M]` as the server's URL
    and model (said), beside `base_url` and `model` as given (each given once); what kvlab
    sets another way is refused."""
    if not text:
        return base_url, model
    _, config, where = _known_kind("--backend", text, BACKENDS,
                                   "openai_http (any OpenAI-compatible server)")
    target, named = config.pop("target", None), config.pop("model", None)
    if not isinstance(target, str) or not target:
        raise InputError(f"{where}: give its target, e.g. "
                         "kind=openai_http,target=http://127.0.0.1:8000")
    if named is not None and not isinstance(named, str):
        raise InputError(f"{where}: model={named!r} is not a model name")
    if config:
        raise InputError(f"{where}: kvlab reads its target and model; for "
                         f"{', '.join(sorted(config))} use kvlab load's own options "
                         "(kvlab load --help)")
    for flag, mine, theirs in (("--base-url", base_url, target), ("--model", model, named)):
        if mine and theirs and mine != theirs:
            raise InputError(f"--backend and {flag} name two servers or models ({theirs} and "
                             f"{mine}); give one")
    say(f"    --backend read as --base-url {target}" + (f" --model {named}" if named else ""))
    return target, named or model


def _overridden(kind: str, overrides: tuple[str, ...]) -> list[Value]:
    """`--override KEY VALUES` pairs (guidellm's nargs=2), each value one level."""
    if len(overrides) % 2:
        raise InputError(f"--override {' '.join(overrides)}: give KEY VALUES, e.g. "
                         "--override profile.streams 1,2,4")
    found: list[Value] = []
    for key, values in zip(overrides[::2], overrides[1::2], strict=True):
        if key not in OVERRIDES:
            raise InputError(f"--override {key}: kvlab takes profile.rate and profile.streams "
                             "(one level each); a limit is one for every level "
                             "(--constraint)")
        if kind not in OVERRIDES[key]:
            other = [k for k, kinds in OVERRIDES.items() if kind in kinds]
            raise InputError(f"--override {key}: --profile kind={kind} has no "
                             f"{key.removeprefix('profile.')}; " + (
                                 f"give --override {other[0]}" if other else "leave it out"))
        if found:
            raise InputError(f"--override {key}: give one list of values")
        parts = [p.strip() for p in values.split(",")]
        if not all(parts):
            raise InputError(f"--override {key} {values!r}: a value is missing between "
                             "commas")
        found = [_scalar(p) for p in parts]
    return found


def _limits(constraints: tuple[str, ...]) -> GuideRun:
    """--constraint max_duration and max_requests/min_requests as --max-seconds and
    --requests, each once."""
    max_s: float | None = None
    counts: dict[str, int] = {}
    said = []
    for text in constraints:
        kind, config, where = _known_kind("--constraint", text, LIMITS,
                                          "max_duration (--max-seconds), max_requests and "
                                          "min_requests (--requests)")
        key = LIMITS[kind]
        scope = config.pop("stopping_scope", "current")
        if scope != "current":
            raise InputError(f"{where},stopping_scope={scope}: kvlab runs every level; leave "
                             "it out")
        if set(config) != {key}:
            raise InputError(f"{where}: give {key}=N and nothing else")
        number = _one(f"{where},{key}", config[key], whole=key == "count")
        if kind == "max_duration":
            if max_s is not None:
                raise InputError(f"{where}: give it once")
            max_s = number
            said.append(f"{where},seconds={number:g}: as --max-seconds {number:g}")
        else:
            if kind in counts:
                raise InputError(f"{where}: give it once")
            counts[kind] = int(number)
            said.append(f"{where},count={int(number)}: as --requests {int(number)}")
    if len(set(counts.values())) > 1:
        raise InputError("--constraint max_requests and min_requests: both are kvlab's "
                         "--requests; give one count")
    return GuideRun(max_s=max_s, requests=next(iter(counts.values()), None),
                    understood=tuple(said))
