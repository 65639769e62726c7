"""`kvlab load` and `kvlab run-load` as commands: the seed's run-load.sh, Ctrl-C, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import seeds
from children import running
from kvlab.core.errors import EXIT_NOT_CONVERGED
from kvlab.engines.ports import free_port, port_in_use
from kvlab.records import notebook, requests
from kvlab.records.models import CapacityRecord, ComparisonRecord, LinkRecord, LoadRecord

FAKE = Path(__file__).resolve().parents[2] / "fakes" / "sse_upstream.py"
KVLAB = [sys.executable, "-m", "kvlab"]
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"


@contextmanager
def fake_upstream(*args: str) -> Iterator[str]:
    """The fake upstream, listening; its /v1 URL. Stopped however the test ends."""
    port = free_port()
    with running([sys.executable, str(FAKE), "--port", str(port), *args],
                 stdout=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 20
        while not port_in_use("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, \
                "fake upstream did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def fake() -> Iterator[str]:
    with fake_upstream("--tokens", "4") as url:
        yield url


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVLAB_PROFILE", "none")
    return tmp_path / "home"


def kvlab(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVLAB, *args], capture_output=True, text=True, timeout=120,
                          **kw)  # type: ignore[call-overload]


def test_load_writes_one_row_per_level_and_json(fake: str, home: Path, tmp_path: Path) -> None:
    run = kvlab("load", "--base-url", fake, "--model", "fake", "--concurrency", "1,3",
                "--requests", "6", "--max-tokens", "4", "--prompt-set", "mixed",
                "--label", "lg", "--engine", "vllm", "--preamble-tokens", "50", "--json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    book = notebook.read(tmp_path / "labbook.md")
    rows = book.of(LoadRecord)
    assert len(rows) == len(book.by_record("load"))
    assert [r.concurrency for r in rows] == [1, 3] == [r["concurrency"] for r in out["rows"]]
    assert all(r.ok == 6 and r.prompt_set == "mixed" and r.model == "fake"
               for r in rows)
    assert rows[0].ttft_s is not None and rows[0].tpot_s is not None
    assert {"p50", "p90", "p95", "p99", "mean", "std", "n"} <= set(
        rows[0].ttft_s.model_dump(exclude_none=True))
    assert rows[0].ttft_s.n == 6 and rows[0].tpot_s.n == 6
    # one warm-up request per concurrent one, left out; every request in the level's file
    assert [r.warmup_requests for r in rows] == [1, 3]
    for row in rows:
        assert row.requests_file is not None and row.warmup_requests is not None
        lines = requests.read(requests.location(tmp_path / "labbook.md", row.requests_file),
                              row.requests_sha256)
        assert row.requests_file.startswith(f"kvlab-requests/lg-c{row.concurrency}-")
        assert sum(x.warmup for x in lines) == row.warmup_requests
        assert len(lines) == row.warmup_requests + 6
    # the fake has no /tokenize: the word estimate was used, and the row says why
    assert rows[0].prompt_sizing is not None
    assert rows[0].prompt_sizing.method == "estimate"
    assert "no tokenizer endpoint answered" in rows[0].prompt_sizing.source


def test_load_with_a_duration_and_no_requests_set(fake: str, home: Path,
                                                  tmp_path: Path) -> None:
    run = kvlab("load", "--base-url", fake, "--model", "fake", "--concurrency", "2",
                "--duration", "0.5", "--min-requests", "4", "--warmup", "0",
                "--max-tokens", "2", "--no-progress", "--json")
    assert run.returncode == 0, run.stderr
    row = json.loads(run.stdout)["rows"][0]
    assert row["min_requests"] == 4 and row["requests"] >= 4 and row["warmup_requests"] == 0
    assert row["duration_s_requested"] == 0.5 and row["duration_reached"] is True
    # nothing set at all: enough requests for a p99 (the seed's REQUESTS=24 is not "set")
    auto = kvlab("load", "--base-url", fake, "--model", "fake", "--concurrency", "1",
                 "--max-tokens", "1", "--no-progress", "--json")
    assert auto.returncode == 0, auto.stderr
    assert json.loads(auto.stdout)["rows"][0]["requests"] == 200


def test_seed_run_load_with_kvlab_as_load_test(fake: str, home: Path, tmp_path: Path) -> None:
    script = seeds.extract("run-load.sh", tmp_path)
    compare = seeds.extract("compare-disagg.py", tmp_path)
    path = kvlab("load", "--print-load-test-path").stdout.strip()
    assert Path(path).is_file() and Path(path).is_relative_to(home)
    book = tmp_path / "labbook.md"
    env = {**os.environ, "LOAD_TEST": path, "SERVED_NAME": "fake", "CONCURRENCY": "1,2",
           "REQUESTS": "4", "MAX_TOKENS": "4", "LABBOOK": str(book), "CLUSTER_IFACE": "lo",
           "PROMPT_SET": "shared-prefix"}
    for label in ("disagg", "baseline"):
        run = subprocess.run(["bash", str(script), label, fake], env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr + run.stdout
    read = notebook.read(book)
    links = read.of(LinkRecord)
    assert len(links) == len(read.by_record("link"))
    assert [r.label for r in links] == ["disagg", "baseline"]
    assert links[0].rx_bytes is not None
    assert links[0].rx_bytes > 0 and links[0].concurrency == "1,2"
    assert len(read.by_record("load")) == 4
    # the system python3 runs the seed's comparison on kvlab's lines, unchanged
    seed = subprocess.run(["python3", str(compare), "--labbook", str(book)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert seed.returncode == 0, seed.stderr
    assert "bytes moved per request, observed" in seed.stdout
    compared = notebook.read(book).of(ComparisonRecord)[0].observed_bytes_per_request
    assert compared is not None and compared > 0


def test_run_load_in_process_writes_rows_and_link(fake: str, home: Path, tmp_path: Path) -> None:
    env = {**os.environ, "CLUSTER_IFACE": "lo", "SERVED_NAME": "fake", "CONCURRENCY": "2",
           "REQUESTS": "4", "MAX_TOKENS": "4", "CONNECTOR": "nixl", "CTX": "4096"}
    run = kvlab("run-load", "nixl-run", fake, "--preamble-tokens", "40", "--json", env=env)
    assert run.returncode == 0, run.stderr
    link = json.loads(run.stdout)["link"]
    seed_fields = {"lab", "record", "label", "base_url", "connector", "context_length",
                   "prompt_set", "concurrency", "requests", "iface", "wall_s", "rx_bytes",
                   "tx_bytes", "recorded_at"}
    assert seed_fields <= set(link)
    assert (link["connector"], link["context_length"], link["concurrency"]) == ("nixl", 4096, "2")
    assert link["requests_ok"] == 4 and link["load_generator"] == "kvlab"
    assert link["rx_bytes"] > 0
    assert [r.record for r in notebook.read(tmp_path / "labbook.md").records] == ["load",
                                                                                  "link"]
    # not the proxy's port and no legs at /health: what ran behind the URL is unknown
    # (single_machine is not known: None, which the written line leaves out)
    assert (link["topology"], link["link"]) == ("unknown", "unknown")
    assert "single_machine" not in link


def test_run_load_records_topology_on_every_row(fake: str, home: Path, tmp_path: Path) -> None:
    port = fake.rsplit(":", 1)[1].split("/")[0]
    env = {**os.environ, "SERVED_NAME": "fake", "CONCURRENCY": "1,2", "REQUESTS": "2",
           "MAX_TOKENS": "4", "CONNECTOR": "mooncake", "PROXY_PORT": port}
    run = kvlab("run-load", "disagg", fake, "--preamble-tokens", "40", "--no-progress",
                env=env)
    assert run.returncode == 0, run.stderr
    assert "topology: loopback" in run.stderr + run.stdout
    records = notebook.read(tmp_path / "labbook.md").records
    assert [r.record for r in records] == ["load", "load", "link"]
    for r in records:  # the URL is PROXY_PORT, PREFILL_HOST and DECODE_HOST are empty
        assert isinstance(r, LoadRecord | LinkRecord)
        assert (r.topology, r.single_machine, r.connector, r.link) == (
            "loopback", True, "mooncake", "loopback")
        assert r.hosts == {"prefill": "127.0.0.1", "decode": "127.0.0.1",
                           "proxy": "127.0.0.1"}
    two = kvlab("run-load", "disagg-two", fake, "--preamble-tokens", "40", "--no-progress",
                env={**env, "PREFILL_HOST": "node-a", "DECODE_HOST": "node-b",
                     "CONNECTOR": "shared", "CONCURRENCY": "1"})
    assert two.returncode == 0, two.stderr
    rows = notebook.read(tmp_path / "labbook.md").of(LoadRecord, "disagg-two")
    assert rows[0].topology == "two machines" and rows[0].single_machine is False
    assert rows[0].link == "unknown"  # CLUSTER_IFACE unset: the link is not guessed


def test_ctrl_c_keeps_measured_levels(home: Path, tmp_path: Path) -> None:
    with fake_upstream("--tokens", "20", "--itl-s", "0.05") as url, running(
            [*KVLAB, "load", "--base-url", url, "--model", "fake", "--concurrency", "2,2",
             "--requests", "6", "--max-tokens", "20", "--warmup", "0", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        book = tmp_path / "labbook.md"
        deadline = time.monotonic() + 60
        while not book.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the first level's row is written: now interrupt the second
        time.sleep(0.5)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    read = notebook.read(book)
    rows = read.of(LoadRecord)
    assert len(read.by_record("load")) == len(rows)
    assert len(rows) == 2 and rows[0].ok == 6 and rows[0].interrupted is None
    assert "interrupted" not in rows[0].line()
    assert rows[1].interrupted is True and rows[1].cancelled is not None
    assert rows[1].cancelled >= 1 and rows[1].failed == 0
    # the cut level's requests are in its file too, the cancelled ones marked so
    assert rows[1].requests_file is not None
    lines = requests.read(requests.location(book, rows[1].requests_file),
                          rows[1].requests_sha256)
    assert len(lines) == rows[1].requests and {x.status for x in lines} >= {"cancelled"}


@pytest.mark.parametrize(("args", "message"), [
    (["--slo", "ttft=5"], "--slo"),
    (["--concurrency", "1,x"], "CONCURRENCY"),
    (["--prompt-set", "nope"], "PROMPT_SET"),
    (["--slo", "ttft_p90<=0.5"], "a --find-capacity target"),
    (["--find-capacity"], "--find-capacity needs --slo"),
    (["--find-capacity", "--slo", "ttft_p90<=0.5", "--capacity-knob", "users"], "--users"),
    (["--users", "2", "--think-time", "soon"], "--think-time"),
    (["--users", "2", "--rate", "3"], "--rate"),
    (["--rate", "1,x"], "--rate"),
    (["--prompt-set", "shared-prefix", "--prefix-groups", "2", "--group-shares", "1"],
     "--group-shares"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace"),
])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, home: Path) -> None:
    run = kvlab("load", "--base-url", "http://127.0.0.1:9/v1", *args)
    assert run.returncode == 2 and message in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not Path("labbook.md").exists()


def test_missing_url_and_unknown_iface(home: Path) -> None:
    run = kvlab("load")
    assert run.returncode == 2 and "--base-url" in run.stderr
    run = kvlab("run-load", "x", "http://127.0.0.1:9/v1",
                env={**os.environ, "CLUSTER_IFACE": "nosuch9"})
    assert run.returncode == 2 and "CLUSTER_IFACE='nosuch9'" in run.stderr


def test_launcher_runs_with_a_python_lacking_kvlab(fake: str, home: Path, tmp_path: Path) -> None:
    path = kvlab("load", "--print-load-test-path").stdout.strip()
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    run = subprocess.run(["python3", "-I", path, "--base-url", fake, "--model", "fake",
                          "--concurrency", "1", "--requests", "2", "--max-tokens", "3",
                          "--prompt-set", "mixed", "--label", "l", "--engine", "llamacpp",
                          "--labbook", str(tmp_path / "b.md")], capture_output=True, text=True,
                         env=clean, timeout=120)
    assert run.returncode == 0, run.stderr
    first = notebook.read(tmp_path / "b.md").records[0]
    assert isinstance(first, LoadRecord) and first.engine == "llama.cpp"


def test_side_channel_bytes_are_compared_after_a_point_to_point_run(
        fake: str, home: Path, tmp_path: Path) -> None:
    env = {**os.environ, "SERVED_NAME": "fake", "CONCURRENCY": "2", "REQUESTS": "4",
           "MAX_TOKENS": "4", "CONNECTOR": "nixl", "SIDE_CHANNEL_ADDR": "127.0.0.1",
           "CLUSTER_IFACE": LOOPBACK}
    run = kvlab("run-load", "disagg", fake, "--preamble-tokens", "40", "--no-progress",
                env=env)
    assert run.returncode == 0, run.stderr
    book = tmp_path / "labbook.md"
    records = notebook.read(book).records
    last = records[-1]
    assert isinstance(last, LinkRecord) and last.side_channel is not None
    side = last.side_channel
    assert side.bytes_by_iface is not None and side.verdict is not None
    assert side.iface == LOOPBACK and side.bytes_by_iface[LOOPBACK] > 0
    assert side.verdict.startswith(f"SIDE_CHANNEL_ADDR 127.0.0.1 is on {LOOPBACK}, which "
                                   "moved")
    assert "side channel SIDE_CHANNEL_ADDR 127.0.0.1" in run.stdout
    # the comparison states it too
    for row in records[:-1]:
        notebook.append(book, type(row).model_validate(
            {**row.model_dump(), "label": "baseline"}))
    compared = kvlab("compare", "--labbook", str(book), env=env)
    assert compared.returncode == 0, compared.stderr
    assert f"side channel: SIDE_CHANNEL_ADDR 127.0.0.1 is on {LOOPBACK}" in compared.stdout
    channel = notebook.read(book).of(ComparisonRecord)[0].side_channel
    assert channel is not None and channel.iface == LOOPBACK
    # a shared-directory run advertises no side channel: nothing to check
    shared = kvlab("run-load", "shared-run", fake, "--preamble-tokens", "40", "--no-progress",
                   env={**env, "CONNECTOR": "shared"})
    assert shared.returncode == 0, shared.stderr
    last = notebook.read(book).records[-1]
    assert isinstance(last, LinkRecord) and last.side_channel is None


def test_load_user_sessions_and_a_rate_sweep(fake: str, home: Path, tmp_path: Path) -> None:
    run = kvlab("load", "--base-url", fake, "--model", "fake", "--users", "2,3", "--turns", "2",
                "--think-time", "fixed:0.05", "--max-tokens", "2", "--label", "u",
                "--no-progress", "--json")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert [r["concurrency"] for r in rows] == [2, 3] and [r["ok"] for r in rows] == [4, 6]
    assert all(r["workload"]["kind"] == "sessions" and r["sessions"]["conversations"] == r[
        "concurrency"] for r in rows)
    swept = kvlab("load", "--base-url", fake, "--model", "fake", "--concurrency", "4",
                  "--rate", "20,40", "--arrivals", "even", "--requests", "6", "--warmup", "0",
                  "--max-tokens", "2", "--label", "r", "--no-progress", "--json")
    assert swept.returncode == 0, swept.stderr
    assert [(r["concurrency"], r["rate"], r["arrivals"], r["ok"])
            for r in json.loads(swept.stdout)["rows"]] == [(4, 20.0, "even", 6),
                                                          (4, 40.0, "even", 6)]


def test_find_capacity_writes_its_probes_and_one_capacity_line(fake: str, home: Path,
                                                               tmp_path: Path) -> None:
    run = kvlab("load", "--base-url", fake, "--model", "fake", "--find-capacity",
                "--slo", "ttft_p90<=5,tpot_p90<=1", "--capacity-knob", "concurrency",
                "--capacity-steps", "2", "--duration", "0.3", "--min-requests", "5",
                "--max-tokens", "2", "--label", "c", "--json")
    # every load tried met the target: a lower bound, not a capacity, so not exit 0
    assert run.returncode == EXIT_NOT_CONVERGED, run.stderr
    assert "the search did not converge: at least 2 concurrent requests" in run.stderr
    out = json.loads(run.stdout)
    capacity = out["capacity"]
    assert capacity["record"] == "capacity" and capacity["knob"] == "concurrency"
    assert [s["load"] for s in capacity["steps"]] == [1, 2] and capacity["verdict"] == "at-least"
    assert capacity["target"]["bounds"] == {"ttft_p90": 5.0, "tpot_p90": 1.0}
    book = notebook.read(tmp_path / "labbook.md")
    assert [r.label for r in book.by_record("load")] == ["c-capacity"] * 2
    assert book.of(CapacityRecord)[0].capacity == 2.0


def test_a_load_against_a_url_takes_the_seeds_defaults_not_the_machines_profile(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here, so `auto` means cpu-tiny for the engines kvlab starts (8 requests a level,
    16 output tokens); a load against a URL got them too, although the server is someone
    else's. Now it takes the seed's defaults, says so, and sends what it says."""
    monkeypatch.delenv("KVLAB_PROFILE")
    with fake_upstream("--itl-s", "0") as fake:  # 200 answers of 128 tokens, at once
        run, tiny = _both_profiles(fake, monkeypatch)
    assert run.returncode == 0, run.stderr
    assert ("==> load: concurrency 1 (at least 200 requests a level), max_tokens 128, "
            "model 'fake'; defaults from profile none (a load against a server's URL") in run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert [(r["ok"], r["max_tokens"]) for r in rows] == [(200, 128)]
    assert tiny.returncode == 0, tiny.stderr
    assert [(r["ok"], r["max_tokens"]) for r in json.loads(tiny.stdout)["rows"]] == [(8, 16)]


