"""LLAMA_MODEL's fallback: the GGUF kvlab makes from MODEL where LLAMA_MODEL is unset (a GPU
user sets MODEL alone), made once before llama-server starts (the adapter's `prepare`, said in
the progress lines) and kept under KVLAB_HOME by MODEL's content (`core/paths.py`); a plan
then serves it (`facts.made_model`). MODEL's weights are streamed into it; a config-only
directory (`kvlab models shaped`) gets random weights of its shape (`gguf_make.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core import InputError, Settings
from kvlab.engines.gguf_make import (
    RANDOM_WEIGHTS,
    VERSION,
    Dims,
    Stored,
    checked,
    read_header,
    read_json,
)
from kvlab.engines.gguf_tokens import Tokenizer
from kvlab.engines.local import content_digest


@dataclass(frozen=True)
class FromModel:
    """The GGUF kvlab makes from MODEL: the directory, where the GGUF is kept (by the
    directory's content), and whether it has weights (else random ones of its shape)."""

    source: Path
    target: Path
    random: bool

    def words(self) -> str:
        """What is made, for the progress lines."""
        what = RANDOM_WEIGHTS if self.random else "its safetensors weights, streamed"
        return f"a GGUF from MODEL ({self.source}; {what}), once, in {self.target}"


def made_path(settings: Settings) -> Path | None:
    """Where the GGUF made from MODEL is kept (None: MODEL is not a local directory with a
    config.json); nothing is read but its content's digest."""
    source = Path(settings.model).expanduser()
    if not (source / "config.json").is_file():
        return None
    digest = content_digest(str(source))
    return settings.paths().made_gguf(source.name, digest, VERSION) if digest else None


def from_model(settings: Settings) -> FromModel | str:
    """The GGUF kvlab would make from MODEL, or why it cannot (MODEL is a Hub id, or a
    directory of another architecture, tokenizer or weights): its config, tokenizer and
    weight headers are checked, no weight is read."""
    model = settings.model
    source = Path(model).expanduser()
    target = made_path(settings)
    if target is None:
        return f"MODEL ({model}) is not a model directory on this machine"
    try:
        dims = Dims.of(read_json(source / "config.json"), f"{source}/config.json")
        Tokenizer.of(source, dims.vocab)
        files = sorted(source.glob("*.safetensors"))
        stored: dict[str, Stored] = {}
        for file in files:
            stored |= read_header(file)
        if files:
            checked(stored, dims, str(source))
        elif any(source.glob("*.bin")):
            return f"MODEL ({model}) has .bin weights; kvlab reads safetensors"
    except InputError as exc:
        return str(exc)
    return FromModel(source, target, not files)
