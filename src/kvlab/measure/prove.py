"""`kvlab prove`: reuse proven rather than assumed, with controls.

One endpoint: a warm-up on unrelated text of the same length (model residency and the first
long prompt's one-off costs, recorded apart, so they cannot pass for reuse), a cold request,
an identical repeat, and a changed-prefix control. Two endpoints sharing a store: cold on A,
the identical prompt on B, a changed-prefix control on B, and a growing conversation moving
from A to B (the case ExampleConnector can never serve, explained rather than flagged). An
engine whose instances share KV its own way brings its own two-endpoint proof, run through
this module's case runner (two llama-servers: `engines/llamacpp/prove.py`, the slot file).
`--salt` adds vLLM's isolation pair: a different `cache_salt` must not reuse and the same one
must (either alone proves nothing: "no reuse" also passes when caching is off).

Every prompt opens with a nonce unique to the run, so "cold" is really cold. Each case states
what it should reuse as an `Expect`; the verdicts are `measure/verdict.py`'s. A case that
reused nothing where reuse was expected names the cause the instance reports (prefix caching
off); two endpoints are first held to `kvlab check` (a store path or connector that differs
is refused there, by name, before any case runs).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import httpx

from kvlab.core import Say, Settings, api_base, connectors, quiet, server_root
from kvlab.engines import InstanceFacts, TwoEndpointProof, known_engine, store_for
from kvlab.measure.compat import check, probe
from kvlab.measure.conversation import Conversation, preamble
from kvlab.measure.reuse import (
    Probe,
    counter_hits,
    exact_prompt_trap,
    off_by_one,
    source_hits,
    store_expectation,
    store_hits,
)
from kvlab.measure.verdict import (
    FAILED,
    Evidence,
    Judgement,
    judge,
    no_reuse_cause,
    reusable_tokens,
)
from kvlab.observe import ChatResult, chat_body
from kvlab.records import Deltas, ProofCase, ProofRecord


@dataclass
class ProveOptions:
    urls: list[str]
    model: str
    preamble_words: int = 600
    max_tokens: int = 8
    timeout_s: float = 300.0
    api_key: str = ""
    connector: str = "shared"
    salt: bool = False
    ignore: tuple[str, ...] = ()
    settings: Settings | None = None  # llama pairs: where the slot files live


@dataclass(frozen=True)
class Expect:
    """What a case should reuse, stated before its prompt's length is known.

    `tokens(n)`: exactly n (0: nothing); `reusable()`: every token a prefix cache can serve
    of this prompt; `store(stored)`: what the store linking two instances can serve a prompt
    extending the `stored` ones (its connector decides). `why` leads the verdict's reasons.
    `through_store`: the store, not the instance's own prefix cache, is meant to serve it.
    """

    kind: Literal["tokens", "reusable", "store"]
    count: int = 0
    stored: tuple[int, ...] = ()
    why: str = ""
    through_store: bool = False

    @classmethod
    def tokens(cls, n: int, why: str = "") -> Expect:
        return cls("tokens", count=n, why=why)

    @classmethod
    def reusable(cls, why: str = "", through_store: bool = False) -> Expect:
        return cls("reusable", why=why, through_store=through_store)

    @classmethod
    def store(cls, stored: Sequence[int]) -> Expect:
        return cls("store", stored=tuple(stored), through_store=True)


def identical_expect(trap: str) -> Expect:
    """An identical prompt on the instance that did not compute it: every reusable token from
    the store, or none where the connector's rule cannot serve its length (`trap`:
    ExampleConnector's off-by-one, seen on the GPU with a 1,553-token prompt, 16-token blocks)."""
    return Expect.tokens(0, trap) if trap else Expect.reusable(through_store=True)


