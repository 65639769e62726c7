"""Reuse across the turns of a conversation, on one endpoint or alternating between several.

The seed's measure-reuse.py as a library: a growing conversation, TTFT per turn, and the
engines' counters either side of the run, plus what it lacked: counters read with a real
Prometheus parser (so `vllm:prefix_cache_hits_total` is found), per-turn cached tokens from
the response, per-turn counter deltas, and a verdict per turn against what that turn could
have reused. Each run opens its conversation with its own nonce (so a second run on the same
engines finds nothing of the first's in turn 1), and fits its preamble to the served context
in the model's own tokens (`fit.py`), saying what it fitted. A turn that reused nothing on an
instance that says why (prefix caching off) carries that cause in its reasons.
`Probe` is shared with `prove.py`: one timed request with evidence either side.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

import httpx

from kvlab.core import JsonObject, Say, api_base, connectors, quiet, server_root
from kvlab.engines import InstanceFacts, evidence_deltas
from kvlab.measure.compat import probe, served_model
from kvlab.measure.conversation import (
    PREAMBLE_WORDS,
    TURN_MAX_TOKENS,
    Conversation,
    preamble,
)
from kvlab.measure.fit import Fitted, fit_conversation
from kvlab.measure.verdict import (
    Evidence,
    Judgement,
    judge,
    lookup_key,
    no_reuse_cause,
    reusable_tokens,
    store_key,
)
from kvlab.observe import ChatResult, chat_body, metrics, stream_chat
from kvlab.records import Deltas, ReuseRecord, ReuseRow, ReuseSummary


def exact_prompt_trap(block: int) -> str:
    """Why ExampleConnector serves a growing conversation nothing, with the block size of the
    instance it was measured on."""
    return (
        "ExampleConnector (CONNECTOR=shared) keys each stored entry on the hash of the prompt's "
        "whole-block prefix, so it serves only a prompt with exactly the same whole blocks: an "
        "identical prompt, or a conversation that grew by less than one block since it was "
        f"stored. A conversation that grows past a block boundary (with this instance's "
        f"{block}-token blocks, any turn that adds {block} tokens or more) never hits what the "
        "other instance stored. The identical-prompt case is the test of the store; for growing "
        "conversations use a connector that matches prefixes (LMCache)"
    )


EXACT_PROMPT_COINCIDENCE = (
    "ExampleConnector served this growing prompt only because it still had the same whole "
    "blocks as a stored one (it grew by less than a block); one more block of growth and it "
    "misses"
)
WARM_UP = [{"role": "user", "content": "Name three colours of the sea at dawn."}]


@dataclass
class Probe:
    """One request to one endpoint, with the engine's counters scraped either side."""

    client: httpx.AsyncClient
    api_key: str = ""

    async def send(self, url: str, body: JsonObject) -> tuple[ChatResult, Deltas]:
        murl = metrics.metrics_url(url)
        before = await metrics.scrape(self.client, murl)
        result = await stream_chat(self.client, url, body, self.api_key)
        after = await metrics.scrape(self.client, murl)
        return result, evidence_deltas(before, after)


def _summed(deltas: Deltas, keys: tuple[str, ...]) -> float | None:
    found = [float(v) for k in keys if (v := deltas.get(k)) is not None]
    return sum(found) if found else None


def source_hits(deltas: Deltas) -> float | None:
    """Prompt tokens vLLM's by-source counter attributes to a cache hit or a KV transfer."""
    return _summed(deltas, ("prompt_tokens_local_cache_hit",
                            "prompt_tokens_external_kv_transfer"))


def store_hits(deltas: Deltas) -> float | None:
    """Prompt tokens vLLM says came through its KV connector (a store, another instance)."""
    return _summed(deltas, ("prompt_tokens_external_kv_transfer",))


def counter_hits(deltas: Deltas) -> float | None:
    """Prompt tokens the engine's counters say came from cache (local + external)."""
    return _summed(deltas, ("prefix_cache_hits", "external_prefix_cache_hits",
                            "prompt_tokens_cached_total"))


