"""A byte-level BPE tokenizer as a GGUF carries it, read from an HF directory's
tokenizer.json, tokenizer_config.json and chat_template.jinja (`gguf_make.py` writes it).

Only GPT-2's byte-level pre-tokenizer is taken (kvlab's own tokenizers, `models.py`): llama.cpp
names a tokenizer's pre-tokenizer by a fingerprint of its output, which kvlab does not compute
for others; those are refused with the setting that replaces the GGUF (LLAMA_MODEL).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from kvlab.core import InputError


@dataclass(frozen=True)
class Tokenizer:
    """What llama.cpp needs of a byte-level BPE tokenizer."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos: int
    eos: int
    pad: int | None
    template: str | None

    @classmethod
    def of(cls, model_dir: Path, vocab: int) -> Tokenizer:
        """From tokenizer.json, tokenizer_config.json and chat_template.jinja; refused unless
        GPT-2's byte-level pre-tokenizer (kvlab's own tokenizers), padded to `vocab`."""
        import gguf

        spec = _read(model_dir / "tokenizer.json", _TokenizerFile)
        pre = spec.pre_tokenizer or _Pre()
        if spec.model.type != "BPE" or pre.type != "ByteLevel" or not pre.use_regex \
                or pre.add_prefix_space:
            raise InputError(f"{model_dir}/tokenizer.json: kvlab writes byte-level BPE "
                             "tokenizers with GPT-2's pre-tokenizer only; set LLAMA_MODEL to a "
                             "GGUF (llama.cpp's convert_hf_to_gguf.py makes one)")
        special = {t.content: t.id for t in spec.added_tokens if t.special}
        ids = {**spec.model.vocab, **special}
        if not ids or max(ids.values()) >= vocab:
            raise InputError(f"{model_dir}: the tokenizer's ids do not fit config.json's "
                             f"vocab_size {vocab}")
        tokens = [f"[PAD{i}]" for i in range(vocab)]
        types = [int(gguf.TokenType.UNUSED)] * vocab
        for text, index in ids.items():
            tokens[index] = text
            types[index] = int(gguf.TokenType.CONTROL if text in special
                               else gguf.TokenType.NORMAL)
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec.model.merges]
        config = _read(model_dir / "tokenizer_config.json", _TokenizerConfig)

        def id_of(token: str | _Added | None) -> int | None:
            text = token.content if isinstance(token, _Added) else token
            return ids.get(text) if text is not None else None

        bos, eos = id_of(config.bos_token), id_of(config.eos_token)
        if bos is None or eos is None:
            raise InputError(f"{model_dir}/tokenizer_config.json: no bos_token or eos_token "
                             "in the tokenizer's vocabulary")
        file = model_dir / "chat_template.jinja"
        template = file.read_text(encoding="utf-8") if file.is_file() else \
            config.chat_template if isinstance(config.chat_template, str) else None
        return cls(tokens, types, merges, bos, eos, id_of(config.pad_token), template)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Added(_Loose):
    id: int = 0
    content: str
    special: bool = False


class _Bpe(_Loose):
    type: str | None = None
    vocab: dict[str, int] = {}
    merges: list[str | list[str]] = []


class _Pre(_Loose):
    type: str | None = None
    use_regex: bool = True
    add_prefix_space: bool = False


class _TokenizerFile(_Loose):
    """The parts of tokenizer.json a GGUF takes."""

    model: _Bpe
    pre_tokenizer: _Pre | None = None
    added_tokens: list[_Added] = []


class _TokenizerConfig(_Loose):
    """The parts of tokenizer_config.json a GGUF takes."""

    bos_token: str | _Added | None = None
    eos_token: str | _Added | None = None
    pad_token: str | _Added | None = None
    chat_template: str | list[object] | None = None


M = TypeVar("M", bound=BaseModel)


def _read(path: Path, model: type[M]) -> M:
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise InputError(f"{path}: not readable as a tokenizer file ({exc})") from None
