"""kvlab's small exception family.

Every error a user can cause (a bad setting, a missing file, an unreachable server, a refused
configuration) is a `KvlabError`; the CLI shows it as one line and exits with `exit_code`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class KvlabError(Exception):
    """A problem the user can fix; the message names the thing and what to do."""

    exit_code = 2


class SettingError(KvlabError):
    """A setting is invalid; the message names the key."""


class InputError(KvlabError):
    """A file, argument or notebook line is missing or malformed."""


class RefusedError(KvlabError):
    """A configuration kvlab will not run, because it would measure nothing or mislead."""


class EngineError(KvlabError):
    """An engine could not be installed, started, or reached."""


class UnreachableError(EngineError):
    """A server did not answer at its URL."""
