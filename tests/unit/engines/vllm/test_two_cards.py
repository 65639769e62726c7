"""Two cards in one machine (the P/D lab's note): PREFILL_DEVICES and DECODE_DEVICES give each
instance its own card through the platform's variable, recorded, and never the same card."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kvlab.core.errors import SettingError
from kvlab.core.settings import Settings
from kvlab.engines import PlanRequest, vllm
from kvlab.engines.plan import EnginePlan
from kvlab.engines.ports import free_port


def _plan(tmp_path: Path, role: str, platform: str, **values: object) -> EnginePlan:
    install = vllm.VllmInstall(("vllm",), platform, "PATH")
    (tmp_path / "store").mkdir(exist_ok=True)
    settings = Settings(model="/models/m", kv_shared_path=str(tmp_path / "store"),
                        **values)  # type: ignore[arg-type]
    return vllm.plan(settings, role, install, PlanRequest(port=free_port()))


def test_each_role_sees_its_own_card_and_says_so(tmp_path: Path) -> None:
    cards = {"prefill_devices": "0", "decode_devices": "1"}
    prefill = _plan(tmp_path, "prefill", "cuda", **cards)
    decode = _plan(tmp_path, "decode", "cuda", **cards)
    assert prefill.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert decode.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert prefill.startup_facts.visible_devices == "CUDA_VISIBLE_DEVICES=0"
    rocm = _plan(tmp_path, "decode", "rocm", **cards)
    assert rocm.env["HIP_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES" not in rocm.env
    assert "CUDA_VISIBLE_DEVICES" not in _plan(tmp_path, "prefill", "cuda").env


def test_two_roles_on_one_card_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="share GPU 1"):
        _plan(tmp_path, "prefill", "cuda", prefill_devices="0,1", decode_devices="1")


def test_the_cpu_build_notes_the_setting_it_cannot_use(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "prefill", "cpu", prefill_devices="0")
    assert "CUDA_VISIBLE_DEVICES" not in plan.env
    assert any("PREFILL_DEVICES=0 ignored" in n for n in plan.notes)


@pytest.mark.parametrize("value", ["gpu0", "0;1", "-1"])
def test_a_device_list_that_is_no_list_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match="GPU indices or UUIDs"):
        Settings(prefill_devices=value)
    assert Settings(decode_devices=" 0, 1 ").decode_devices == "0,1"
    assert Settings(decode_devices="GPU-8f2e-11").decode_devices == "GPU-8f2e-11"
