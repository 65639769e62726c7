""".env files and setting values that are wrong on purpose (issue 14, items 12 and 13).

A line python-dotenv cannot parse is an error naming the file, line and key (exit 2), never a
warning printed three times while the setting falls back to its default; a key set twice is
one warning; non-finite and absurd numbers are refused. Properties (hypothesis) pin the
validators: whatever a file holds, loading it either works or says one line, and a value that
could be a secret is never in that line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adversarial.engines.test_orphans import kvlab, kvlab_env
from kvlab.core.errors import SettingError
from kvlab.core.settings import MAX_CTX, MAX_OFFLOAD_GB, load_settings

EXAMPLES = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def settings_cli(tmp_path: Path, text: str) -> tuple[int, str, str, Path]:
    """`kvlab settings --json` with `text` as ./.env: (exit code, stdout, stderr, the file)."""
    env_file = tmp_path / ".env"
    env_file.write_text(text, encoding="utf-8")
    env = kvlab_env(tmp_path)
    env.pop("KVLAB_PROFILE")  # the .env decides; no other setting from this shell
    result = kvlab(env, "--env-file", str(env_file), "settings", "--json")
    return result.returncode, result.stdout, result.stderr, env_file


# ---- 13: parse failures are errors ------------------------------------------------------------

@pytest.mark.parametrize(("text", "line", "key", "words"), [
    ('SERVED_NAME=a\nMODEL="m1\nCTX=4096\n', 2, "MODEL", "unclosed quote"),
    ("MODEL='sk-secret-model\n", 1, "MODEL", "unclosed quote"),
    ("SERVED_NAME=a\nMODEL\n", 2, "MODEL", "has no '='"),
    ("MODEL=m\n=value\n", 2, None, "not KEY=VALUE"),
    ("MODEL=m\n!!! not a setting\n", 2, None, "not KEY=VALUE"),
], ids=["unclosed-double", "unclosed-single", "no-equals", "no-key", "garbage"])
def test_an_unparsable_env_line_is_an_error_naming_file_line_and_key(
        tmp_path: Path, text: str, line: int, key: str | None, words: str) -> None:
    code, out, err, env_file = settings_cli(tmp_path, text)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "python-dotenv" not in err and "Traceback" not in err
    assert err.startswith(f"kvlab: {env_file}, line {line}: ") and words in err
    assert key is None or f" {key} " in err
    assert "sk-secret" not in err  # the line's value is never shown: it may be a key


def test_a_duplicate_key_warns_once_and_the_last_line_counts(tmp_path: Path) -> None:
    code, out, err, env_file = settings_cli(
        tmp_path, "SERVED_NAME=first\nCTX=2048\nSERVED_NAME=second\nCTX=1024\n")
    assert code == 0
    assert err.count("warning") == 1 and err.count("\n") == 1
    assert f"{env_file} sets SERVED_NAME (lines 1, 3); CTX (lines 2, 4) more than once" in err
    assert '"value": "second"' in out and '"value": "1024"' in out


@pytest.mark.parametrize(("text", "key"), [
    ("KV_OFFLOAD_GB=inf\n", "KV_OFFLOAD_GB"), ("KV_OFFLOAD_GB=nan\n", "KV_OFFLOAD_GB"),
    ("KV_OFFLOAD_GB=1e400\n", "KV_OFFLOAD_GB"), ("KV_OFFLOAD_GB=1e9\n", "KV_OFFLOAD_GB"),
    ("CTX=1e23\n", "CTX"), ("CTX=100000000000000000000000\n", "CTX"),
    ("PROXY_DECODE_TIMEOUT_S=nan\n", "PROXY_DECODE_TIMEOUT_S"),
], ids=["inf", "nan", "overflow", "petabytes", "ctx-float", "ctx-huge", "timeout-nan"])
def test_non_finite_and_absurd_numbers_are_refused(tmp_path: Path, text: str, key: str) -> None:
    code, _, err, _ = settings_cli(tmp_path, text)
    assert code == 2 and err.startswith(f"kvlab: {key}=") and err.count("\n") == 1


# ---- properties of the validators --------------------------------------------------------------

@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set variables for one hypothesis example (a fixture would span every example)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


literal = st.text(alphabet=st.characters(exclude_characters="\r\x00",
                                         exclude_categories=["Cs"]), min_size=1)


def single_quoted(value: str) -> str:
    """A value as .env writes it single-quoted: no interpolation; only \\ and \\' escaped."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@EXAMPLES
