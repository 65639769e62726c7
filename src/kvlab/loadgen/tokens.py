"""Exact prompt sizes before any engine starts: a local model directory's own tokenizer
(`tokenizer.json`) and chat template, applied as an OpenAI-compatible server applies them.

A chat request's prompt is the template rendered over its messages with the generation prompt
appended, then encoded without added special tokens (what vLLM's chat endpoint does; a template
that wants a BOS token writes it itself). The template is the directory's
`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (its `default` entry when
it is a list), rendered in jinja2's immutable sandbox with the names Hugging Face's templates
use (`raise_exception`, `strftime_now`, the special tokens, `tojson`).

`ChatTokens.sizing` drives `workloads.calibrate` with these counts, so that a plan's documents
are sized in the model's tokens and its counts are those of the prompts the load will send.
Deliberately not here: a tokenizer that is not local (a Hub name: the plan then says it used
the word estimate) and the server's own /tokenize (`sizing.py`, once a server runs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvlab.core import InputError
from kvlab.loadgen import workloads

if TYPE_CHECKING:
    from jinja2 import Template
    from tokenizers import Tokenizer

Messages = Sequence[dict[str, str]]
SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(frozen=True)
class ChatTokens:
    """A model directory's tokenizer and chat template: counts of text and of chat prompts."""

    tokenizer: Tokenizer
    template: Template | None  # None: the directory has no chat template
    source: str  # where the counts come from, for a plan to say

    @classmethod
    def of(cls, model: str | Path) -> ChatTokens | None:
        """The directory's tokenizer and template (None: `model` is no local directory with a
        tokenizer.json)."""
        directory = Path(model)
        path = directory / "tokenizer.json"
        if not path.is_file():
            return None
        from tokenizers import Tokenizer

        config = _config(directory)
        text = _template_text(directory, config)
        template = _compile(text, config) if text else None
        source = (f"{path} with the chat template of {directory}" if template is not None
                  else f"{path} (no chat template: the messages' text alone)")
        return cls(Tokenizer.from_file(str(path)), template, source)

    def text(self, text: str) -> int:
        """Tokens of plain text, as the server counts a completion's prompt."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def render(self, messages: Messages) -> str:
        """The prompt a chat request of `messages` becomes, generation prompt included."""
        if self.template is None:
            return "\n".join(m["content"] for m in messages)
        return str(self.template.render(messages=list(messages), add_generation_prompt=True))

    def chat(self, messages: Messages) -> int:
        """Tokens of a chat request's prompt: the template rendered, then encoded."""
        return self.text(self.render(messages))

    def sizing(self, seed: int, preamble_tokens: int) -> workloads.Sizing:
        """Words per token measured with this tokenizer, the shared preamble fitted to the
        token (`workloads.calibrate`)."""
        found = workloads.size_with(self.text, seed, preamble_tokens,
                                    f"the model's tokenizer.json ({self.source})")
        assert found is not None  # a local count never fails
        return found


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc}): fix or remove it") from exc
    return found if isinstance(found, dict) else {}


def _template_text(directory: Path, config: dict[str, Any]) -> str | None:
    """The directory's chat template: chat_template.jinja, else the tokenizer config's."""
    path = directory / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    found = config.get("chat_template")
    if isinstance(found, list):  # named templates: the default one
        found = next((t.get("template") for t in found
                      if isinstance(t, dict) and t.get("name") == "default"), None)
    return found if isinstance(found, str) else None


def _special(config: dict[str, Any], name: str) -> str:
    value = config.get(name)
    if isinstance(value, dict):  # an AddedToken written out
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _compile(text: str, config: dict[str, Any]) -> Template:
    """The template in jinja2's immutable sandbox, as Hugging Face's tokenizers render it."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now(UTC).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent,
                                                                  ensure_ascii=False)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       **{name: _special(config, name) for name in SPECIAL})
    return env.from_string(text)
