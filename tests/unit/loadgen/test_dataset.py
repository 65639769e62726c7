"""The user's dataset: ShareGPT files and JSON lines of prompts read as vllm bench, guidellm and
aiperf write them, malformed ones refused in one line naming the file and the record, prompts
sent as the file says and conversations replayed as user sessions on real sockets, and the
flags other tools spell (`--dataset-name/--dataset-path`, `--data`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fakes.sse_upstream import Behaviour, SseUpstream
from kvlab.core.errors import InputError
from kvlab.loadgen import dataset
from kvlab.loadgen.dataset import DatasetSpec, Entry, Turn
from kvlab.loadgen.sessions import SessionSpec, ThinkTime
from kvlab.loadgen.spec import LoadSpec
from kvlab.loadgen.sweep import run_sweep
from kvlab.loadgen.trace import TraceSpec
from kvlab.records import requests
from unit.cli.test_load_cmd import fake_upstream, kvlab

SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "Tell me about rivers."}, {"from": "gpt", "value": "They flow."},
        {"from": "human", "value": "And lakes?"}, {"from": "gpt", "value": "They sit."},
        {"from": "human", "value": "And the sea?"}]},
    {"id": "b", "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "One question."},
        {"from": "gpt", "value": "One answer."}]},
    {"id": "c"},  # vllm bench skips it too
    {"id": "d_1", "conversations": [  # a later part of a long chat: opens with the reply
        {"from": "gpt", "value": "continuing"}, {"from": "user", "value": "follow-up"},
        {"from": "chatgpt", "value": "x"}, {"from": "human", "value": "again"}]},
    {"id": "e", "conversations": [{"from": "bing", "value": "hello"}]},
    {"id": "f", "conversations": [{"from": "robot", "value": "hello"}]},
    {"id": "g", "conversations": [{"from": "human", "value": "a"},
                                  {"from": "human", "value": "b"}]},
    {"id": "h", "conversations": [{"from": "human", "value": "  "}]},
]


def write(path: Path, objs: list[Any], lines: bool = False) -> Path:
    text = "".join(json.dumps(o) + "\n" for o in objs) if lines else json.dumps(objs)
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_sharegpt_as_vllm_bench_takes_it(tmp_path: Path) -> None:
    path = write(tmp_path / "sg.json", SHAREGPT)
    data = dataset.read(DatasetSpec(str(path)))
    assert (data.file, data.format, data.records, data.keys) == \
        ("sg.json", "sharegpt", 8, ("conversations",))
    assert len(data.sha256) == 64 and str(tmp_path) not in data.file
    assert [e.number for e in data.entries] == [0, 1, 3]
    assert [[t.text for t in e.turns] for e in data.entries] == [
        ["Tell me about rivers.", "And lakes?", "And the sea?"], ["One question."],
        ["follow-up", "again"]]
    assert data.entries[1].system == "Be brief." and data.entries[0].system is None
    assert data.skipped == {"without conversations": 1, "without a user message": 1,
                            "with an unknown speaker": 1, "whose speakers do not alternate": 1,
                            "with an empty user message": 1}
    assert (data.conversations, data.max_turns, data.user_turns) == (2, 3, 6)
    # named, and as JSON lines, it reads the same
    lines = write(tmp_path / "sg.jsonl", SHAREGPT, lines=True)
    assert dataset.read(DatasetSpec(str(lines), "sharegpt")).entries == data.entries


@pytest.mark.parametrize(("record", "turn"), [
    ({"prompt": "p", "output_tokens": 5}, Turn("p", 5)),  # vllm bench's custom dataset
    ({"text": "p", "output_length": 5}, Turn("p", 5)),  # aiperf's single turn
    ({"text_input": "p", "output_length": 5.0}, Turn("p", 5)),  # aiperf's mooncake text
    ({"prompt": "p", "output_tokens_count": 5}, Turn("p", 5)),  # guidellm's columns
    ({"question": "p", "completion_tokens_count": 5}, Turn("p", 5)),
    ({"instruction": "p", "max_tokens": 5, "id": 7}, Turn("p", 5)),
    ({"input": "p", "output_tokens": None}, Turn("p")),
    ({"content": "p"}, Turn("p")),
])
def test_prompt_lines_in_the_other_tools_spellings(tmp_path: Path, record: dict[str, Any],
                                                   turn: Turn) -> None:
    path = write(tmp_path / "p.jsonl", [record, {"prompt": " "}], lines=True)
    data = dataset.read(DatasetSpec(str(path)))
    assert data.format == "prompts" and data.entries == (Entry(0, (turn,)),)
    assert data.skipped == {"empty prompt": 1}
    assert data.keys[0] in dataset.PROMPT_KEYS
    assert all(k in (*dataset.PROMPT_KEYS, *dataset.OUTPUT_KEYS) for k in data.keys)


def test_a_system_message_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('\n{"prompt": "q", "system_prompt": "Be kind."}\n\n', encoding="utf-8")
    entry = dataset.read(DatasetSpec(str(path))).entries[0]
    assert entry.messages(0) == (("system", "Be kind."), ("user", "q"))


@pytest.mark.parametrize(("text", "message"), [
    ("", "no record to send: the file holds no records"),
    ("\n \n", "no record to send: the file holds no records"),
    ('{"prompt": "p"}\nnot json\n', r"d\.jsonl:2: not JSON .*one JSON object a line"),
    ('{"prompt": "p"}\n[1]\n', r"d\.jsonl:2: a record is a JSON object, not a list"),
    ('{"id": 1, "answer": "x"}\n', r'd\.jsonl:1: no prompt \(keys: "id", "answer"\); a prompt '
     "line holds one of prompt, text_input"),
    ('{"prompt": 5}\n', r"d\.jsonl:1: prompt must be a string, not a number"),
    ('{"prompt": "p", "output_tokens": "10"}\n', r"d\.jsonl:1: output_tokens must be a "
     r"whole number of tokens"),
    ('{"prompt": "p", "output_length": 0}\n', r"d\.jsonl:1: output_length must be a whole"),
    ('{"prompt": "p", "output_length": 2.5}\n', r"d\.jsonl:1: output_length must be a whole"),
    ('{"prompt": "p", "output_length": true}\n', r"d\.jsonl:1: output_length must be a whole"),
    ('{"prompt": "p", "output_length": NaN}\n', r"d\.jsonl:1: output_length must be a whole"),
    ('[{"conversations": {"from": "human"}}]', r"d\.jsonl record 0: conversations must be a "
     r"list"),
    ('[{"conversations": []}, {"conversations": [{"from": "human"}]}]',
     r"d\.jsonl record 1: conversations\[0\] must be an object with from and value"),
    ('[{"conversations": [{"from": "human", "value": 3}]}]',
     r"record 0: conversations\[0\]\.value must be a string, not a number"),
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', r"no record to send \(1 without "
     r"a user message skipped\)"),
    ('{"conversations": "x"}', r"d\.jsonl:1: conversations must be a list"),
    ("[1, 2", r"d\.jsonl: not JSON .*one JSON list of records"),
])
def test_a_malformed_file_is_one_line_naming_it_and_the_record(tmp_path: Path, text: str,
                                                               message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match=message) as caught:
        dataset.read(DatasetSpec(str(path)))
    assert "\n" not in str(caught.value)


def test_named_shapes_and_unreadable_files(tmp_path: Path) -> None:
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "p"}], lines=True)
    with pytest.raises(InputError, match=r"no record to send \(1 without conversations"):
        dataset.read(DatasetSpec(str(prompts), "sharegpt"))
    sharegpt = write(tmp_path / "sg.json", SHAREGPT[:1])
    with pytest.raises(InputError, match="record 0: no prompt"):
        dataset.read(DatasetSpec(str(sharegpt), "custom"))
    with pytest.raises(InputError, match=r"--dataset .*missing\.json: cannot read it"):
        dataset.read(DatasetSpec(str(tmp_path / "missing.json")))
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"latin\.jsonl: not UTF-8 text \(byte 15\); save it"):
        dataset.read(DatasetSpec(str(latin)))
    with pytest.raises(InputError, match="--dataset and --trace"):
        LoadSpec(base_url="http://127.0.0.1:1/v1", model="m", levels=(1,), requests=None,
                 max_tokens=1, prompt_set="mixed", label="x", endpoint="completions",
                 dataset=dataset.read(DatasetSpec(str(prompts))),
                 trace=TraceSpec("t"))


def spec(url: str, book: Path, **kw: Any) -> LoadSpec:
    values: dict[str, Any] = {"base_url": url, "model": "fake", "levels": (2,),
                              "requests": None, "max_tokens": 6, "prompt_set": "shared-prefix",
                              "label": "data", "scrape_metrics": False, "labbook": str(book),
                              "warmup": 1}
    values.update(kw)
    return LoadSpec(**values)


async def test_prompts_are_sent_as_the_file_says_and_levels_go_on_through_it(
        tmp_path: Path) -> None:
    path = write(tmp_path / "p.jsonl", [{"prompt": f"question {i}", "output_tokens": 2 * i + 1}
                                        for i in range(5)], lines=True)
    data = dataset.read(DatasetSpec(str(path)))
    book = tmp_path / "labbook.md"
    async with SseUpstream(Behaviour(tokens=2)) as up:
        first = (await run_sweep(spec(up.base_url, book, dataset=data))).rows[0]
        sent = [b for b in up.counters.bodies if "question" in str(b["messages"])]
        up.counters.bodies.clear()
        rows = (await run_sweep(spec(up.base_url, book, dataset=data, levels=(1, 2),
                                     requests=3))).rows
    # one pass of the file, in its order, each with its own output length, capped at 6
    assert [b["messages"] for b in sent] == [[{"role": "user", "content": f"question {i}"}]
                                              for i in range(5)]
    assert [b["max_tokens"] for b in sent] == [1, 3, 5, 6, 6]
    assert (first.ok, first.prompt_set, first.prompt_sizing) == (5, "dataset", None)
    d = first.dataset
    assert d is not None and (d.file, d.sent, d.first_record, d.resent) == ("p.jsonl", 5, 0, 0)
    assert (d.outputs_from_file, d.outputs_capped, d.usable, d.records) == (5, 2, 5, 5)
    # the second level begins where the first ended, and begins the file again past its end
    later = [r.dataset for r in rows]
    assert [(x.first_record, x.sent, x.resent) for x in later if x] == [(0, 3, 0), (3, 3, 1)]
    assert rows[1].warmup_requests == 1  # kvlab's own short question, not the file's
    assert "question" not in str(up.counters.bodies[0]["messages"])
    lines = requests.read(requests.location(book, str(rows[1].requests_file)),
                          rows[1].requests_sha256)
    assert sum(x.warmup for x in lines) == 1


async def test_conversations_are_replayed_as_user_sessions(tmp_path: Path) -> None:
    path = write(tmp_path / "sg.json", SHAREGPT)
    data = dataset.read(DatasetSpec(str(path)))
    book = tmp_path / "labbook.md"
    sessions = SessionSpec(turns=data.max_turns, think=ThinkTime("fixed", 0.05))
    async with SseUpstream(Behaviour(tokens=3)) as up:
        row = (await run_sweep(spec(up.base_url, book, dataset=data, sessions=sessions,
                                    warmup=0))).rows[0]
    assert row.ok == 6 and row.sessions is not None and row.dataset is not None, row.failures
    assert row.sessions.conversations_started == 3 and row.dataset.sent == 3
    by_first: dict[str, list[list[dict[str, str]]]] = {}
    for body in up.counters.bodies:
        messages = body["messages"]
        first_user = next(m["content"] for m in messages if m["role"] == "user")
        by_first.setdefault(first_user, []).append(messages)
    assert sorted(len(v) for v in by_first.values()) == [1, 2, 3]  # each its own length
    rivers = sorted(by_first["Tell me about rivers."], key=len)
    REPLY = " t0 t1 t2 t3 t4 t5"  # the fake server's six tokens
    # each turn carries the conversation so far as this server answered it
    assert [m["content"] for m in rivers[2]] == [
        "Tell me about rivers.", REPLY, "And lakes?", REPLY, "And the sea?"]
    assert by_first["One question."][0][0] == {"role": "system", "content": "Be brief."}
    lines = requests.read(requests.location(book, str(row.requests_file)), row.requests_sha256)
    assert sorted((x.conversation or 0) % 1000 * 10 + (x.turn or 0) for x in lines) == \
        [0, 1, 2, 10, 20, 21]


def test_the_flags_other_tools_spell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVLAB_PROFILE", "none")
    sharegpt = write(tmp_path / "sg.json", SHAREGPT)
    prompts = write(tmp_path / "p.jsonl", [{"prompt": "p", "output_tokens": 2}], lines=True)
    book = tmp_path / "labbook.md"
    with fake_upstream("--tokens", "2") as url:
        common = ["--base-url", url, "--model", "fake", "--labbook", str(book),
                  "--no-progress", "--json", "--no-metrics"]
        vllm = kvlab("load", *common, "--dataset-name", "sharegpt", "--dataset-path",
                     str(sharegpt), "--max-concurrency", "2", "--think-time", "fixed:0")
        guidellm = kvlab("load", *common, "--data", str(prompts))
    assert vllm.returncode == 0, vllm.stderr
    row = json.loads(vllm.stdout)["rows"][0]
    assert (row["workload"]["kind"], row["workload"]["users"], row["ok"]) == ("sessions", 2, 6)
    assert "dataset sg.json (sharegpt, keys conversations): 3 of 8 records usable" in \
        vllm.stderr and "its 2 conversations replayed as user sessions" in vllm.stderr
    assert guidellm.returncode == 0, guidellm.stderr
    row = json.loads(guidellm.stdout)["rows"][0]
    assert (row["prompt_set"], row["ok"], row["dataset"]["keys"]) == \
        ("dataset", 1, ["prompt", "output_tokens"])


@pytest.mark.parametrize(("args", "message"), [
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt: give the file with "
     "--dataset-path FILE"),
    (["--dataset-name", "random", "--data", "x.json"], "--dataset-name random: random token "
     "prompts, no file"),
    (["--dataset-path", "BAD"], 'BAD.jsonl:1: no prompt (keys: "id")'),
    (["--dataset-path", "/nonexistent/d.json"], "--dataset /nonexistent/d.json: cannot read"),
])
def test_bad_dataset_input_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              args: list[str], message: str) -> None:
    monkeypatch.setenv("KVLAB_HOME", str(tmp_path / "home"))
    bad = tmp_path / "BAD.jsonl"
    bad.write_text('{"id": 1}\n')
    args = [str(bad) if a == "BAD" else a for a in args]
    run = kvlab("load", "--base-url", "http://127.0.0.1:9/v1", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1
