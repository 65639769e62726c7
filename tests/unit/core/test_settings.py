"""Settings: seed names, precedence one pair at a time, refusals naming the key, secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.core.env_example import env_example_text
from kvlab.core.errors import SettingError
from kvlab.core.settings import load_settings

SEED_KEYS = Path(__file__).parents[2] / "data" / "seed-env-keys.env"


def write_env(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".env"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_seeds_own_env_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from seeds import extract

    monkeypatch.delenv("LABBOOK")
    path = extract("env-example.txt", tmp_path)
    loaded = load_settings(path)
    assert loaded.unknown_keys == []
    assert loaded.values.kv_offload_gb == 8 and loaded.values.llama_cache_type == "q8_0"
    assert loaded.values.requests == 24  # the seed's file sets it: used as given


def test_requests_unset_is_shown_as_what_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABBOOK")
    monkeypatch.setenv("KVLAB_PROFILE", "none")
    rows = {key: (value, source) for key, value, source in load_settings().rows()}
    assert rows["REQUESTS"] == ("max(10 x concurrency, 200) a level", "default")


def test_defaults_are_the_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABBOOK")
    s = load_settings().values
    assert (s.model, s.small_model, s.served_name) == ("Qwen/Qwen3-8B", "Qwen/Qwen3-1.7B",
                                                       "local-chat")
    assert (s.prefill_port, s.decode_port, s.proxy_port, s.llama_port) == (8100, 8200, 8000, 8080)
    assert (s.ctx, s.max_seqs, s.mem_fraction, s.split_mem_fraction) == (8192, 8, 0.85, 0.40)
    # REQUESTS unset: one default, the load generator's, shown as used (a seed .env's
    # REQUESTS=24 is used as given)
    assert s.concurrency == (1, 4, 8) and s.requests is None and s.max_tokens == 128
    assert s.connector == "shared" and s.kv_offload_backend == "native"
    assert s.labbook == "labbook.md" and s.serve_host == "127.0.0.1"


def test_seed_env_file_loads_and_lists_unknown_keys(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABBOOK")
    text = SEED_KEYS.read_text(encoding="utf-8") + "\nCLUSTER_PEERS=a,b\nMODELS_DIR=/srv/models\n"
    env = write_env(tmp_path, text)
    loaded = load_settings(env)
    assert loaded.values.served_name == "local-chat"
    assert loaded.values.prefill_host == ""  # empty in the seed file means unset
    assert loaded.unknown_keys == ["CLUSTER_PEERS", "MODELS_DIR"]
    assert loaded.sources["connector"] == str(env)


@pytest.mark.parametrize(
    ("higher", "lower", "expected_source"),
    [
        ("flag", "environment", "flag"),
        ("environment", "dotenv", "environment"),
        ("dotenv", "profile", "dotenv"),
        ("profile", "default", "profile"),
        ("flag", "dotenv", "flag"),
    ],
)
def test_precedence_one_pair_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       higher: str, lower: str, expected_source: str) -> None:
    values = {"flag": "9001", "environment": "9002", "dotenv": "9003", "profile": "9004"}
    env_file = None
    overrides = {}
    profile = None
    for layer in (higher, lower):
        if layer == "flag":
            overrides["decode_port"] = int(values["flag"])
        elif layer == "environment":
            monkeypatch.setenv("DECODE_PORT", values["environment"])
        elif layer == "dotenv":
            env_file = write_env(tmp_path, f"DECODE_PORT={values['dotenv']}\n")
        elif layer == "profile":
            def profile(_first: object) -> tuple[str, str, dict[str, object]]:
                return "test", "test", {"decode_port": int(values["profile"])}
    loaded = load_settings(env_file, overrides, profile_values=profile)
    assert loaded.values.decode_port == int(values[higher])
    source = loaded.sources["decode_port"]
    if expected_source == "dotenv":
        assert source == str(env_file)
    elif expected_source == "profile":
        assert source == "profile test"
    else:
        assert source == expected_source


def test_default_when_nothing_set() -> None:
    loaded = load_settings()
    assert loaded.values.decode_port == 8200 and loaded.sources["decode_port"] == "default"


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("DECODE_PORT=eighty", "DECODE_PORT"),
        ("PROXY_PORT=70000", "PROXY_PORT"),
        ("MEM_FRACTION=1.5", "MEM_FRACTION"),
        ("MEM_FRACTION=0", "MEM_FRACTION"),
        ("SPLIT_MEM_FRACTION=-0.1", "SPLIT_MEM_FRACTION"),
        ("CONNECTOR=rdma", "CONNECTOR"),
        ("KV_OFFLOAD_BACKEND=disk", "KV_OFFLOAD_BACKEND"),
        ("CONCURRENCY=1,four", "CONCURRENCY"),
        ("PROMPT_SET=random", "PROMPT_SET"),
        ("LLAMA_CACHE_TYPE=q3_k", "LLAMA_CACHE_TYPE"),
        ("LOADTEST_API_KEY_ENV=sk-live-123", "LOADTEST_API_KEY_ENV"),
    ],
)
def test_invalid_values_are_refused_naming_the_key(tmp_path: Path, line: str, key: str) -> None:
    env = write_env(tmp_path, line + "\n")
    with pytest.raises(SettingError) as err:
        load_settings(env)
    message = str(err.value)
    assert message.startswith(key + "=") and str(env) in message
    assert "\n" not in message


def test_concurrency_parses_the_seed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCURRENCY", " 2, 16 ,64")
    assert load_settings().values.concurrency == (2, 16, 64)


def test_host_lists_parse_and_the_single_names_keep_working(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFILL_HOSTS", " node-a, node-c ,")
    monkeypatch.setenv("DECODE_HOST", "node-b")
    s = load_settings().values
    assert s.prefill_hosts == "node-a,node-c"
    assert (s.hosts("prefill"), s.hosts("decode")) == (("node-a", "node-c"), ("node-b",))
    assert load_settings(overrides={"prefill_hosts": "", "decode_host": ""}).values.hosts(
        "decode") == ()
    # the same node in both forms is no conflict
    monkeypatch.setenv("DECODE_HOSTS", "node-b")
    assert load_settings().values.hosts("decode") == ("node-b",)


def test_a_single_host_and_a_list_that_differ_are_one_refusal_naming_both(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFILL_HOST", "node-a")
    monkeypatch.setenv("PREFILL_HOSTS", "node-a,node-c")
    with pytest.raises(SettingError) as caught:
        load_settings()
    message = str(caught.value)
    assert message == ("PREFILL_HOST=node-a and PREFILL_HOSTS=node-a,node-c name different "
                       "prefill nodes: set PREFILL_HOSTS alone (every prefill node) or "
                       "PREFILL_HOST alone (one)")
    monkeypatch.delenv("PREFILL_HOST")
    monkeypatch.setenv("DECODE_HOSTS", "node-b,node-b")
    with pytest.raises(SettingError, match=r"^DECODE_HOSTS='node-b,node-b' \(from environment\) "
                       r"is invalid: lists node-b more than once"):
        load_settings()


def test_secret_is_masked_and_never_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    loaded = load_settings()
    rows = {key: value for key, value, _ in loaded.rows()}
    assert rows["HF_TOKEN"] == "(set, hidden)"
    assert "hf_supersecret" not in json.dumps(loaded.rows())
    assert loaded.values.hf_token.get_secret_value() == "hf_supersecret"


def test_invalid_secret_value_is_not_echoed(tmp_path: Path) -> None:
    env = write_env(tmp_path, "CONNECTOR=bogus\n")
    with pytest.raises(SettingError, match="CONNECTOR='bogus'"):
        load_settings(env)


def test_missing_env_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="no such file"):
        load_settings(tmp_path / "nope.env")


def test_generated_env_example_covers_every_setting_and_loads(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.delenv("LABBOOK")
    env = write_env(tmp_path, env_example_text())
    loaded = load_settings(env)
    assert loaded.unknown_keys == []
    assert loaded.values.model == "Qwen/Qwen3-8B"
    assert "HF_TOKEN=\n" in env_example_text()


def test_init_file_leaves_the_shell_switches_to_the_shell(tmp_path: Path) -> None:
    """`. ./.env` in a seed script must not override `OFFLOAD=0 bash serve-offload.sh`."""
    import subprocess

    env = write_env(tmp_path, env_example_text())
    shell = {"OFFLOAD": "0", "SINGLE_MACHINE": "1", "MONOLITHIC": "1", "VLLM_TAG": "v0.11.0",
             "LLAMA_BIN": "/opt/llama"}
    sourced = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; set -a; . {env}; set +a; "
         + "; ".join(f'echo "{k}=${k}"' for k in shell)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **shell}, check=False)
    assert sourced.returncode == 0, sourced.stderr
    assert sourced.stdout.split() == [f"{k}={v}" for k, v in shell.items()]
    assert "# OFFLOAD=1\n" in env.read_text(encoding="utf-8")


def test_init_file_sets_no_variable_a_seed_script_reads_from_the_shell() -> None:
    """Every name the seed scripts read (`${NAME:-...}`) but the seed's env-example.txt does
    not set stays commented out in kvlab's file."""
    import re

    from seeds import seed_text

    text = seed_text()
    if not text:
        pytest.skip("seed documents are not at hand")
    read = set(re.findall(r"\$\{([A-Z_]+):-", text))
    seed_env = set(re.findall(r"^([A-Z_]+)=", SEED_KEYS.read_text(encoding="utf-8"), re.M))
    assigned = set(re.findall(r"^([A-Z_]+)=", env_example_text(), re.M))
    assert {"OFFLOAD", "SINGLE_MACHINE", "MONOLITHIC"} <= read - seed_env
    assert assigned & (read - seed_env) == set()


def test_engine_secret_env_carries_hf_token_only_when_set(tmp_path: Path) -> None:
    assert load_settings().values.engine_secret_env() == {}
    env = write_env(tmp_path, "HF_TOKEN=hf_from_dotenv\n")
    assert load_settings(env).values.engine_secret_env() == {"HF_TOKEN": "hf_from_dotenv"}