@dataclass
class Case:
    name: str
    endpoint: str
    judgement: Judgement | None
    result: ChatResult
    deltas: Deltas

    def as_record(self) -> ProofCase:
        case = ProofCase(case=self.name, endpoint=self.endpoint,
                         ttft_s=self.result.timing().ttft_s,
                         prompt_tokens=self.result.prompt_tokens,
                         cached_tokens=self.result.reused_tokens, counter_deltas=self.deltas,
                         reasons=["model residency only: not a reuse case"])
        if self.judgement is not None:
            case.verdict, case.reasons = self.judgement.verdict, self.judgement.reasons
            case.evidence = self.judgement.evidence
        return case


@dataclass
class ProofRun:
    options: ProveOptions
    nonce: str
    cases: list[Case] = field(default_factory=list)
    instances: dict[str, InstanceFacts] = field(default_factory=dict)
    explanations: list[str] = field(default_factory=list)

    def verdicts(self) -> dict[str, str | None]:
        return {c.name: c.judgement.verdict if c.judgement else None for c in self.cases}

    def failed(self) -> list[str]:
        """The cases that reused nothing where reuse was expected."""
        return [c.name for c in self.cases if c.judgement and c.judgement.verdict in FAILED]


class _Prover:
    """Runs the cases against live endpoints; keeps the cold TTFT for the ratios."""

    def __init__(self, opts: ProveOptions, client: httpx.AsyncClient, run: ProofRun,
                 say: Say) -> None:
        self.opts, self.run, self.say, self.client = opts, run, say, client
        self.probe = Probe(client, opts.api_key)
        self.cold_ttft: float | None = None

    @property
    def nonce(self) -> str:
        return self.run.nonce

    def block(self, url: str) -> int:
        return self.run.instances[api_base(url)].block_size or 1

    def explain(self, text: str) -> None:
        self.run.explanations.append(text)

    async def case(self, name: str, url: str, messages: list[dict[str, str]],
                   expect: Expect | None, **extra: object) -> Case:
        """Send one request and judge it against `expect` (None: model residency only)."""
        # ignore_eos: a random-weight model may end at once, leaving no token to time
        body = chat_body(self.opts.model, messages, self.opts.max_tokens,
                         extra={"ignore_eos": True, **extra})
        result, deltas = await self.probe.send(url, body)
        judgement = None
        if expect is not None:
            want, why = self._expected(expect, result.prompt_tokens, url)
            judgement = judge(Evidence(want, result.reused_tokens, counter_hits(deltas),
                                       result.ttft_s, self.cold_ttft, result.prompt_tokens,
                                       source_hits(deltas)),
                              context=why,
                              cause=no_reuse_cause(self.run.instances.get(api_base(url))),
                              store_tokens=None if expect.through_store
                              else store_hits(deltas))
        case = Case(name, api_base(url), judgement, result, deltas)
        self.run.cases.append(case)
        verdict = judgement.verdict if judgement else "(residency)"
        self.say(f"    {name:<24} {api_base(url):<30} TTFT {result.ttft_s or 0:.3f} s  "
                 f"reused {result.reused_tokens}  {verdict}")
        return case

    def _expected(self, expect: Expect, prompt_tokens: int | None, url: str) -> tuple[int, str]:
        """(tokens expected from cache, why) once the prompt's length is known."""
        if expect.kind == "reusable":
            return reusable_tokens(prompt_tokens or 0, self.block(url)), expect.why
        if expect.kind == "store":
            return store_expectation(self.opts.connector, prompt_tokens, list(expect.stored),
                                     self.block(url))
        return expect.count, expect.why

    async def cold(self, name: str, url: str, **extra: object) -> Case:
        """The prompt's first request anywhere; its TTFT is the ratios' denominator."""
        case = await self.case(name, url, self.messages(self.run.nonce), Expect.tokens(
            0, "first time this prompt was sent (its opening is unique to this run)"), **extra)
        self.cold_ttft = case.result.ttft_s
        return case

    async def identical(self, name: str, url: str, why: str = "", **extra: object) -> Case:
        """The run's prompt again: every reusable token is expected from cache."""
        return await self.case(name, url, self.messages(self.run.nonce), Expect.reusable(why),
                               **extra)

    async def from_store(self, name: str, url: str, trap: str = "") -> Case:
        """The run's prompt again on another instance: the store is to serve it, unless its
        connector's own rule cannot serve this prompt's length (`trap`, said why)."""
        return await self.case(name, url, self.messages(self.run.nonce), identical_expect(trap))

    async def control(self, name: str, url: str, why: str, **extra: object) -> Case:
        """The same length with other first words: nothing cached can match it."""
        return await self.case(name, url, self.messages(self.run.nonce + "x"),
                               Expect.tokens(0, why), **extra)

    def messages(self, nonce: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": preamble(self.opts.preamble_words, nonce)},
                {"role": "user", "content": "In one sentence, what is reused here?"}]