@dataclass
class ReuseOptions:
    urls: list[str]
    model: str
    turns: int = 6
    preamble_words: int = PREAMBLE_WORDS
    max_tokens: int = TURN_MAX_TOKENS
    temperature: float = 0.0
    timeout_s: float = 300.0
    api_key: str = ""
    connector: str = "shared"  # what links the endpoints, when there are several
    # opens the conversation, so no earlier run's cache can serve turn 1; None: a fresh one
    nonce: str | None = None


@dataclass
class ReuseRun:
    options: ReuseOptions
    nonce: str = ""
    fitted: Fitted | None = None
    rows: list[ReuseRow] = field(default_factory=list)
    judgements: list[Judgement] = field(default_factory=list)
    metric_deltas: dict[str, Deltas] = field(default_factory=dict)
    instances: dict[str, InstanceFacts] = field(default_factory=dict)
    warm_up_ttft_s: dict[str, float | None] = field(default_factory=dict)

    def summary(self) -> ReuseSummary:
        first = self.rows[0].ttft_s if self.rows else None
        later = [t for r in self.rows[1:] if (t := r.ttft_s) is not None]
        verdicts = [j.verdict for j in self.judgements[1:]]
        return ReuseSummary(
            turn1_ttft_s=first, best_later_ttft_s=min(later) if later else None,
            best_later_ratio=round(min(later) / first, 3) if later and first else None,
            later_turn_verdicts=verdicts, reused_turns=verdicts.count("reused"),
            hit_rate={url: metrics.hit_rate(d) for url, d in self.metric_deltas.items()})


async def run_reuse(opts: ReuseOptions, say: Say = quiet) -> ReuseRun:
    """Send the growing conversation, turn by turn, alternating over `opts.urls`."""
    run = ReuseRun(opts, nonce=opts.nonce if opts.nonce is not None else secrets.token_hex(4))
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    # the key on every request: an engine with one guards /v1/models as well as the chats
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, headers=headers) as client:
        for url in opts.urls:
            run.instances[api_base(url)] = await probe(client, url)
        model, why = served_model(opts.model, next(iter(run.instances.values())))
        if why:  # a stock server answers 404 to a name it does not serve
            say(f"    {why}")
            opts = replace(opts, model=model)
            run.options = opts
        run.fitted = await fit_conversation(client, list(run.instances.values()),
                                            opts.preamble_words, run.nonce, opts.turns,
                                            opts.max_tokens)
        say(run.fitted.line(opts.turns))
        roots = {server_root(u) for u in opts.urls}
        start = {r: await metrics.scrape(client, r + "/metrics") for r in roots}
        tester = Probe(client, opts.api_key)
        for url in opts.urls:  # model residency first, recorded apart from the turns
            warm, _ = await tester.send(url, chat_body(opts.model, WARM_UP, 4))
            run.warm_up_ttft_s[api_base(url)] = warm.ttft_s
        await _turns(run, tester, say)
        end = {r: await metrics.scrape(client, r + "/metrics") for r in roots}
    for url in opts.urls:
        root = server_root(url)
        deltas = evidence_deltas(start[root], end[root])
        if deltas:
            run.metric_deltas[api_base(url)] = deltas
    return run


async def _turns(run: ReuseRun, tester: Probe, say: Say) -> None:
    """The conversation, its opening unique to the run, each turn judged."""
    opts = run.options
    chat = Conversation(preamble(run.fitted.preamble_words if run.fitted
                                 else opts.preamble_words, run.nonce))
    last_prompt: dict[str, int] = {}
    for turn in range(opts.turns):
        url = api_base(opts.urls[turn % len(opts.urls)])
        body = chat_body(opts.model, chat.ask(turn), opts.max_tokens, opts.temperature)
        result, deltas = await tester.send(url, body)
        chat.answer(result.text)
        expected, why = _expected(run, url, last_prompt, result.prompt_tokens)
        cold = run.rows[0].ttft_s if run.rows else None
        judgement = judge(Evidence(expected, result.reused_tokens, counter_hits(deltas),
                                   result.ttft_s, cold, result.prompt_tokens,
                                   source_hits(deltas)),
                          context=why, cause=no_reuse_cause(run.instances[url]))
        run.judgements.append(judgement)
        run.rows.append(ReuseRow(turn=turn + 1, endpoint=url, counter_deltas=deltas,
                                 expected_tokens=expected, verdict=judgement.verdict)
                        .overlay(result.timing()))
        if result.prompt_tokens is not None:
            last_prompt[url] = result.prompt_tokens
        say(_turn_line(run.rows[-1]))


