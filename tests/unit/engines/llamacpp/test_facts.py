"""llama-server's plan (the seed's serve flags) and the slot API's guards."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.errors import EngineError, RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import llamacpp


def test_golden_argv(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    s = Settings(llama_model=str(model), llama_slot_save_path=str(tmp_path / "slots"))
    plan = llamacpp.plan(s, "/bin/llama-server")
    assert plan.argv() == [
        "/bin/llama-server", "--model", str(model), "--alias", "local-chat", "--host",
        "127.0.0.1", "--port", "8080", "--ctx-size", "8192", "--parallel", "2",
        "--n-gpu-layers", "999", "--cache-prompt", "--cache-type-k", "q8_0", "--cache-type-v",
        "q8_0", "--slot-save-path", str(tmp_path / "slots"), "--metrics", "--slots",
    ]
    assert plan.private_dirs == (str(tmp_path / "slots"),)
    assert any("q8_0" in note for note in plan.notes)


def test_model_must_be_set_and_a_file(tmp_path: Path) -> None:
    with pytest.raises(RefusedError, match="LLAMA_MODEL is not set"):
        llamacpp.plan(Settings(), "llama-server")
    with pytest.raises(RefusedError, match="is not a file"):
        llamacpp.plan(Settings(llama_model=str(tmp_path / "x.gguf")), "llama-server")


@pytest.mark.parametrize("name", ["../x.bin", "/etc/passwd", "a/b.bin", "", ".hidden", "a..b"])
def test_slot_file_names_must_be_bare(name: str) -> None:
    with pytest.raises(RefusedError, match="bare name"):
        llamacpp.check_slot_filename(name)


def test_good_slot_name_and_url() -> None:
    assert llamacpp.check_slot_filename("lab-22_session.bin") == "lab-22_session.bin"
    assert llamacpp.slot_url("http://h:1", 0, "save") == "http://h:1/slots/0?action=save"
    with pytest.raises(RefusedError):
        llamacpp.slot_url("http://h:1", 0, "delete")


def test_missing_flags_are_named(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    plan = llamacpp.plan(Settings(llama_model=str(model)), "/bin/llama-server")
    accepted = frozenset(f.name for f in plan.flags)
    llamacpp.check_plan_flags(plan, accepted)
    with pytest.raises(EngineError, match="does not accept --slot-save-path, --slots"):
        llamacpp.check_plan_flags(plan, accepted - {"--slot-save-path", "--slots"})
