"""What a secret looks like, and how kvlab hides one: one rule for plans, logs and the notebook.

A secret is recognised by its name (a flag `--api-key`, a field `HF_TOKEN` or `Api-Key`), by
being the value of such a flag, by being a value kvlab knows is secret (from settings), or by
its shape (`sk-...`, `hf_...`, `Bearer ...`). Plans and logs replace it with `<redacted>` where
it is rendered; the notebook refuses a record that still carries one. This module never
stores a secret and never puts one in a message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "<redacted>"
# words that make a name secret wherever they appear in it (api_key, x_api_key, db_password)
_SECRET_WORDS = ("api_key", "apikey", "secret", "password", "passwd", "credential",
                 "authorization")
# names that are secret only whole: "token" is one, "prompt_tokens" and "per_token" are counts
_SECRET_NAMES = frozenset({"token", "hf_token", "access_token", "auth_token", "api_token",
                           "refresh_token", "id_token", "session_token", "bearer",
                           "bearer_token", "private_key"})
# a flag naming where a secret is kept (--api-key-file) carries a path, not the secret
_PATH_SUFFIXES = ("_file", "_path")
_FLAG_WITH_VALUE = re.compile(r"(?:^|\s)(--?[A-Za-z][\w-]*)(?:=|\s+)(['\"]?)([^\s'\"]+)")
# shapes of real keys: OpenAI-style sk-..., Hugging Face hf_..., an HTTP bearer credential
_KEY_SHAPES = (
    ("an sk- key", re.compile(r"\bsk-[A-Za-z0-9_-]{16,}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("a bearer credential", re.compile(r"\bBearer\s+(?!<redacted>)[A-Za-z0-9._~+/=-]{16,}")),
)


def _normal(name: str) -> str:
    return name.lstrip("-").strip().lower().replace("-", "_")


def is_secret_name(name: str) -> bool:
    """Whether a field or flag name (`api_key`, `--api-key`, `HF_TOKEN`, `Api-Key`) names a
    secret."""
    key = _normal(name)
    return key in _SECRET_NAMES or any(word in key for word in _SECRET_WORDS)


def is_secret_flag(arg: str) -> bool:
    """Whether a command-line flag (`--api-key`, `--hf-token=...`) takes a secret as its value."""
    if not arg.startswith("-"):
        return False
    name = arg.partition("=")[0]
    return is_secret_name(name) and not _normal(name).endswith(_PATH_SUFFIXES)


def secret_flag_values(argv: Sequence[str]) -> list[str]:
    """The values given to secret flags in `argv` (`--api-key X`, `--api-key=X`)."""
    out = []
    for i, arg in enumerate(argv):
        if is_secret_flag(arg):
            _, eq, value = arg.partition("=")
            out.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else ""))
    return [v for v in out if v]


def redact_text(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each known secret replaced by `<redacted>`."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """`argv` with the value of each secret flag and every known secret value, alone or inside
    an argument, replaced by `<redacted>`."""
    known = list(secrets)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if is_secret_flag(arg):
            name, eq, _ = arg.partition("=")
            hide_next = not eq
            arg = f"{name}={REDACTED}" if eq else arg
        out.append(redact_text(arg, known))
    return out


def secret_in_text(text: str) -> str | None:
    """What secret a string carries (`--api-key X` unredacted, a key's shape), or None; the
    answer never contains the secret."""
    for found in _FLAG_WITH_VALUE.finditer(text):
        if is_secret_flag(found.group(1)) and found.group(3) != REDACTED:
            return f"a {found.group(1)} value"
    for what, shape in _KEY_SHAPES:
        if shape.search(text):
            return what
    return None


def secret_in_list(items: Sequence[object]) -> str | None:
    """What secret an argv-like list carries (a secret flag then its value), or None."""
    for i, item in enumerate(items[:-1]):
        if (isinstance(item, str) and is_secret_flag(item) and "=" not in item
                and items[i + 1] != REDACTED):
            return f"a {item} value"
    return None
