"""Which llama-server kvlab runs here, and why: LLAMA_BIN, the one on PATH, or kvlab's build
for this machine's device (`facts.find_llama_server`), as the adapter's `Install`.

Deliberately not here: building it (`engines/install.py`, `engines/llama_build.py`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import Settings
from kvlab.engines.base import HOST_TIER, ProgramInstall, Support
from kvlab.engines.llamacpp.facts import (
    SERVER_BINARY,
    build_target,
    find_llama_server,
    help_flags,
    not_found,
)
from kvlab.records import EngineChoice


@dataclass(frozen=True)
class LlamaInstall(ProgramInstall):
    """The llama-server binary this machine runs (None: none, and `reason` says the fix)."""

    origin: str = "not found"  # LLAMA_BIN, PATH or the kvlab build

    def supports(self, feature: str) -> Support:
        if feature == HOST_TIER:  # --cache-ram: its prompt cache in host RAM
            return Support(True)
        return Support(False, f"llama-server has no {feature!r} kvlab knows")

    def accepted_flags(self, cache_dir: Path) -> frozenset[str] | None:
        return help_flags(self.program) if self.program is not None else None

    def as_record(self) -> EngineChoice:
        return EngineChoice(command=str(self.program or SERVER_BINARY), origin=self.origin,
                            platform=self.platform, reason=self.reason)


def find_install(settings: Settings) -> LlamaInstall:
    """The llama-server this machine runs, or why there is none."""
    binary = find_llama_server(settings)
    device = build_target(settings).device
    if binary is None:
        return LlamaInstall(None, device, not_found(settings))
    origin = "LLAMA_BIN" if settings.llama_bin else "PATH" \
        if shutil.which(SERVER_BINARY) == str(binary) else "kvlab build"
    return LlamaInstall(binary, device, f"the llama-server {origin} gives", origin)