async def run_proof(opts: ProveOptions, say: Say = quiet) -> ProofRun:
    """Run the proof against one endpoint or two (then the shared-store cases)."""
    run = ProofRun(opts, nonce=secrets.token_hex(4))
    timeout = httpx.Timeout(opts.timeout_s, connect=10.0)
    # the key on every request: an engine with one guards /v1/models as well as the chats
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else None
    async with httpx.AsyncClient(timeout=timeout, trust_env=False, headers=headers) as client:
        if len(opts.urls) > 1:
            facts = await check(opts.urls, ignore=opts.ignore, headers=headers)
            run.instances = {f.url: f for f in facts}
        else:
            run.instances = {api_base(opts.urls[0]): await probe(client, opts.urls[0])}
        prover = _Prover(opts, client, run, say)
        for i, url in enumerate(opts.urls):
            # its own opening, so it shares no block with any prompt below
            await prover.case("warm-up", url, prover.messages(f"{run.nonce}-warm{i}"), None)
        # an engine whose instances share KV its own way brings its own two-endpoint proof
        own = own_proof(run.instances)
        if len(opts.urls) == 1:
            await _one_endpoint(prover, opts.urls[0])
        elif own is not None:
            await own(prover, opts.urls[0], opts.urls[1], opts.settings or Settings())
        else:
            await _two_endpoints(prover, opts.urls[0], opts.urls[1])
        if opts.salt:
            await _salt_pair(prover, opts.urls[-1])
    return run


def own_proof(instances: dict[str, InstanceFacts]) -> TwoEndpointProof | None:
    """The two-endpoint proof the instances' engine brings, if it brings one."""
    names = {f.engine for f in instances.values()}
    name = names.pop() if len(names) == 1 else None
    engine = known_engine(name) if name else None
    return engine.two_endpoint_proof if engine is not None else None


async def _one_endpoint(p: _Prover, url: str) -> None:
    await p.cold("cold", url)
    await p.identical("identical-repeat", url)
    await p.control("changed-prefix-control", url,
                    "the first words differ, so no cached block can match")


async def _two_endpoints(p: _Prover, a: str, b: str) -> None:
    nonce = p.run.nonce
    cold = await p.cold("cold-on-a", a)
    # the same prompt has the same length on B; ExampleConnector may never serve that length
    await p.from_store("identical-on-b", b,
                       off_by_one(p.opts.connector, cold.result.prompt_tokens, p.block(b)))
    await p.control("changed-prefix-on-b", b,
                    "the first words differ, so nothing in the store can match")
    chat = Conversation(preamble(p.opts.preamble_words, nonce + "t"))
    turns = [chat.ask(0)]
    first = await p.case("growing-turn-1-on-a", a, turns[0],
                         Expect.tokens(0, "a new conversation"))
    chat.answer(first.result.text)
    # the second turn adds at least a block of context (one word is at least one token), the
    # way a real conversation soon does, so the whole-block prefix changes
    grow = p.block(b)
    turns.append(chat.ask(1, context_words=grow))
    cross = await p.case("growing-turn-2-on-b", b, turns[1],
                         Expect.store([first.result.prompt_tokens or 0]))
    chat.answer(cross.result.text)
    own_turn = reusable_tokens(first.result.prompt_tokens or 0, p.block(a))
    await p.case("growing-turn-3-on-a", a, chat.ask(2), Expect.tokens(own_turn))
    if connectors.is_shared_store(p.opts.connector) and cross.judgement:
        p.run.explanations.append(
            f"identical prompt on B: {p.run.verdicts().get('identical-on-b')}; growing "
            f"conversation on B: {cross.judgement.verdict}. " + exact_prompt_trap(grow))
        if rule := await store_rule(p, b, turns):
            p.run.explanations.append(rule)


