"""The proxy as an experiment starts it: `python -m kvlab.proxy ARGS_JSON`, a real process on
real sockets in front of fake engines; bad arguments are one line and exit 2."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import httpx
import pytest

from children import async_running
from fakes.fault_upstream import FaultUpstream
from kvlab.proxy import ProxyArgs, process_plan

START_S = 60.0


async def test_an_experiments_proxy_serves_both_legs_and_stops_on_sigterm() -> None:
    async with FaultUpstream() as prefill, FaultUpstream() as decode:
        plan = process_plan(ProxyArgs(prefill=(prefill.url,), decode=(decode.url,), workers=1))
        async with async_running(*plan.exec_argv(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE) as proc:
            assert proc.stderr is not None
            line = await asyncio.wait_for(proc.stderr.readline(), START_S)
            assert b"listening on port" in line, line
            before = len(prefill.generations()), len(decode.generations())  # the start check's
            async with httpx.AsyncClient(timeout=30) as client:
                answer = await client.post(plan.base_url + "/v1/completions", json={
                    "model": "fake-model", "prompt": "hello", "max_tokens": 4})
            assert answer.status_code == 200
            assert (len(prefill.generations()), len(decode.generations())) == (
                before[0] + 1, before[1] + 1)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0


@pytest.mark.parametrize("given", ['{"balance": "random"}', "not json", '{"port": 1, "x": 2}'])
def test_bad_arguments_are_one_line_and_exit_2(given: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kvlab.proxy", given], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("kvlab: proxy arguments:") and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_where_it_listens_is_flags_a_placement_can_move() -> None:
    from kvlab.cluster.placement import rebind

    plan = rebind(process_plan(ProxyArgs(decode=("http://d:1",))), "10.0.0.2", 8123)
    argv = plan.exec_argv()
    assert argv[argv.index("--host") + 1] == "10.0.0.2" and argv[argv.index("--port") + 1] == "8123"
    given = ProxyArgs.model_validate_json(next(a for a in argv if a.startswith("{")))
    assert given.host is None and given.port is None and given.decode == ("http://d:1",)