def _expected(run: ReuseRun, url: str, last_prompt: dict[str, int],
              now: int | None) -> tuple[int, str]:
    """Tokens this turn could reuse: this endpoint's own last prompt, plus a shared store's."""
    block = run.instances[url].block_size or 1
    if not last_prompt:
        return 0, "first turn: nothing cached yet"
    local = reusable_tokens(last_prompt[url], block) if url in last_prompt else 0
    others = [n for u, n in last_prompt.items() if u != url]
    if not others or len(run.options.urls) < 2:
        return local, ""
    external, why = store_expectation(run.options.connector, now, others, block)
    return max(local, external), why if external >= local else ""


def store_expectation(connector: str, prompt_tokens: int | None, stored: list[int],
                      block: int) -> tuple[int, str]:
    """Tokens a store linking the instances could serve a prompt that extends `stored` ones."""
    link = connectors.known(connector)
    if link is not None and link.prefix_match:  # in whole pieces of its own, if larger
        return max(reusable_tokens(n, max(block, link.match_tokens)) for n in stored), ""
    if not connectors.is_shared_store(connector):
        return 0, "the other instance computed this prefix, and nothing shares it with this one"
    key = lookup_key(prompt_tokens or 0, block)
    if key and any(store_key(n, block) == key for n in stored):
        return key, EXACT_PROMPT_COINCIDENCE
    return 0, exact_prompt_trap(block)


def off_by_one(connector: str, prompt_tokens: int | None, block: int) -> str:
    """Why ExampleConnector cannot serve even an identical prompt of this length, if so."""
    n = prompt_tokens or 0
    if not connectors.is_shared_store(connector) or n < 2 \
            or lookup_key(n, block) == store_key(n, block):
        return ""
    return (f"ExampleConnector stores a {n}-token prompt under its first {store_key(n, block)} "
            f"tokens but looks it up under its first {lookup_key(n, block)}: when n - 1 is a "
            f"whole number of {block}-token blocks, even the identical prompt is never served "
            "(an off-by-one in vLLM's example connector), and this prompt is one")


def _turn_line(row: ReuseRow) -> str:
    ttft = f"{row.ttft_s:.3f}" if row.ttft_s is not None else "  none"
    cached = f"cached {row.cached_tokens:>6}" if row.cached_tokens is not None \
        else "cached    n/a"
    prompt = row.prompt_tokens if row.prompt_tokens is not None else "?"
    return (f"    turn {row.turn:>2}  {row.endpoint:<34}  TTFT {ttft} s  total "
            f"{row.total_s or 0:6.2f} s  prompt {prompt:>6}  {cached}  {row.verdict}")


def reuse_record(run: ReuseRun, label: str, lab: str, note: str) -> ReuseRecord:
    """The seed's `reuse` record, with kvlab's evidence added."""
    o = run.options
    return ReuseRecord(
        label=label, lab=lab, model=o.model, endpoints=[api_base(u) for u in o.urls],
        turns=o.turns, preamble_words=run.fitted.preamble_words if run.fitted else
        o.preamble_words, max_tokens=o.max_tokens, nonce=run.nonce,
        fitted=run.fitted.as_record() if run.fitted else None,
        temperature=o.temperature, rows=run.rows, metric_deltas=run.metric_deltas, note=note,
        connector=o.connector if len(o.urls) > 1 else None, summary=run.summary(),
        instances={u: f.as_record() for u, f in run.instances.items()},
        turn_reasons=[j.reasons for j in run.judgements], warm_up_ttft_s=run.warm_up_ttft_s,
    )
