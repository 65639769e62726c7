"""LLAMA_MODEL's fallback (`engines/llamacpp/model_gguf.py`): with LLAMA_MODEL unset, the GGUF
kvlab makes from MODEL once (said, kept under KVLAB_HOME by MODEL's content) and the plan that
serves it; random weights for a config-only MODEL, said so; a MODEL it cannot use named as the
reason the llama.cpp rows are not run. No llama-server starts (LLAMA_BIN is set, so none is
built either)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.core.errors import RefusedError
from kvlab.core.settings import Settings
from kvlab.engines import LLAMA_CPP, engine_for
from kvlab.engines.gguf_make import RANDOM_WEIGHTS
from kvlab.engines.llamacpp import facts, model_gguf
from kvlab.engines.llamacpp.adapter import NO_GGUF
from kvlab.engines.models import make_tiny, write_shaped_config


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(make_tiny(tmp_path_factory.mktemp("tiny") / "tiny").hf)


def settings(tmp_path: Path, model: str, **values: str) -> Settings:
    return Settings.model_validate({"model": model, "kvlab_home": str(tmp_path / "home"),
                                    "llama_bin": str(tmp_path / "bin"), **values})


def test_a_model_directory_is_made_into_a_gguf_once_and_served(tiny: Path,
                                                               tmp_path: Path) -> None:
    s = settings(tmp_path, str(tiny))
    llama = engine_for(LLAMA_CPP)
    assert llama.missing(s) is None
    with pytest.raises(RefusedError, match="no GGUF has been made from MODEL"):
        facts.plan(s, "llama-server")  # before the run prepares it
    said: list[str] = []
    llama.prepare(s, said.append)
    made = model_gguf.from_model(s)
    assert isinstance(made, model_gguf.FromModel) and not made.random
    assert made.target.is_file() and made.target.parent == s.home() / "models" / "gguf"
    assert made.target.name.startswith("hf-") and made.target.name.endswith("-v1.gguf")
    assert said[0] == f"llama.cpp: making a GGUF from MODEL ({tiny}; its safetensors " \
        f"weights, streamed), once, in {made.target}"
    assert said[1].startswith("llama.cpp: the GGUF made in ")
    assert facts.plan(s, "llama-server").flag_value("--model") == str(made.target)
    again: list[str] = []
    llama.prepare(s, again.append)
    assert again == []  # kept: not made twice
    # LLAMA_MODEL, when set, is what is served; nothing is made from MODEL
    other = settings(tmp_path / "other", str(tiny), llama_model=str(tiny.parent / "tiny.gguf"))
    llama.prepare(other, again.append)
    assert again == [] and not (tmp_path / "other" / "home" / "models").exists()


def test_a_config_only_model_gets_random_weights_and_says_so(tmp_path: Path) -> None:
    model = write_shaped_config(tmp_path / "shaped", "tiny")
    s = settings(tmp_path, str(model))
    said: list[str] = []
    engine_for(LLAMA_CPP).prepare(s, said.append)
    assert RANDOM_WEIGHTS in said[0]
    made = model_gguf.from_model(s)
    assert isinstance(made, model_gguf.FromModel) and made.random and made.target.is_file()


def test_a_model_it_cannot_use_is_the_reason_its_rows_are_not_run(tiny: Path,
                                                                  tmp_path: Path) -> None:
    hub = settings(tmp_path, "Qwen/Qwen3-8B")
    why = engine_for(LLAMA_CPP).missing(hub)
    assert why == f"{NO_GGUF}; and MODEL (Qwen/Qwen3-8B) is not a model directory on this " \
        "machine"
    said: list[str] = []
    engine_for(LLAMA_CPP).prepare(hub, said.append)
    assert said == []
    bin_only = tmp_path / "bin-only"
    bin_only.mkdir()
    (bin_only / "config.json").write_text((tiny / "config.json").read_text())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bin_only / name).write_text((tiny / name).read_text())
    (bin_only / "pytorch_model.bin").write_bytes(b"\0")
    assert "has .bin weights; kvlab reads safetensors" in str(
        engine_for(LLAMA_CPP).missing(settings(tmp_path, str(bin_only))))
