"""The GGUF kvlab makes from an HF directory (`engines/llamacpp/model_gguf.py`, LLAMA_MODEL
unset) serves the same model as the tiny GGUF `kvlab models tiny` writes: both come from the
same random weights (the HF directory's bf16, the tiny GGUF's f16 of the float32 originals),
so real llama-servers, one on each, answer a greedy completion with the same tokens.

What is compared: the token ids of a 16-token greedy completion (temperature 0, prompt cache
off) of three prompts, and each first token's log-probability, which bf16 against f16
weights may move a little (within 0.05 here). f16 KV on both, so no KV rounding differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from integration.conftest import cpu_settings
from kvlab.engines import llamacpp
from kvlab.engines.llamacpp.adapter import make_from_model
from kvlab.engines.llamacpp.server import READY_S, server_plan
from kvlab.engines.models import TinyModels, prose
from kvlab.engines.process import EngineProcess

pytestmark = pytest.mark.llama
PROMPTS = (prose(3, 1), prose(6, 2), "Hello, world! In one sentence, why?")
TOKENS = 16
LOGPROB_TOLERANCE = 0.05


@contextlib.asynccontextmanager
async def served(root: Path, binary: Path, gguf: str, role: str) -> AsyncIterator[str]:
    settings = cpu_settings(llama_model=gguf, llama_cache_type="f16")
    plan = server_plan(settings, binary, role=role, ctx=1024, parallel=1,
                       slot_dir=root / f"slots-{role}", cache_ram_mib=0,
                       accepted=llamacpp.help_flags(binary))
    async with EngineProcess(plan, root / f"{role}.log", run_dir=root, ready_timeout_s=READY_S):
        yield plan.base_url


async def greedy(url: str, prompt: str) -> tuple[list[int], float]:
    body = {"prompt": prompt, "n_predict": TOKENS, "temperature": 0, "cache_prompt": False,
            "return_tokens": True, "n_probs": 1}
    async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
        answer = (await client.post(url + "/completion", json=body)).raise_for_status().json()
    return list(answer["tokens"]), float(answer["completion_probabilities"][0]["logprob"])


async def test_a_gguf_made_from_the_hf_directory_answers_as_the_tiny_gguf(
        tmp_path: Path, tiny_models: TinyModels, llama_binary: Path) -> None:
    settings = cpu_settings(model=tiny_models.hf, llama_model="",
                            kvlab_home=str(tmp_path / "home"))
    said: list[str] = []
    made = make_from_model(settings, said.append)
    assert made is not None and made.is_file() and "making a GGUF from MODEL" in said[0]
    answers: dict[str, list[tuple[list[int], float]]] = {}
    for role, gguf in (("made", str(made)), ("tiny", tiny_models.gguf)):
        async with served(tmp_path, llama_binary, gguf, role) as url:
            answers[role] = [await greedy(url, p) for p in PROMPTS]
    for (made_ids, made_lp), (tiny_ids, tiny_lp) in zip(answers["made"], answers["tiny"],
                                                        strict=True):
        assert len(made_ids) == TOKENS
        assert made_ids == tiny_ids
        assert abs(made_lp - tiny_lp) <= LOGPROB_TOLERANCE, (made_lp, tiny_lp)
