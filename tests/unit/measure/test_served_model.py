"""The model name kvlab sends: SERVED_NAME when the server lists it, else the one model a
stock server (vllm serve, mlx_lm.server) lists under its own name; several: refused."""

from __future__ import annotations

import pytest

from kvlab.core.errors import InputError
from kvlab.engines.base import InstanceFacts
from kvlab.measure.compat import served_model


def _facts(*ids: str) -> InstanceFacts:
    return InstanceFacts(url="http://127.0.0.1:8000/v1", listed_models=list(ids))


def test_the_asked_name_is_kept_when_listed_or_when_nothing_is() -> None:
    assert served_model("local-chat", _facts("local-chat", "other")) == ("local-chat", "")
    assert served_model("local-chat", _facts()) == ("local-chat", "")


def test_the_one_listed_model_is_taken_and_said() -> None:
    name, why = served_model("local-chat", _facts("/models/qwen3"))
    assert name == "/models/qwen3" and "'local-chat' is not among its models" in why


def test_several_listed_models_are_a_choice_for_the_user() -> None:
    with pytest.raises(InputError, match="serves 'a', 'b'; name one with --model"):
        served_model("local-chat", _facts("a", "b"))
