"""Reading an engine's command line and answers the way the engines read them: a flag's last
value, every flag by its name, a connector config's fields, the launch sizes, a /tokenize
answer's tokens. Pure functions; each adapter passes its own flag names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from kvlab.core import is_secret_name
from kvlab.engines.base import LaunchSettings


def flag_value(argv: list[str], *names: str) -> str | None:
    """The value of the LAST of `names` in an argv (`--flag value` or `--flag=value`), as the
    engines' parsers take it: extra arguments after kvlab's own flags win."""
    found = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def has_flag(argv: list[str], name: str) -> bool:
    """Whether a switch (`--flag`, or `--flag=...`) is on the command line."""
    return any(arg == name or arg.startswith(name + "=") for arg in argv)


def _is_flag(arg: str) -> bool:
    return arg.startswith("-") and len(arg) > 1 and not arg[1:2].isdigit()


def argv_args(argv: Sequence[str], aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every flag of a command line by its name (`--max-num-batched-tokens 512` as
    `max_num_batched_tokens: 512`; a bare switch "True", `--no-x` as `x: False`), the last
    one winning, as the engines' parsers take them. `aliases` maps short spellings to long
    ones (llama.cpp's `-c` is `--ctx-size`). Words that are no flag's value are skipped;
    secret-bearing flags are left out."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not _is_flag(arg):
            continue
        name, eq, value = arg.partition("=")
        name = (aliases or {}).get(name, name)
        if not eq:
            if i < len(argv) and not _is_flag(argv[i]):
                value, i = argv[i], i + 1
            else:
                value = "True"
        key = name.lstrip("-").replace("-", "_")
        if key.startswith("no_") and value == "True":
            key, value = key[3:], "False"
        if not is_secret_name(key):
            out[key] = value
    return out


def config_word(text: str | None, key: str) -> str | None:
    """One string field of a connector config as a command line (JSON) or a log (a repr)
    spells it: `"kv_role":"kv_producer"` or `kv_role='kv_producer'`."""
    if not text:
        return None
    found = re.search(rf"""{key}['"]?\s*[:=]\s*['"]([\w.-]+)""", text)
    return found.group(1) if found else None


def int_value(text: str | None) -> int | None:
    """A flag's value as a whole number (None: absent, or not one)."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def launch_settings_from(argv: list[str], ctx_flags: tuple[str, ...],
                         fraction_flag: str | None, block_flags: tuple[str, ...] = (),
                         slot_flags: tuple[str, ...] = ()) -> LaunchSettings:
    """An engine's LaunchSettings, read with that engine's flag names (the last one wins)."""
    ctx = flag_value(argv, *ctx_flags)
    fraction = flag_value(argv, fraction_flag) if fraction_flag else None
    block = flag_value(argv, *block_flags) if block_flags else None
    slots = flag_value(argv, *slot_flags) if slot_flags else None
    return LaunchSettings(int_value(ctx), _float(fraction), int_value(block), int_value(slots))