async def store_rule(p: _Prover, url: str, turns: list[list[dict[str, str]]]) -> str:
    """The connector's matching rule checked on the store's own entries for a conversation's
    first two turns ("" where the store or the prompts' token ids cannot be read)."""
    facts = p.run.instances.get(api_base(url))
    store = store_for(p.opts.connector)
    paths = store.named(facts.kv_store) if store is not None and facts is not None else []
    engine = known_engine(facts.engine) if facts is not None and facts.engine else None
    if not paths or engine is None or facts is None:
        return ""
    ids = [await engine.tokenize_chat(p.client, server_root(url), p.opts.model, m)
           for m in turns]
    if any(i is None for i in ids):
        return ""
    found = store.match(paths[0], [i or [] for i in ids], p.block(url))  # type: ignore[union-attr]
    there = "there" if found.held(0) else "NOT there"
    others = [e for e in found.entries if e != found.stored[1]]  # all but turn 2's own
    looked = ("turn 1's entry" if found.sought[1] == found.stored[0]
              else "among the others" if found.sought[1] in others
              else "not among them (the one entry of that name is the one turn 2 wrote "
                   "itself)" if found.found(1) else "not among them")
    return (f"The store's own entries ({len(found.entries)} in {paths[0]}): turn 1 on A is "
            f"{there} as {found.stored[0][:12]} (its first whole blocks of {len(ids[0] or [])} "
            f"tokens); turn 2 on B looked for {found.sought[1][:12]} (of its "
            f"{len(ids[1] or [])} tokens): {looked}. The connector finds a whole-block "
            "prompt, not a prefix")


async def _salt_pair(p: _Prover, url: str) -> None:
    nonce = p.run.nonce + "s"
    salt_a, salt_b = secrets.token_hex(8), secrets.token_hex(8)
    await p.case("salt-a-cold", url, p.messages(nonce),
                 Expect.tokens(0, "first request with salt A"), cache_salt=salt_a)
    await p.case("salt-b-same-prompt", url, p.messages(nonce),
                 Expect.tokens(0, "a different cache_salt must isolate the cache"),
                 cache_salt=salt_b)
    await p.case("salt-a-repeat", url, p.messages(nonce), Expect.reusable(),
                 cache_salt=salt_a)
    verdicts = p.run.verdicts()
    holds = (verdicts.get("salt-b-same-prompt") == "no-reuse-expected"
             and verdicts.get("salt-a-repeat") == "reused")
    p.run.explanations.append(
        "cache_salt isolation holds: a different salt did not reuse and the same salt did"
        if holds else
        "cache_salt isolation NOT shown: the pair needs no reuse across salts AND reuse "
        "within one salt")


def proof_record(run: ProofRun, label: str, lab: str, note: str) -> ProofRecord:
    o = run.options
    return ProofRecord(
        label=label, lab=lab, model=o.model, endpoints=[api_base(u) for u in o.urls],
        preamble_words=o.preamble_words, max_tokens=o.max_tokens,
        connector=o.connector if len(o.urls) > 1 else None, salt=o.salt,
        cases=[c.as_record() for c in run.cases], verdicts=run.verdicts(),
        explanations=run.explanations, note=note,
        instances={u: f.as_record() for u, f in run.instances.items()},
    )
