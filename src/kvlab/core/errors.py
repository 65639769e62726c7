"""kvlab's small exception family.

Every error a user can cause (a bad setting, a missing file, an unreachable server, a refused
configuration) is a `KvlabError`; the CLI shows it as one line and exits with `exit_code`.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

# How a measuring command (`kvlab load`, `run-load`, `--find-capacity`) ends, beside
# KvlabError's 2 (a setting, input or configuration refused before anything was measured).
EXIT_MEASURED = 0
EXIT_ALL_FAILED = 1  # it ran, and every measured request failed
EXIT_NOT_CONVERGED = 3  # a capacity search ended without a bracket at its resolution
EXIT_INTERRUPTED = 130  # Ctrl-C: the levels measured are kept
EXIT_CODES = (f"Exit status: {EXIT_MEASURED} measured; {EXIT_ALL_FAILED} every request "
              f"failed; 2 a setting or input refused (nothing measured); "
              f"{EXIT_NOT_CONVERGED} --find-capacity ended without a bracket at its "
              f"resolution (its capacity line says between which loads); "
              f"{EXIT_INTERRUPTED} interrupted (measured levels kept).")


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
