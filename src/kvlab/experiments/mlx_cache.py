"""`kvlab run mlx-cache`: mlx-lm's prompt-cache file, the Apple track's fourth tier, timed
against a cold prefill as `kvlab run disk` times llama.cpp's slot file; and mlx_lm.server's
prompt cache across the turns of one conversation (`--part turns`, a `reuse` line).

In mlx-lm's own venv (`engines/mlx`): one process prefills the prompt cold (the TTFT to beat),
then prefills all but its last token into a cache and writes the file with kvlab's manifest
(the model's content digest) in its metadata; kvlab checks the manifest; a second process
loads the file and computes the first token of the same prompt from it. Reuse is shown by the
cached tokens the loaded cache holds and by the first token's top logprobs against the cold
prefill's. The line is a `disk` line labelled `mlx-cache`, with the engine named.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from kvlab.core import SettingError, write_private
from kvlab.engines import MLX_LM, free_port, install, make_private_dir, mlx, prose
from kvlab.experiments.lab import Lab, engines
from kvlab.experiments.sizes import AllSpec
from kvlab.measure import ReuseOptions, reuse_record, run_reuse
from kvlab.observe import LOGPROB_TOLERANCE, logprob_gap
from kvlab.records import (
    MLX_CACHE,
    MLX_TURNS,
    NOT_PROVEN,
    PROVEN,
    DiskRecord,
    Pressure,
    Record,
    SlotEvidence,
    Turn,
    notebook,
)

PARTS = ("file", "turns")


@dataclass(frozen=True)
class MlxCacheSpec:
    prompt_tokens: int = 2000
    top_logprobs: int = 5
    keep_file: bool = False
    label: str = MLX_CACHE.label
    parts: tuple[str, ...] = PARTS
    turns: int = 6
    preamble_words: int = 400  # mlx-lm on a CPU prefills a few hundred tokens a second

    def check(self) -> None:
        if self.prompt_tokens < 16:
            raise SettingError(f"--prompt-tokens {self.prompt_tokens}: give at least 16")
        if not self.parts or any(p not in PARTS for p in self.parts):
            raise SettingError(f"--part {','.join(self.parts)}: choose from {', '.join(PARTS)}")


def model_dir(lab: Lab) -> str:
    """The HF directory mlx-lm loads: MODEL, else SMALL_MODEL, when it is a local directory."""
    for value in (lab.settings.model, lab.settings.small_model):
        if Path(value).expanduser().is_dir():
            return str(Path(value).expanduser())
    raise SettingError(f"MODEL ({lab.settings.model}) is not a local directory: mlx-lm loads a "
                       "Hugging Face directory (config.json, safetensors, tokenizer); set MODEL "
                       "to one (`kvlab models tiny` makes one)")


def all_spec(lab: Lab, sizes: AllSpec) -> MlxCacheSpec:
    """The prompt-cache file and the turns at `kvlab run all`'s sizes."""
    return MlxCacheSpec(prompt_tokens=min(2000, sizes.disk_prompt_tokens), turns=sizes.turns,
                        preamble_words=min(400, sizes.preamble_words))


async def run(lab: Lab, spec: MlxCacheSpec) -> list[Record]:
    """The file's stopwatch (a `disk` line), then turns of one conversation on
    `mlx_lm.server` (a `reuse` line), as `parts` asks."""
    spec.check()
    out: list[Record] = []
    if "file" in spec.parts:
        out += await cache_file(lab, spec)
    if "turns" in spec.parts:
        out.append(await turns(lab, spec))
    return out


async def turns(lab: Lab, spec: MlxCacheSpec) -> Record:
    """Turns of one conversation on mlx_lm.server: its in-memory prompt cache across turns,
    proven by the cached tokens it reports per response."""
    python, model = mlx.require_mlx(lab.settings.home()), model_dir(lab)
    plan = mlx.server_plan(python, model, free_port(), role=MLX_TURNS.label,
                           hub_cache=lab.settings.paths().cache / "mlx-hub")
    async with engines(lab, [plan], labels=[MLX_TURNS.label], ready_timeout_s=120.0) as (proc,):
        lab.say(f"==> {MLX_TURNS.label}: {spec.turns} turns on mlx_lm.server")
        found = await run_reuse(ReuseOptions(
            [proc.plan.base_url], model, turns=spec.turns, preamble_words=spec.preamble_words,
            max_tokens=16, api_key=lab.api_key(), nonce=f"{lab.run_id}-{MLX_TURNS.label}"),
            say=lab.say)
    record = reuse_record(found, MLX_TURNS.label, notebook.LAB_OFFLOAD,
                          "mlx_lm.server's prompt cache across the turns of one conversation")
    record.tier = "mlx-lm's in-memory prompt cache"
    record.pressure = Pressure(state="quiet")
    return lab.record(record)


