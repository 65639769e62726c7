"""The sizes a load will send, said before its first request and fitted to the served context.

An engine refuses a prompt that leaves no room for its answer within the context it serves
(vLLM: HTTP 400), so a load whose prompts are too long fails every request: the defaults
(a 4,096-token preamble) against kvlab's own tiny engine (CTX 4096) did (#48). Before the
first level, the longest prompts of the largest level are counted as the server counts them
(its chat template applied, by the engine's own tokenizer endpoint) and set against the
context the server states (vLLM's /v1/models `max_model_len`, llama-server's slot context
from /props). A preamble that leaves no room for MAX_TOKENS is cut until it does, and said
so, when it came from the settings' defaults; one the user named is refused with the size
that fits (`LoadSpec.oversized`), as are random prompts that cannot fit; `--send-oversized`
sends them anyway, to measure the refusals. The row keeps what was found (`PromptFit`).

Not fitted, and said: a dataset's, a trace's or user sessions' prompts (their sizes are the
user's or grow with real answers), and a server that states no context or counts no tokens.
"""

from __future__ import annotations

import math
from dataclasses import replace

import httpx

from kvlab.core import InputError, KvlabError, Say, quiet
from kvlab.loadgen.inputs import sweep_sizing
from kvlab.loadgen.sizing import longest_prompt
from kvlab.loadgen.spec import LoadSpec
from kvlab.measure import probe
from kvlab.records import PromptFit

TRIES = 4  # recounts while cutting the preamble
MIN_PREAMBLE = 16


async def fit(spec: LoadSpec, api_key: str = "", say: Say = quiet) -> LoadSpec:
    """`spec` with its preamble fitted to the served context and the sizes it will send in
    `spec.fit`, each said; refused (InputError) where nothing fits."""
    if spec.dataset is not None or spec.trace is not None or spec.sessions is not None:
        say("    prompt sizes: the workload's own (a dataset, a trace or user sessions); "
            "not fitted to the served context")
        return spec
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0, trust_env=False, headers=headers) as client:
        context, context_from, engine = await _served_context(client, spec)
        if context is None:
            say(f"    prompt sizes: {spec.base_url} states no context; prompts are not "
                "fitted to it")
            return spec
        if spec.random_input_len is not None:
            return _random_fits(spec, context, context_from, say)
        return await _fitted(client, spec, api_key, (engine, context, context_from), say)


async def _served_context(client: httpx.AsyncClient,
                          spec: LoadSpec) -> tuple[int | None, str, str]:
    """The context the server states, where, and whose tokenizer counts its prompts."""
    try:
        facts = await probe(client, spec.base_url)
    except KvlabError:  # not an engine kvlab reads: the load itself says what it answers
        return None, "", spec.engine
    engine = facts.engine or spec.engine
    return facts.max_model_len, f"as {engine} states it, read as `kvlab check` does", engine


def _random_fits(spec: LoadSpec, context: int, context_from: str, say: Say) -> LoadSpec:
    length = spec.random_input_len or 0
    if length + spec.max_tokens > context and spec.oversized != "send":
        raise InputError(
            f"--random-input-len {length} with MAX_TOKENS {spec.max_tokens} is more than the "
            f"served context of {context} tokens ({context_from}); every request would fail: "
            f"give --random-input-len {context - spec.max_tokens} or less")
    found = PromptFit(longest_prompt_tokens=length, counted_by="the random prompts' length",
                      answer_tokens=spec.max_tokens, served_context=context,
                      context_from=context_from)
    say("    " + sizes_line(found))
    return replace(spec, fit=found)


async def _fitted(client: httpx.AsyncClient, spec: LoadSpec, api_key: str,
                  served: tuple[str, int, str], say: Say) -> LoadSpec:
    engine, context, context_from = served
    asked, preset = spec.preamble_tokens, spec.sizing
    room = context - spec.max_tokens
    if room < MIN_PREAMBLE and spec.oversized != "send":
        raise InputError(f"MAX_TOKENS {spec.max_tokens} leaves no room for a prompt in the "
                         f"served context of {context} tokens ({context_from}): lower "
                         "--max-tokens")
    for _ in range(TRIES):
        sizing = await sweep_sizing(spec, api_key)  # the caller's, else counted once here
        spec = replace(spec, sizing=sizing)
        counted = await longest_prompt(client, spec, engine, sizing)
        if counted is None:
            say(f"    prompt sizes: no tokenizer endpoint answered; the served context is "
                f"{context} tokens ({context_from}); prompts are not fitted to it")
            return spec
        longest, counted_by = counted
        found = PromptFit(longest_prompt_tokens=longest, counted_by=counted_by,
                          answer_tokens=spec.max_tokens, served_context=context,
                          context_from=context_from,
                          preamble_asked=asked if spec.preamble_tokens != asked else None)
        if longest <= room or spec.oversized == "send":
            say("    " + sizes_line(found, spec.preamble_tokens))
            return replace(spec, fit=found)
        # the preamble is most of the prompt, and the estimate's tokens are not the server's
        cut = math.floor(spec.preamble_tokens * room / longest * 0.95)
        if spec.oversized == "refuse":
            raise InputError(
                f"--preamble-tokens/PREAMBLE_TOKENS {asked}: the longest prompt is {longest} "
                f"tokens ({counted_by}) and each answer up to {spec.max_tokens}, more than the "
                f"served context of {context} ({context_from}), so every request would fail: "
                f"give {max(cut, 1)} or less, or --send-oversized to measure the refusals")
        if cut < MIN_PREAMBLE:
            break
        spec = replace(spec, preamble_tokens=cut, sizing=preset)
    raise InputError(
        f"the longest prompt ({longest} tokens) with MAX_TOKENS {spec.max_tokens} does not fit "
        f"the served context of {context} tokens ({context_from}), even with a "
        f"{spec.preamble_tokens}-token preamble: lower --max-tokens or --preamble-tokens")


def sizes_line(found: PromptFit, preamble: int | None = None) -> str:
    """What the load will send, in one line."""
    cut = (f"; preamble cut from {found.preamble_asked} to {preamble} tokens to fit"
           if found.preamble_asked is not None and preamble is not None else "")
    fits = found.longest_prompt_tokens + found.answer_tokens <= found.served_context
    where = "within" if fits else "MORE than"
    sent = "" if fits else "; sent anyway (--send-oversized): the server refuses each"
    return (f"prompt sizes: the longest {found.longest_prompt_tokens} tokens ({found.counted_by})"
            f" + {found.answer_tokens} answer tokens {where} the served context of "
            f"{found.served_context} ({found.context_from}){cut}{sent}")
