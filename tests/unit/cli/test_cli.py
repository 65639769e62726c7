"""The CLI boundary: --help everywhere, one-line errors with exit 2, one JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

from kvlab.cli import cli

DATA = Path(__file__).parents[2] / "data"


def all_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", *args], capture_output=True,
                          text=True, env=env, check=False)


@pytest.mark.parametrize("command", all_commands(), ids=lambda c: " ".join(c) or "kvlab")
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_predict_done_criterion() -> None:
    result = run("predict", "--config", str(DATA / "qwen3-8b-config.json"),
                 "--prompt-tokens", "4096", "--link-gbps", "10", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["bytes_per_token"] == 147456
    assert data["payload_bytes"] == 603979776
    assert data["transfer_s"] == pytest.approx(0.483, rel=0.01)


def test_predict_record_appends_a_prediction_line(tmp_path: Path) -> None:
    result = run("predict", "--shape", "qwen3-1.7b", "--prompt-tokens", "4096",
                 "--link-gbps", "2.5", "--record", "--json")
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "labbook.md").read_text().splitlines()
    record = json.loads(lines[-1])
    assert record["record"] == "prediction" and record["bytes_per_token"] == 114688
    assert record["ttft_prediction"].startswith("worse")


def test_nixl_prefill_without_side_channel_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("CONNECTOR=nixl\n")
    result = run("serve", "prefill", "--dry-run")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "SIDE_CHANNEL_ADDR" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_bad_setting_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("MEM_FRACTION=2\n")
    result = run("settings")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("kvlab: MEM_FRACTION=2.0") or \
        "MEM_FRACTION" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_file_is_one_line_exit_2() -> None:
    result = run("predict", "--config", "/nonexistent/config.json")
    assert result.returncode == 2 and "no such file" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_json_is_one_document_and_masks_secrets(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("HF_TOKEN=hf_abc123\nOTHER_LAB_KEY=1\nCTX=4096\n")
    result = run("settings", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["settings"]["CTX"] == {"value": "4096", "source": str(tmp_path / ".env")}
    assert data["settings"]["HF_TOKEN"]["value"] == "(set, hidden)"
    assert data["unknown_keys"] == ["OTHER_LAB_KEY"]
    assert "hf_abc123" not in result.stdout + result.stderr


def test_init_writes_and_refuses_to_overwrite(tmp_path: Path) -> None:
    assert run("init").returncode == 0
    text = (tmp_path / "env-example.txt").read_text()
    assert "MEM_FRACTION=0.85" in text and "# " in text
    again = run("init")
    assert again.returncode == 2 and "--force" in again.stderr


def test_dry_run_json_is_the_plan(tmp_path: Path) -> None:
    result = run("serve", "baseline", "--dry-run", "--json", "--port", "8311", "--",
                 "--seed", "7")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["port"] == 8311 and plan["argv"][-2:] == ["--seed", "7"]


def test_serve_offload_refuses_weight_offload() -> None:
    result = run("serve", "offload", "--dry-run", "--", "--cpu-offload-gb", "4")
    assert result.returncode == 2 and "WEIGHTS" in result.stderr