async def cache_file(lab: Lab, spec: MlxCacheSpec) -> list[Record]:
    """The cold prefill, the save, the check, the load; the `disk` line it wrote."""
    python, model = mlx.require_mlx(lab.settings.home()), model_dir(lab)
    where = lab.settings.paths().store(lab.run_id, spec.label)
    make_private_dir(where)  # the cache holds the user's prompt
    cache_file, job = where / "prompt-cache.safetensors", where / "job.json"
    write_private(job, json.dumps({
        "model": model, "text": prose(max(64, spec.prompt_tokens // 2), 7),  # cut to the count
        "prompt_tokens": spec.prompt_tokens, "file": str(cache_file),
        "top": spec.top_logprobs, "metadata": mlx.manifest(model)}))
    try:
        lab.say(f"mlx-lm: cold prefill of {spec.prompt_tokens} tokens, then the cache file")
        saved = await asyncio.to_thread(mlx.run_step, python, "save", job)
        mlx.check_file(cache_file, model)
        lab.say("mlx-lm: a new process loads the file and computes the first token from it")
        loaded = await asyncio.to_thread(mlx.run_step, python, "load", job)
    finally:
        job.unlink(missing_ok=True)
        mlx.partial_of(cache_file).unlink(missing_ok=True)  # a save cut short
        if not spec.keep_file:
            cache_file.unlink(missing_ok=True)
            where.rmdir()
    return [lab.record(disk_record(spec, saved, loaded, model, cache_file))]


def disk_record(spec: MlxCacheSpec, saved: mlx.ShimAnswer, loaded: mlx.ShimAnswer,
                model: str, cache_file: Path) -> DiskRecord:
    cold, after = saved.cold_s, loaded.restored_s
    gap = logprob_gap(saved.cold_top, loaded.restored_top)
    cached, prompt = loaded.cached_tokens or 0, saved.prompt_tokens
    reasons = [f"the loaded cache held {cached} of the prompt's {prompt} tokens",
               f"first token's top logprobs differ by at most {gap:.2g} (tolerance "
               f"{LOGPROB_TOLERANCE:g})" if gap is not None else "logprobs not compared"]
    proven = (cached >= prompt - 1 and gap is not None and gap <= LOGPROB_TOLERANCE
              and cold is not None and after is not None and after < cold)
    return DiskRecord(
        label=spec.label, lab=notebook.LAB_OFFLOAD, engine=MLX_LM,
        engine_version=f"mlx-lm {saved.mlx_lm} ({saved.device})", model=model,
        model_sha256=mlx.manifest(model)[mlx.DIGEST_KEY], prompt_tokens=prompt,
        max_tokens=1, cold_ttft_s=_round(cold), save_ms=_ms(saved.save_s),
        restore_ms=_ms(loaded.load_s), file_bytes=saved.file_bytes,
        saved_tokens=saved.saved_tokens, restored_tokens=cached,
        post_restore_ttft_s=_round(after), post_restore_cached_tokens=cached,
        restore_cold_ratio=round(after / cold, 4) if cold and after is not None else None,
        verdict=PROVEN if proven else NOT_PROVEN, reasons=reasons,
        evidence=SlotEvidence(
            cold=Turn(ttft_s=_round(cold), top_logprobs=saved.cold_top),
            restored=Turn(ttft_s=_round(after), cache_n=cached, prompt_n=prompt - cached,
                          top_logprobs=loaded.restored_top),
            logprob_max_abs_diff=gap, logprob_tolerance=LOGPROB_TOLERANCE,
            slot_file=str(cache_file), file_kept=spec.keep_file),
        note=(f"mlx-lm {install.MLX_LM_VERSION}: the prompt-cache file written by one process "
              "and loaded by another; the manifest in its metadata was checked first"))


def _round(seconds: float | None) -> float | None:
    return round(seconds, 4) if seconds is not None else None


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 3) if seconds is not None else None