@given(served=literal, model=literal)
def test_any_quoted_value_round_trips(tmp_path: Path, served: str, model: str) -> None:
    text = f"SERVED_NAME={single_quoted(served)}\nMODEL={single_quoted(model)}\n"
    loaded = load_settings(_write(tmp_path, text))
    assert (loaded.values.served_name, loaded.values.model) == (served, model)


@EXAMPLES
@given(text=st.text(alphabet=st.characters(exclude_categories=["Cs"],
                                           exclude_characters="\x00"), max_size=200))
def test_any_file_loads_or_fails_with_one_line(tmp_path: Path, text: str) -> None:
    try:
        load_settings(_write(tmp_path, text))
    except SettingError as exc:
        assert "\n" not in str(exc) and str(exc)


secret_like = st.from_regex(r"(sk-|hf-|ghp-)[A-Za-z0-9]{12,40}", fullmatch=True)


@EXAMPLES
@given(value=secret_like, name=st.sampled_from(["PROXY_API_KEY_ENV", "LOADTEST_API_KEY_ENV"]),
       where=st.sampled_from(["environment", "file"]))
def test_a_secret_in_an_env_name_setting_is_refused_and_never_echoed(
        tmp_path: Path, value: str, name: str, where: str) -> None:
    with environment(**({name: value} if where == "environment" else {})), \
            pytest.raises(SettingError) as err:
        load_settings(_write(tmp_path, f"{name}={value}\n" if where == "file" else ""))
    assert value not in str(err.value) and value[3:] not in str(err.value)
    assert f"{name}=(hidden)" in str(err.value)


@EXAMPLES
@given(gb=st.floats(allow_nan=True, allow_infinity=True))
def test_kv_offload_gb_is_taken_only_when_finite_and_in_bounds(tmp_path: Path,
                                                                gb: float) -> None:
    path = _write(tmp_path, f"KV_OFFLOAD_GB={gb!r}\n")
    if math.isfinite(gb) and 0 < gb <= MAX_OFFLOAD_GB:
        assert load_settings(path).values.kv_offload_gb == gb
    else:
        with pytest.raises(SettingError, match=r"^KV_OFFLOAD_GB="):
            load_settings(path)


@EXAMPLES
@given(ctx=st.integers(min_value=-(2**80), max_value=2**80)
       | st.floats(allow_nan=True, allow_infinity=True).map(repr))
def test_ctx_is_taken_only_as_a_whole_number_in_bounds(tmp_path: Path, ctx: int | str) -> None:
    path = _write(tmp_path, f"CTX={ctx}\n")
    if isinstance(ctx, int) and 0 < ctx <= MAX_CTX:
        assert load_settings(path).values.ctx == ctx
    elif isinstance(ctx, str) and ctx.endswith(".0") and 0 < float(ctx) <= MAX_CTX:
        assert load_settings(path).values.ctx == int(float(ctx))  # "4096.0" is 4096
    else:
        with pytest.raises(SettingError, match=r"^CTX="):
            load_settings(path)


@EXAMPLES
@given(keys=st.lists(st.sampled_from(["MODEL", "CTX", "SERVED_NAME", "CLUSTER_PEERS"]),
                     min_size=1, max_size=8))
def test_duplicates_give_exactly_one_warning_naming_each_repeated_key(
        tmp_path: Path, keys: list[str]) -> None:
    values = {"MODEL": "m", "CTX": "2048", "SERVED_NAME": "s", "CLUSTER_PEERS": "a"}
    loaded = load_settings(_write(tmp_path, "".join(f"{k}={values[k]}\n" for k in keys)))
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    assert len(loaded.warnings) == (1 if repeated else 0)
    for key in repeated:
        assert f"{key} (lines " in loaded.warnings[0]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prop.env"
    path.write_text(text, encoding="utf-8")
    return path

