"""A dataset the user brings: ShareGPT conversations or JSON lines of prompts, read once and
refused in one line when malformed, then sent as prompts or replayed as user sessions.

Two shapes, told apart by their records (`--dataset-name auto`), or named:

- **ShareGPT** (`sharegpt`, as `vllm bench serve --dataset-name sharegpt` reads it): a JSON
  list of records, each with `conversations`, a list of `{"from": ..., "value": ...}`
  messages. `human`/`user` is the user; `gpt`/`chatgpt`/`bard`/`bing`/`assistant` the
  assistant; `system` a system message, first only. A leading assistant message is dropped
  (ShareGPT cut long chats into parts, later parts open with the reply), as vLLM's multi-turn
  converter does. vllm bench skips records without `conversations` and sends only the first
  message; here a record is skipped, and counted with its reason, when it has no
  `conversations`, no user message, an empty one, a speaker not listed above, or speakers that
  do not alternate.
- **Prompts** (`custom`, as vllm bench's custom dataset, guidellm's `--data` file and aiperf's
  single-turn files): one JSON object a line, its prompt under the first of `PROMPT_KEYS` it
  holds, an optional output length under `OUTPUT_KEYS`, an optional system message under
  `SYSTEM_KEYS`; other keys are ignored. A blank prompt is skipped.

- **Turns** (`multi_turn`, aiperf's multi-turn files): one JSON object a line holding `turns`,
  a list of objects each with its user message under `PROMPT_KEYS` (or aiperf's `texts`, its
  first) and an optional output length; each record is a conversation.

Either shape may be a JSON list or JSON lines; `auto` reads a file as ShareGPT when any record
holds `conversations` (the others are then skipped, as vllm bench skips them), as turns when
one holds `turns`, else as prompts.
A record with one user message is a prompt; one with several is a conversation, whose user
messages the session machinery (`sessions.SessionRun`) sends one by one, each with the
conversation so far as this server answered it (the recorded assistant messages are not sent),
after a think time. Levels and repeats go on through the file, so no level resends what an
earlier one sent until the file runs out (`first_record`, then `resent` in the row). Nothing of
the file's text reaches the notebook: its name and sha256 do. Not here: building the requests'
bytes and the schedule (`payloads`, `level`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvlab.core import InputError
from kvlab.loadgen.workloads import Prompt
from kvlab.records import DatasetEvidence

DatasetName = Literal["auto", "sharegpt", "custom", "multi_turn"]
# --dataset-name (or aiperf's --custom-dataset-type) of a file, as it is read
FILE_KINDS: dict[str, DatasetName] = {"auto": "auto", "sharegpt": "sharegpt",
                                      "custom": "custom", "single_turn": "custom",
                                      "multi_turn": "multi_turn"}
PROMPT_KEYS = ("prompt", "text_input", "text", "instruction", "question", "input", "content")
OUTPUT_KEYS = ("output_tokens", "output_length", "output_tokens_count",
               "completion_tokens_count", "max_tokens", "output_len")
SYSTEM_KEYS = ("system_prompt", "system")
USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
SPEAKERS = {"human": USER, "user": USER, "gpt": ASSISTANT, "chatgpt": ASSISTANT,
            "bard": ASSISTANT, "bing": ASSISTANT, "assistant": ASSISTANT, "system": SYSTEM}
MAX_MESSAGE_CHARS = 4_000_000  # about a million tokens: longer than any model's context


@dataclass(frozen=True)
class Turn:
    """One user message and the output length its record asks for (None: the run's)."""

    text: str
    output_tokens: int | None = None


@dataclass(frozen=True)
class Entry:
    """A usable record: its place in the file, its system message, its user messages."""

    number: int  # 0-based record (line) number in the file
    turns: tuple[Turn, ...]
    system: str | None = None

    def messages(self, turn: int, history: tuple[tuple[str, str], ...] = ()
                 ) -> tuple[tuple[str, str], ...]:
        """Turn `turn`'s messages: the system message, the conversation so far, the turn."""
        head = ((SYSTEM, self.system),) if self.system else ()
        return (*head, *history, (USER, self.turns[turn].text))


@dataclass(frozen=True)
class DatasetSpec:
    """Which file, read as what."""

    path: str
    name: DatasetName = "auto"


@dataclass(frozen=True)
class Dataset:
    """The usable records of a file, and what was left out and why."""

    file: str
    sha256: str
    format: Literal["sharegpt", "prompts", "multi_turn"]
    entries: tuple[Entry, ...]
    records: int
    skipped: dict[str, int] = field(default_factory=dict)
    keys: tuple[str, ...] = ()

    @property
    def conversations(self) -> int:
        return sum(len(e.turns) > 1 for e in self.entries)

    @property
    def user_turns(self) -> int:
        """Requests one pass of the file sends."""
        return sum(len(e.turns) for e in self.entries)

    @property
    def max_turns(self) -> int:
        return max(len(e.turns) for e in self.entries)

    def at(self, position: int) -> Entry:
        """The record at `position` of the run's walk through the file (it begins again at
        the end)."""
        return self.entries[position % len(self.entries)]

    def conversations_for(self, first: int, turns: int | None) -> int:
        """Records from `first` on that hold at least `turns` user turns (None: one pass)."""
        if turns is None:
            return len(self.entries)
        count = sent = 0
        while sent < turns:
            sent += len(self.at(first + count).turns)
            count += 1
        return count

    def evidence(self, first: int, positions: set[int], outputs: list[int],
                 max_tokens: int) -> DatasetEvidence:
        """What a row says: the file, and what this level sent of it (`positions` from the
        run's start, `outputs` the file's output lengths of the requests sent)."""
        return DatasetEvidence(
            file=self.file, sha256=self.sha256, format=self.format, records=self.records,
            usable=len(self.entries), skipped=dict(self.skipped), keys=list(self.keys),
            conversations=self.conversations, sent=len(positions),
            first_record=first % len(self.entries),
            resent=sum(p >= len(self.entries) for p in positions),
            outputs_from_file=len(outputs),
            outputs_capped=sum(n > max_tokens for n in outputs))


def prompt(entry: Entry, index: int, max_tokens: int, *, turn: int = 0,
           history: tuple[tuple[str, str], ...] = (), conversation: int | None = None
           ) -> Prompt:
    """Turn `turn` of `entry` as a request's prompt (its output length capped at the run's)."""
    wanted = entry.turns[turn].output_tokens
    return Prompt(index, entry.messages(turn, history),
                  conversation=conversation, turn=turn if conversation is not None else None,
                  max_tokens=min(wanted, max_tokens) if wanted else None)


# --- reading --------------------------------------------------------------------------------

@dataclass
class _Reading:
    """What reading a file has found so far."""

    where: str  # the file, for messages
    name: DatasetName
    entries: list[Entry] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    keys: dict[str, None] = field(default_factory=dict)  # in the order first read


SYNTHETIC_KEYS = ("prompt_tokens", "output_tokens")


def synthetic(given: str | None) -> tuple[int, int | None] | None:
    """guidellm's synthetic `--data "prompt_tokens=N,output_tokens=M"` (0.8's with
    `kind=synthetic_text,` first) as (N, M), or None
    when `given` is a file name (InputError for a spec kvlab cannot send)."""
    if not given or "=" not in given or Path(given).exists():
        return None
    found: dict[str, int] = {}
    for part in given.replace(" ", "").split(","):
        key, _, value = part.partition("=")
        if key == "kind" and value == "synthetic_text":  # guidellm 0.8 names the kind
            continue
        if key == "kind":
            raise InputError(f"--data kind={value}: kvlab makes kind=synthetic_text prompts; "
                             "give a file as --data FILE (JSON or JSON lines)")
        if key not in SYNTHETIC_KEYS or not value.isdigit() or int(value) < 1:
            raise InputError(f"--data {given!r}: kvlab makes synthetic prompts of "
                             "prompt_tokens=N[,output_tokens=M] (whole numbers above 0); "
                             f"{part!r} is not one of them")
        found[key] = int(value)
    if "prompt_tokens" not in found:
        raise InputError(f"--data {given!r}: give prompt_tokens=N")
    return found["prompt_tokens"], found.get("output_tokens")


def read(spec: DatasetSpec) -> Dataset:
    """The file's usable records; a file that cannot be read, or a malformed record, is an
    InputError naming the file, the record (line) and what to do."""
    path = Path(spec.path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"--dataset {path}: cannot read it ({exc.strerror})") from None
    found = list(_objects(_text(data, path), path))
    name = spec.name
    if name == "auto":
        held = {k for _, o in found if isinstance(o, dict) for k in ("conversations", "turns")
                if k in o}
        name = "sharegpt" if "conversations" in held else "multi_turn" if "turns" in held \
            else "custom"
    reading = _Reading(str(path), name)
    for number, (where, obj) in enumerate(found):
        _record(reading, obj, where, number)
    records = len(found)
    if not reading.entries:
        raise InputError(f"--dataset {path}: no record to send" + _skips(reading.skipped)
                         + ("" if records else ": the file holds no records")
                         + "; give a ShareGPT JSON list or JSON lines of prompts")
    return Dataset(path.name, hashlib.sha256(data).hexdigest(),
                   "prompts" if name == "custom" else name, tuple(reading.entries),
                   records, dict(reading.skipped), tuple(reading.keys))


def _skips(skipped: Counter[str]) -> str:
    if not skipped:
        return ""
    return " (" + ", ".join(f"{n} {why}" for why, n in skipped.most_common()) + " skipped)"


def _text(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"--dataset {path}: not UTF-8 text (byte {exc.start}); save it as "
                         "UTF-8") from None


def _loads(text: str, where: str, what: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply; {what}") from None
    except ValueError as exc:
        detail = f" ({exc.msg}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) \
            else ""
        raise InputError(f"{where}: not JSON{detail}; {what}") from None


def _objects(text: str, path: Path) -> Iterator[tuple[str, object]]:
    """(where, record) for a JSON list's records or a JSON-lines file's lines."""
    if text.lstrip().startswith("["):
        listed = _loads(text, str(path), "a ShareGPT file is one JSON list of records")
        if not isinstance(listed, list):
            raise InputError(f"{path}: not a JSON list; give a JSON list of records or JSON "
                             "lines")
        for number, obj in enumerate(listed):
            yield f"{path} record {number}", obj
        return
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            yield f"{path}:{number}", _loads(raw, f"{path}:{number}",
                                            "give one JSON object a line")


def _record(reading: _Reading, obj: object, where: str, number: int) -> None:
    if not isinstance(obj, dict):
        raise InputError(f"{where}: a record is a JSON object, not {_kind(obj)}")
    if reading.name == "sharegpt" and "conversations" in obj:
        reading.keys["conversations"] = None
        entry = _conversation(obj["conversations"], where, number, reading.skipped)
    elif reading.name == "sharegpt":
        reading.skipped["without conversations"] += 1
        return
    elif reading.name == "multi_turn":
        reading.keys["turns"] = None
        entry = _turns(obj.get("turns"), where, number, reading)
    else:
        entry = _prompt(obj, where, number, reading)
    if entry is not None:
        reading.entries.append(entry)


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false",
            type(None): "null"}.get(type(value), "a number")


def _message(value: object, where: str, what: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"{where}: {what} must be a string, not {_kind(value)}")
    if len(value) > MAX_MESSAGE_CHARS:
        raise InputError(f"{where}: {what} has {len(value):,} characters, more than any "
                         f"model's context ({MAX_MESSAGE_CHARS:,} at most); shorten it or "
                         "leave the record out")
    return value


def _output_tokens(value: object, where: str, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}: {key} must be a whole number of tokens, at least 1, "
                         f"not {json.dumps(value)[:40]}; fix it or leave the key out")
    return value


