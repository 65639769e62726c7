"""A model's own tokenizer on this machine, read from its `tokenizer.json` (the file, or the
model directory holding it): for the proxy's prefix affinity and for prompts made in the
model's tokens where the server has no /tokenize."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvlab.core.errors import SettingError

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def load_tokenizer(path: str, use: str) -> Tokenizer:
    """The tokenizer at `path`; SettingError naming --tokenizer and what it is for (`use`)
    when there is none, or the tokenizers library cannot read it."""
    from tokenizers import Tokenizer

    found = Path(path).expanduser()
    if found.is_dir():
        found = found / "tokenizer.json"
    if not found.is_file():
        raise SettingError(f"--tokenizer {path}: no tokenizer.json there; give the model's "
                           f"directory (or its tokenizer.json) {use}")
    try:
        return Tokenizer.from_file(str(found))
    except Exception as exc:  # the Rust library raises its own exception type
        raise SettingError(f"--tokenizer {found}: not a tokenizer.json the tokenizers library "
                           f"reads ({exc})") from None
