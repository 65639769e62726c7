"""Secrets stay out of everything kvlab writes (issue 14, items 11 and 12).

An `--api-key` given to an engine reaches the engine and nothing else: not the plan's argv,
shell line or JSON, not the log kvlab echoes, not the notebook's startup line. The notebook
refuses what slips past (secret names in any spelling, secrets inside lists and strings). A
secret put where a variable NAME belongs is never printed back.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from adversarial.engines.test_orphans import kvlab, kvlab_env, serving
from kvlab.core.errors import EngineError, SettingError
from kvlab.core.settings import Settings, load_settings
from kvlab.engines import PlanRequest, llamacpp, ports, process, vllm
from kvlab.engines.plan import EnginePlan
from kvlab.engines.roles import plan_for_role as build_plan
from kvlab.records import notebook
from kvlab.records.base import Record
from kvlab.records.link import LinkRecord, NixlCounters
from kvlab.records.notes import NotRunRecord
from kvlab.records.pd import PredictionRecord
from kvlab.records.reuse import ProofCase, ProofRecord, ReuseRecord
from kvlab.records.startup import StartupRecord

KEY = "sk-live-7f3a9c1e5b2d4f6a8c0e"
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123"
GPU = vllm.VllmInstall(("vllm",), "cuda", "PATH", None, "test")


def shown(plan: EnginePlan) -> str:
    """Every view of a plan a person or a record sees."""
    return "\n".join([" ".join(plan.argv()), plan.shell_line(), json.dumps(plan.as_dict())])


# ---- 11: plans show <redacted>, the process gets the real value ------------------------------

@pytest.mark.parametrize("extra", [
    ("--api-key", KEY), (f"--api-key={KEY}",), ("--hf-token", KEY), ("--API-KEY", KEY),
], ids=["two-args", "equals", "hf-token", "upper-case"])
def test_a_secret_flag_is_redacted_in_every_view_of_a_vllm_plan(extra: tuple[str, ...]) -> None:
    plan = vllm.plan(Settings(), "baseline", GPU, PlanRequest(extra_args=extra))
    assert KEY not in shown(plan)
    assert "<redacted>" in plan.argv()[-1]
    assert KEY in " ".join(plan.exec_argv())  # what the engine is started with


def test_a_secret_flag_is_redacted_in_a_llama_plan(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    settings = Settings(llama_model=str(model), llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(settings, "llama-server",
                         llamacpp.LlamaOptions(extra_args=("--api-key", KEY)))
    assert KEY not in shown(plan) and plan.exec_argv()[-2:] == ["--api-key", KEY]


def test_a_value_equal_to_a_known_secret_is_redacted_wherever_it_appears(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("LOADTEST_API_KEY", KEY)
    loaded = load_settings()
    plan = build_plan(loaded, "baseline", None, None,
                      ("--served-model-name", TOKEN, f"--hf-overrides={{\"k\": \"{KEY}\"}}"),
                      probe=False)
    assert TOKEN not in shown(plan) and KEY not in shown(plan)
    assert TOKEN in plan.exec_argv() and plan.secrets() >= {TOKEN, KEY}


def test_a_secret_the_engine_prints_is_redacted_in_the_error_kvlab_shows(tmp_path: Path) -> None:
    plan = EnginePlan(engine="fake", role="test", command=(
        sys.executable, "-c", "import sys; print('args:', sys.argv); sys.exit(3)"),
        flags=(), extra_args=("--api-key", KEY), port=ports.free_port())
    proc = process.EngineProcess(plan, tmp_path / "e.log")
    with pytest.raises(EngineError) as err:
        async_run(proc)
    assert "exited with code 3" in str(err.value) and "<redacted>" in str(err.value)
    assert KEY not in str(err.value)
    assert KEY in (tmp_path / "e.log").read_text()  # the engine's own output, kept as it is
    assert (tmp_path / "e.log").stat().st_mode & 0o777 == 0o600


def async_run(proc: process.EngineProcess) -> None:
    import asyncio

    async def enter() -> None:
        async with proc:
            pass

    asyncio.run(enter())


def test_serve_passes_the_api_key_to_the_engine_and_writes_it_nowhere(tmp_path: Path) -> None:
    env = kvlab_env(tmp_path, LOADTEST_API_KEY=TOKEN)
    with serving(tmp_path, env, "--", "--api-key", KEY, "--served-model-name", TOKEN) as served:
        engine_log = Path(str(served.engine()["log"]))
        served.proc.send_signal(signal.SIGTERM)
        served.wait()
        dry = kvlab(env, "serve", "baseline", "--dry-run", "--json", "--", "--api-key", KEY)
    # the engine got it (the wrapper printed its arguments into the engine's own log) ...
    assert f"--api-key {KEY}" in engine_log.read_text()
    # ... and nothing kvlab printed or wrote holds it
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != engine_log]
    assert Path(env["LABBOOK"]) in written
    for path in written:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert KEY not in text and TOKEN not in text, path
    startup = json.loads(Path(env["LABBOOK"]).read_text().splitlines()[-1])
    assert startup["argv"][-4:] == ["--api-key", "<redacted>", "--served-model-name",
                                    "<redacted>"]
    assert "non-default args:" in served.stderr()  # the echoed log, redacted
    assert dry.returncode == 0 and KEY not in dry.stdout + dry.stderr


# ---- 11: the notebook refuses what slips past -------------------------------------------------

def _link(**maps: dict[str, str]) -> Record:
    return LinkRecord(label="y", lab="z", **maps)


def _startup(argv: list[str]) -> Record:
    return StartupRecord(label="y", lab="z", engine="vllm", role="baseline", argv=argv)


def _said(text: str) -> Record:
    return NotRunRecord(label="y", lab="z", row="a row", reason=text)


# every place a typed record can carry free text or a key chosen by data: a map's keys, an
# argv, prose, nested lists
CARRYING_A_SECRET: dict[str, Callable[[], Record]] = {
    "Api-Key": lambda: _link(legs={"Api-Key": "x"}),
    "hf-token": lambda: _link(hosts={"hf-token": "x"}),
    "credentials": lambda: LinkRecord(label="y", lab="z",
                                      nixl={"credentials": NixlCounters()}),
    "passwd": lambda: _link(hosts={"passwd": "x"}),
    "nested": lambda: ReuseRecord(label="y", lab="z", metric_deltas={"u": {"X-Api-Key": 1}}),
    "rows": lambda: ProofRecord(label="y", lab="z", model="m", endpoints=[], verdicts={},
                                cases=[ProofCase(case="c", endpoint="e",
                                                 counter_deltas={"Authorization": 1})]),
    "argv": lambda: _startup(["vllm", "serve", "m", "--api-key", "abc123"]),
    "argv-token": lambda: _startup(["vllm", "--token", "abc123"]),
    "shell": lambda: _said(f"vllm serve m --api-key {KEY}"),
    "shell-equals": lambda: _said("vllm serve m --api-key=abc123"),
    "note": lambda: _said(f"the key was {KEY}"),
    "note-token": lambda: _said(f"HF_TOKEN={TOKEN}"),
    "header": lambda: _said("Bearer abcdefghijklmnopqrstuvwxyz"),
    "deep": lambda: ReuseRecord(label="y", lab="z",
                                turn_reasons=[["x", "--password", "hunter22"]]),
}


@pytest.mark.parametrize("make", CARRYING_A_SECRET.values(), ids=CARRYING_A_SECRET.keys())
def test_the_notebook_refuses_a_record_carrying_a_secret(tmp_path: Path,
                                                         make: Callable[[], Record]) -> None:
    book = tmp_path / "labbook.md"
    with pytest.raises(ValueError, match="secret") as err:
        notebook.append(book, make())
    assert not book.exists()
    assert KEY not in str(err.value) and TOKEN not in str(err.value) and "abc123" not in str(
        err.value)


HOLDING_NONE: dict[str, Callable[[], Record]] = {
    "redacted-argv": lambda: _startup(["vllm", "serve", "m", "--api-key", "<redacted>"]),
    "redacted-shell": lambda: _said("vllm serve m --api-key '<redacted>' --port 8000"),
    "key-file": lambda: _startup(["llama-server", "--api-key-file", "/etc/kvlab/key"]),
    "token-counts": lambda: PredictionRecord(label="y", lab="z", prompt_tokens=3,
                                             bytes_per_token=1.5),
    "prose": lambda: _said("a request with a Bearer token is refused with 401"),
}


@pytest.mark.parametrize("make", HOLDING_NONE.values(), ids=HOLDING_NONE.keys())
def test_the_notebook_takes_what_holds_no_secret(tmp_path: Path,
                                                 make: Callable[[], Record]) -> None:
    book = tmp_path / "labbook.md"
    notebook.append(book, make())
    assert len(notebook.read(book).records) == 1


# ---- 12: a secret where a variable name belongs is never printed back -------------------------

@pytest.mark.parametrize("name", ["PROXY_API_KEY_ENV", "LOADTEST_API_KEY_ENV"])
def test_a_secret_put_in_an_env_name_setting_is_not_echoed(tmp_path: Path, name: str) -> None:
    env = kvlab_env(tmp_path, **{name: KEY})
    result = kvlab(env, "settings")
    assert result.returncode == 2
    assert KEY not in result.stdout + result.stderr
    assert result.stderr.startswith(f"kvlab: {name}=(hidden)") and \
        result.stderr.count("\n") == 1


def test_a_secret_put_in_an_env_name_setting_in_dotenv_is_not_echoed(tmp_path: Path) -> None:
    env_file = tmp_path / "lab.env"
    env_file.write_text(f"PROXY_API_KEY_ENV='{KEY}'\n", encoding="utf-8")
    with pytest.raises(SettingError) as err:
        load_settings(env_file)
    assert KEY not in str(err.value) and "PROXY_API_KEY_ENV" in str(err.value)
