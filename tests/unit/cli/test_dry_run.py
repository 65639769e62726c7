"""A dry run starts, installs and writes nothing: it prints the plans and exits.

Each command runs with a fresh KVLAB_HOME and no engine installed, as on a new machine; it
exits 0 with its plans, or 2 with one line saying what is missing. `kvlab run all --dry-run`
also says, experiment by experiment, what would be installed first, what would be skipped and
why, and how long the experiment took when it last ran here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [("run", "offload"), ("run", "shared"), ("run", "disagg"), ("run", "replicas"),
            ("run", "all"),
            ("serve", "baseline"),
            ("serve", "decode"), ("serve", "offload"), ("serve", "llama")]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_dry_run_writes_nothing(tmp_path: Path, command: tuple[str, str]) -> None:
    home, tmp = tmp_path / "kvlab-home", tmp_path / "tmp"
    tmp.mkdir()
    (tmp_path / "store").mkdir()
    before = _tree(tmp_path)
    env = {**os.environ, "KVLAB_HOME": str(home), "TMPDIR": str(tmp),
           "KV_SHARED_PATH": str(tmp_path / "store"),
           "KV_OFFLOAD_GB": "0.5"}  # small enough for any machine's available memory
    result = subprocess.run([sys.executable, "-m", "kvlab", *command, "--dry-run", "--json"],
                            capture_output=True, text=True, env=env, check=False, timeout=300)
    if result.returncode == 0:
        assert json.loads(result.stdout)["dry_run"] is True
    else:  # llama-server's plan needs its model file: a one-line refusal, not a build
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
        assert command == ("serve", "llama") and "LLAMA_MODEL" in result.stderr
    assert not home.exists(), _tree(home)
    assert _tree(tmp_path) == before  # no notebook, no store, no temporary directory left


@pytest.mark.parametrize("args", [("disagg", "--label", "mine", "--dry-run"),
                                  ("disagg", "--repeat", "0", "--dry-run"),
                                  ("disagg", "--repeat", "auto:1", "--dry-run"),
                                  ("offload", "--repeat", "auto:1", "--dry-run"),
                                  ("offload", "--repeat", "auto:x", "--dry-run"),
                                  ("offload", "--repeat", "auto", "--tier", "on", "--dry-run"),
                                  ("interference", "--parallel", "4,4")])
def test_a_bad_run_option_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...]) -> None:
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "kvlab", "run", *args], capture_output=True,
                            text=True, env=env, check=False, timeout=300)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4 and "Traceback" not in result.stderr
    assert args[1] in result.stderr


@pytest.mark.parametrize("command", [("run", "offload"), ("serve", "baseline")], ids=" ".join)
def test_a_model_directory_that_is_not_here_is_one_line_and_exit_2(
        tmp_path: Path, command: tuple[str, str]) -> None:
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "MODEL": "/nonexistent/model"}
    result = subprocess.run([sys.executable, "-m", "kvlab", *command, "--dry-run"],
                            capture_output=True, text=True, env=env, check=False, timeout=300)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip().splitlines() == [
        "kvlab: MODEL=/nonexistent/model: no such file or directory on this machine; set MODEL "
        "to an existing model directory (or GGUF file) or to a Hugging Face id such as "
        "Qwen/Qwen3-8B"]


def test_one_tier_side_plans_only_that_side_of_the_pressure_pair(tmp_path: Path) -> None:
    """`--tier on` (a capacity search with the tier on, in a call of its own) plans the
    tier-on pressure engine and not the tier-off one; a GPU profile so the tier can run."""
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "KV_OFFLOAD_GB": "0.5",
           "KVLAB_PROFILE": "gpu-shaped", "VLLM_CMD": sys.executable,
           "KV_OFFLOAD_ALLOW_SWAP": "1"}  # the planned tier, sized to the working set
    result = subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", "--part",
                             "pressure", "--tier", "on", "--think-time", "exponential:7",
                             "--dry-run", "--json"], capture_output=True, text=True, env=env,
                            check=False, timeout=300)
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert [p["label"] for p in plans] == ["offload-on-load"]
    # KV_OFFLOAD_GB 0.5 is kept (the lab: start small), and said too small for the working set
    assert "--kv-offloading-size 0.5 " in plans[0]["shell"]
    assert "cannot hold the working set" in plans[0]["note"]
    held = subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", "--part",
                           "pressure", "--tier", "on", "--tier-gb", "working-set", "--dry-run",
                           "--json"], capture_output=True, text=True, env=env, check=False,
                          timeout=300)
    raised = json.loads(held.stdout)["plans"][0]
    assert "--kv-offloading-size 0.5 " not in raised["shell"] and "note" not in raised
    word = subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", "--tier-gb", "lots",
                           "--dry-run"], capture_output=True, text=True, env=env, check=False,
                          timeout=300)
    assert word.returncode == 2 and "--tier-gb 'lots'" in word.stderr
    small = subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", "--part",
                            "pressure", "--tier", "on", "--tier-gb", "3", "--dry-run", "--json"],
                           capture_output=True, text=True, env=env, check=False, timeout=300)
    assert "--kv-offloading-size 3 " in json.loads(small.stdout)["plans"][0]["shell"]
    bad = subprocess.run([sys.executable, "-m", "kvlab", "run", "offload", "--think-time",
                          "soon", "--dry-run"], capture_output=True, text=True, env=env,
                         check=False, timeout=300)
    assert bad.returncode == 2 and "--think-time 'soon'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_the_labs_own_pressure_method_is_one_flag_away(tmp_path: Path) -> None:
    """`--method lab`: the device cache as MEM_FRACTION leaves it, no cache size of kvlab's,
    no tier note sized for user sessions."""
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "KVLAB_PROFILE": "gpu-shaped",
           "VLLM_CMD": sys.executable, "KV_OFFLOAD_ALLOW_SWAP": "1", "MEM_FRACTION": "0.3"}
    args = [sys.executable, "-m", "kvlab", "run", "offload", "--part", "pressure",
            "--dry-run", "--json"]
    lab = subprocess.run([*args, "--method", "lab"], capture_output=True, text=True, env=env,
                         check=False, timeout=300)
    assert lab.returncode == 0, lab.stderr
    plans = json.loads(lab.stdout)["plans"]
    assert all("--gpu-memory-utilization 0.3 " in p["shell"] for p in plans)
    assert not any("--kv-cache-memory-bytes" in p["shell"] or "pressure" in p for p in plans)
    sessions = subprocess.run(args, capture_output=True, text=True, env=env, check=False,
                              timeout=300)
    assert all("--kv-cache-memory-bytes" in p["shell"]
               for p in json.loads(sessions.stdout)["plans"])


@pytest.mark.parametrize("command", ["offload", "disagg"])
def test_repeat_auto_is_a_run_options_value(tmp_path: Path, command: str) -> None:
    """`--repeat auto` and `auto:CAP` are taken where the sequential rule runs; a refused
    one is a single line naming the option."""
    env = {**os.environ, "KVLAB_HOME": str(tmp_path / "home"), "KV_OFFLOAD_GB": "0.5",
           "KV_SHARED_PATH": str(tmp_path)}
    for given in ("auto", "auto:3", "2"):
        done = subprocess.run([sys.executable, "-m", "kvlab", "run", command, "--repeat", given,
                               "--dry-run", "--json"], capture_output=True, text=True, env=env,
                              check=False, timeout=300)
        assert done.returncode == 0, done.stderr
    refused = subprocess.run([sys.executable, "-m", "kvlab", "run", command, "--repeat",
                              "auto:1", "--dry-run"], capture_output=True, text=True, env=env,
                             check=False, timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "kvlab: --repeat auto:1: give a cap of at least 2 rounds (the between-repeat interval "
        "needs two repeats a side)"]


def test_run_all_dry_run_says_each_experiment_and_its_last_time(tmp_path: Path) -> None:
    from kvlab.experiments import EXPERIMENTS, RUN_ALL
    from kvlab.records import StartupRecord, notebook

    book = tmp_path / "labbook.md"
    row = EXPERIMENTS["shared"].rows[0]  # an earlier run of the shared store: 2 min 5 s
    start = StartupRecord(label=row.startup[0], lab=row.lab, engine="vllm", role="shared-a",
                          ready_s=5.0, recorded_at="2026-12-01T10:00:05+0000", run_id="r1")
    last = StartupRecord(label=row.label, lab=row.lab, engine="vllm", role="shared-a",
                         recorded_at="2026-12-01T10:02:00+0000", run_id="r1")
    notebook.append(book, start)
    notebook.append(book, last)
    home = tmp_path / "kvlab-home"
    env = {**os.environ, "KVLAB_HOME": str(home), "LABBOOK": str(book)}
    done = subprocess.run([sys.executable, "-m", "kvlab", "run", "all", "--quick", "--dry-run",
                           "--json"], capture_output=True, text=True, env=env, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["dry_run"] is True
    seen = {e["experiment"]: e for e in found["experiments"]}
    assert list(seen) == list(RUN_ALL)
    for name, entry in seen.items():
        assert entry["rows"] == [r.title for r in EXPERIMENTS[name].rows]
        assert set(entry["engines"]) == set(EXPERIMENTS[name].engines)
        assert entry["sizes"], name
    assert seen["shared"]["last_took"].startswith("about 2 min 00 s (run r1")
    assert seen["disk"]["last_took"] == "no earlier run in the notebook"
    assert not home.exists()
    assert len(book.read_text(encoding="utf-8").splitlines()) == 2  # nothing written
