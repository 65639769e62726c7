"""A replica profile read from a file: its fields, a profile line, or a notebook's last one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.core import InputError
from kvlab.plan.profile import read_profile
from kvlab.records import ProfileRecord, ReplicaProfile

FIELDS = {"block_tokens": 16, "device_blocks": 100, "prefill_s_per_token": 0.001,
          "decode_step_s": 0.01, "max_seqs": 4}


def test_the_fields_alone_are_labelled_given(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**FIELDS, "sources": {"device_blocks": "vllm log"}}))
    found = read_profile(str(path))
    assert found.device_blocks == 100
    assert found.sources["device_blocks"] == "vllm log"
    assert found.sources["max_seqs"] == "given"


def test_a_notebook_gives_its_last_profile_line(tmp_path: Path) -> None:
    lines = [ProfileRecord(label=f"m{i}", profile=ReplicaProfile.model_validate(
        {**FIELDS, "device_blocks": 100 + i})).line() for i in range(2)]
    path = tmp_path / "labbook.md"
    path.write_text(json.dumps({"record": "note", "x": 1}) + "\n"
                    + "".join(json.dumps(line) + "\n" for line in lines))
    assert read_profile(str(path)).device_blocks == 101


@pytest.mark.parametrize(("text", "said"), [
    (json.dumps({**FIELDS, "max_seqs": 0}), "max_seqs"),
    (json.dumps({**FIELDS, "speed": 2}), "speed"),
    ('{"record": "note"}\n{"record": "load"}\n', "no replica_profile line"),
    ("not json\n", "not a JSON line"),
])
def test_a_bad_profile_is_named(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(InputError, match=said):
        read_profile(str(path))