def _prompt(obj: dict[str, object], where: str, number: int,
            reading: _Reading) -> Entry | None:
    key = next((k for k in PROMPT_KEYS if k in obj), None)
    if key is None:
        # the keys as JSON writes them: a key may hold a newline, and the message is one line
        found = ", ".join(json.dumps(k)[:40] for k in list(obj)[:8]) or "none"
        raise InputError(f"{where}: no prompt (keys: {found}); a prompt line holds one of "
                         f"{', '.join(PROMPT_KEYS)}, or a ShareGPT record conversations")
    text = _message(obj[key], where, key)
    out_key = next((k for k in OUTPUT_KEYS if k in obj), None)
    output = _output_tokens(obj[out_key], where, out_key) if out_key else None
    sys_key = next((k for k in SYSTEM_KEYS if k in obj), None)
    system = _message(obj[sys_key], where, sys_key) if sys_key and obj[sys_key] is not None \
        else None
    if not text.strip():
        reading.skipped["empty prompt"] += 1
        return None
    for used in (key, out_key, sys_key):
        if used:
            reading.keys[used] = None
    return Entry(number, (Turn(text, output),), system or None)


def _conversation(value: object, where: str, number: int,
                  skipped: Counter[str]) -> Entry | None:
    if not isinstance(value, list):
        raise InputError(f"{where}: conversations must be a list of {{from, value}} "
                         f"messages, not {_kind(value)}")
    said: list[tuple[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or "from" not in message or "value" not in message:
            raise InputError(f"{where}: conversations[{i}] must be an object with from and "
                             "value")
        speaker = _message(message["from"], where, f"conversations[{i}].from")
        said.append((speaker, _message(message["value"], where, f"conversations[{i}].value")))
    why = _unusable(said)
    if why:
        skipped[why] += 1
        return None
    system = said[0][1] if SPEAKERS[said[0][0].lower()] == SYSTEM else None
    turns = tuple(Turn(text) for role, text in _roles(said) if role == USER)
    return Entry(number, turns, system or None)


def _turns(value: object, where: str, number: int, reading: _Reading) -> Entry | None:
    """aiperf's multi-turn record: `turns`, each a prompt record (or `texts`, a list)."""
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: turns must be a list of {{text}} objects, not "
                         f"{_kind(value)}")
    found: list[Turn] = []
    for i, turn in enumerate(value):
        if isinstance(turn, dict) and isinstance(turn.get("texts"), list) and turn["texts"]:
            turn = {**turn, "text": turn["texts"][0]}
        if not isinstance(turn, dict):
            raise InputError(f"{where}: turns[{i}] must be an object, not {_kind(turn)}")
        entry = _prompt(turn, f"{where} turns[{i}]", number, reading)
        if entry is None:
            return None
        found.extend(entry.turns)
    return Entry(number, tuple(found))


def _roles(said: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The messages by role, without a leading system message or assistant reply."""
    roles = [(SPEAKERS.get(s.lower(), ""), text) for s, text in said]
    if roles and roles[0][0] == SYSTEM:
        roles = roles[1:]
    if roles and roles[0][0] == ASSISTANT:
        roles = roles[1:]
    return roles


def _unusable(said: list[tuple[str, str]]) -> str:
    """Why a conversation cannot be replayed ("" when it can)."""
    if any(s.lower() not in SPEAKERS for s, _ in said):
        return "with an unknown speaker"
    roles = _roles(said)
    if not any(role == USER for role, _ in roles):
        return "without a user message"
    if any(role == (ASSISTANT if i % 2 == 0 else USER) or role == SYSTEM
           for i, (role, _) in enumerate(roles)):
        return "whose speakers do not alternate"
    if any(role == USER and not text.strip() for role, text in roles):
        return "with an empty user message"
    return ""
