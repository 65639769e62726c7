"""Exact sizes before an engine exists: the model directory's tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvlab.engines.models import TinyModels
from kvlab.experiments.pressure_plan import TURNS, Counter, plan_pressure, session_turns
from kvlab.loadgen import workloads
from kvlab.loadgen.tokens import ChatTokens


def test_a_chat_prompt_is_the_template_rendered_then_encoded(tiny_models: TinyModels) -> None:
    chat = ChatTokens.of(tiny_models.hf)
    assert chat is not None and chat.template is not None
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    rendered = chat.render(messages)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi."
                        "<|im_end|>\n<|im_start|>assistant\n")
    assert chat.chat(messages) == len(chat.tokenizer.encode(rendered,
                                                            add_special_tokens=False).ids)
    assert chat.chat(messages) > chat.text("Be brief.") + chat.text("Hi.")  # the framing


def test_a_directory_without_a_tokenizer_is_no_counter(tmp_path: Path) -> None:
    assert ChatTokens.of(tmp_path) is None
    assert ChatTokens.of("Qwen/Qwen3-8B") is None
    assert Counter.of("Qwen/Qwen3-8B").source.startswith("the word estimate")


def test_the_template_may_come_from_the_tokenizer_config(tiny_models: TinyModels,
                                                         tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(tiny_models.hf) / name).read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "{{ bos_token }}"
                                "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
                                "{% endfor %}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    chat = ChatTokens.of(tmp_path)
    assert chat is not None
    assert chat.render([{"role": "user", "content": "x"}]) == "<|endoftext|>[user]x"


def test_the_planned_opening_is_the_sent_one_in_the_models_tokens(
        tiny_models: TinyModels) -> None:
    """On the H200 every user-session run asked for 2,107-token openings and sent 6,483-7,053
    token first turns: the opening was sized in words at 1.3 tokens a word. The plan's
    sizing is now the load's, in the model's own tokens."""
    chat = ChatTokens.of(tiny_models.hf)
    assert chat is not None
    p = plan_pressure(tiny_models.hf, 4, 300, 16, 2048, ctx=4096, block_size=128)
    assert p.sizing.method == "tokenizer" and "tokenizer.json" in p.tokens_from
    first = workloads.session_turn(0, seed=0, conversation=0, turn=0, history=(),
                                   tokens=p.preamble_tokens, sizing=p.sizing)
    opening = first.messages[-1][1].split("\n\n")[0]
    assert abs(chat.text(opening) - p.preamble_tokens) <= 0.03 * p.preamble_tokens
    assert p.first_turn_tokens == chat.chat(first.as_messages())  # planned == what is sent
    assert p.as_record().first_turn_tokens == p.first_turn_tokens


def test_the_conversation_counts_each_turn_and_its_answers(tiny_models: TinyModels) -> None:
    p = plan_pressure(tiny_models.hf, 4, 300, 16, 2048, ctx=4096, block_size=128)
    turns = session_turns(Counter.of(tiny_models.hf), p.sizing, p.preamble_tokens)
    assert len(turns) == TURNS and turns == sorted(turns)
    assert p.conversation_tokens == turns[-1] + TURNS * 16
    assert p.working_set_tokens == p.users * p.conversation_tokens


@pytest.mark.parametrize("ctx", [2048, 4096])
def test_the_opening_shrinks_until_the_conversation_fits(tiny_models: TinyModels,
                                                         ctx: int) -> None:
    p = plan_pressure(tiny_models.hf, 2, 4000, 32, 2048, ctx=ctx, block_size=128)
    assert p.conversation_tokens <= 0.9 * ctx
    assert p.preamble_tokens < 4000
