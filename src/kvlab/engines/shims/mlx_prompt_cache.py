"""mlx-lm's prompt-cache file, timed: run by the mlx-lm venv's interpreter, never imported.

`python mlx_prompt_cache.py save|load JOB.json` prints one JSON document on stdout.
- save: warm up, prefill the whole prompt cold and time its first token (the TTFT to beat),
  then prefill all but its last token into a fresh cache and write it to the file with the
  metadata kvlab gives (its manifest), as `mlx_lm cache_prompt` does;
- load: in a new process, as a disk tier is used, read the file back and time the first token
  of the same prompt from it (only the last token is computed).
Each step gives the first token's top logprobs, so kvlab can check that the loaded cache is
the cold one. Timings are around `mx.eval`, so they are the work and not its scheduling.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm import load
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper


def _top(logits: mx.array, tokenizer: TokenizerWrapper, k: int) -> list[list[object]]:
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    order = mx.argsort(-logprobs)[:k].tolist()
    return [[tokenizer.decode([i]), float(logprobs[i])] for i in order]


def _first_token(model: nn.Module, ids: list[int], cache: list[object]
                 ) -> tuple[float, mx.array]:
    start = time.perf_counter()
    logits = model(mx.array([ids]), cache=cache)[0, -1].astype(mx.float32)
    mx.eval(logits)
    return time.perf_counter() - start, logits


def main(step: str, job_path: str) -> dict[str, object]:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    model, tokenizer = load(job["model"])
    ids = tokenizer.encode(job["text"])[: int(job["prompt_tokens"])]
    out: dict[str, object] = {"mlx_lm": mlx_lm.__version__, "device": str(mx.default_device()),
                              "prompt_tokens": len(ids)}
    _first_token(model, ids[:8], make_prompt_cache(model))  # residency is not cache state
    if step == "save":
        cold_s, logits = _first_token(model, ids, make_prompt_cache(model))
        cache = make_prompt_cache(model)
        prefill_s, _ = _first_token(model, ids[:-1], cache)
        start = time.perf_counter()
        final = Path(job["file"])
        # whole under its name or absent (kvlab's cache_file.partial_of names the same file)
        partial = final.with_name(f".partial-{final.name}")
        save_prompt_cache(str(partial), cache, {k: str(v) for k, v in job["metadata"].items()})
        partial.replace(final)
        out |= {"cold_s": cold_s, "cold_top": _top(logits, tokenizer, job["top"]),
                "prefill_s": prefill_s, "save_s": time.perf_counter() - start,
                "saved_tokens": cache[0].offset, "file_bytes": Path(job["file"]).stat().st_size}
    else:
        start = time.perf_counter()
        cache = load_prompt_cache(job["file"])
        load_s = time.perf_counter() - start
        cached = cache[0].offset
        restored_s, logits = _first_token(model, ids[cached:], cache)
        out |= {"load_s": load_s, "cached_tokens": cached, "restored_s": restored_s,
                "restored_top": _top(logits, tokenizer, job["top"])}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
