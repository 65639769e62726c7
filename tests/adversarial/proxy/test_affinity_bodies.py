"""Affinity keys of hostile bodies: whatever JSON a client sends, keying it never raises and
reads no more than the leading text (the proxy has already refused what is not a JSON object
with a model)."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.engines.models import make_tiny
from kvlab.proxy import affinity as aff

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=40),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)
BODY = st.fixed_dictionaries({"model": st.just("m")}, optional={
    "messages": JSON | st.lists(st.fixed_dictionaries(
        {"role": st.text(max_size=8)}, optional={"content": JSON}), max_size=4),
    "prompt": JSON, "user": JSON})
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> aff.PrefixKey:
    tokenizer = aff.load_tokenizer(make_tiny(tmp_path_factory.mktemp("tiny")).hf)
    return aff.PrefixKey(tokenizer, block_tokens=16, blocks=2)


@PROPS
@given(body=BODY)
def test_any_body_gets_both_keys(key: aff.PrefixKey, body: dict[str, object]) -> None:
    assert isinstance(key(body), int)
    assert isinstance(aff.conversation_key(body), int)
    assert isinstance(aff.body_digest(body), str)


def test_a_huge_non_text_content_costs_nothing_to_key(key: aff.PrefixKey) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "x" * 1000}}] * 5000
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    started = time.perf_counter()
    key(body)
    aff.conversation_key(body)
    assert time.perf_counter() - started < 1.0  # only text parts are read, none here


def test_token_id_prompts_are_keyed_by_their_leading_ids(key: aff.PrefixKey) -> None:
    head = list(range(100, 140))
    assert key({"prompt": [*head, 1, 2]}) == key({"prompt": [*head, 3]})
    assert key({"prompt": head}) != key({"prompt": [9, *head]})