def _both_profiles(fake: str, monkeypatch: pytest.MonkeyPatch
                   ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """One load with no profile set, one with KVLAB_PROFILE=cpu-tiny (a profile named)."""
    args = ("load", "--base-url", fake, "--model", "fake", "--concurrency", "1",
            "--no-progress", "--json")
    unset = kvlab(*args)
    monkeypatch.setenv("KVLAB_PROFILE", "cpu-tiny")
    return unset, kvlab(*args)


def test_vllm_bench_serve_names_are_understood(fake: str, home: Path, tmp_path: Path) -> None:
    """Coming from `vllm bench serve`: its server-root --base-url, its --endpoint path, and
    its names for the request count, concurrency and output length; each option failed as
    unknown, and the server root failed only at run time."""
    root = fake.removesuffix("/v1")
    run = kvlab("load", "--base-url", root, "--endpoint", "/v1/completions", "--model", "fake",
                "--num-prompts", "5", "--max-concurrency", "2", "--random-output-len", "3",
                "--no-progress", "--json")
    assert run.returncode == 0, run.stderr
    assert f"--base-url {root}: a server root, as vllm bench takes it; requests go to " \
        f"{fake}" in run.stderr
    rows = json.loads(run.stdout)["rows"]
    assert [(r["concurrency"], r["ok"], r["max_tokens"], r["endpoint"]) for r in rows] == \
        [(2, 5, 3, "completions")]
    rated = kvlab("load", "--base-url", fake, "--model", "fake", "--request-rate", "50",
                  "--max-concurrency", "4",
                  "--num-prompts", "4", "--max-tokens", "2", "--no-progress", "--json")
    assert rated.returncode == 0, rated.stderr
    assert [r["rate"] for r in json.loads(rated.stdout)["rows"]] == [50.0]
    wrong = kvlab("load", "--base-url", fake, "--endpoint", "/v1/embeddings", "--model", "x")
    assert wrong.returncode == 2 and "--endpoint '/v1/embeddings': give chat or " \
        "completions" in wrong.stderr, wrong.stderr
