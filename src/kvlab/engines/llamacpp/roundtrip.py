"""The slot store's one proof: save -> erase/restore -> ask again, and its one judge.

Every llama.cpp experiment that shows a slot file carries KV (`kvlab run disk`, `kvlab run
shared-slots`, `kvlab prove` against two llama-servers) runs the same protocol through
`round_trip`: the prompt cold on the source slot, the slot saved with kvlab's manifest, the
file restored into the target slot (the same server's erased slot or another server's), the
same prompt asked again, and a control that nothing restored may serve. `judge` reads the
three answers against one set of thresholds: `timings.cache_n` after the restore must cover
the prompt, the control must reuse (almost) nothing, and the first-token top logprobs must
equal the cold prefill's.

Not here: starting servers, choosing prompts and slots (the callers bind each request to its
server and slot), and writing notebook lines (the experiments build their records).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.core import Say, quiet
from kvlab.engines.llamacpp import slotstore
from kvlab.engines.llamacpp.client import LlamaClient, SlotOp
from kvlab.engines.llamacpp.slotmanifest import Manifest
from kvlab.observe import LOGPROB_TOLERANCE, ChatResult, logprob_gap
from kvlab.records import NOT_PROVEN, PROVEN, RestoreVerdict, Turn

REUSE_FRACTION = 0.95    # the post-restore cache_n must cover this share of the prompt
CONTROL_FRACTION = 0.05  # the control may reuse at most this share (template tokens)

# one request of the protocol, bound by the caller to its server, slot and prompt
Ask = Callable[[], Awaitable[ChatResult]]


@dataclass(frozen=True)
class Slot:
    """One slot of one running llama-server."""

    client: LlamaClient
    slot: int


@dataclass(frozen=True)
class Asks:
    """The protocol's three requests.

    `control_before_restore`: the control is the same prompt on the erased target slot,
    asked before the restore (one server: nothing but another cache could serve it then);
    otherwise it runs last, where the caller bound it (another slot, another prompt).
    """

    cold: Ask
    again: Ask
    control: Ask
    control_before_restore: bool = False


@dataclass(frozen=True)
class RoundTrip:
    """What each step of one round trip showed."""

    cold: ChatResult
    control: ChatResult
    restored: ChatResult
    save: SlotOp
    restore: SlotOp
    manifest: Manifest


@dataclass(frozen=True)
class Judgement:
    """The round trip's verdict, the reasons it is not proven, and the logprob evidence."""

    verdict: RestoreVerdict
    reasons: list[str] = field(default_factory=list)
    logprob_gap: float | None = None
    prompt_tokens: int = 0


async def round_trip(store: slotstore.SlotStore, name: str, source: Slot, target: Slot,
                     asks: Asks, hash_cache: Path | None = None,
                     say: Say = quiet) -> RoundTrip:
    """Cold on `source`, save as `name`, restore into `target`, ask again, and the control.

    The slot file stays in the store: the caller removes it (`SlotStore.remove`) unless asked
    to keep it.
    """
    cold = await asks.cold()
    save_op, manifest = await slotstore.save(source.client, store, source.slot, name,
                                             hash_cache)
    say(f"saved {save_op.n_tokens} tokens ({save_op.n_bytes} bytes) in "
        f"{save_op.wall_ms:.1f} ms")
    control = None
    if asks.control_before_restore:
        await target.client.erase(target.slot)
        control = await asks.control()
        await target.client.erase(target.slot)
    restore_op, _ = await slotstore.restore(target.client, store, target.slot, name, hash_cache)
    say(f"restored {restore_op.n_tokens} tokens in {restore_op.wall_ms:.1f} ms")
    restored = await asks.again()
    if control is None:
        control = await asks.control()
    return RoundTrip(cold, control, restored, save_op, restore_op, manifest)


def prompt_tokens(cold: ChatResult) -> int:
    """The prompt's length as the cold prefill counted it (computed plus reused tokens)."""
    t = cold.timings or {}
    return int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0))


def judge(cold: ChatResult, control: ChatResult, restored: ChatResult) -> Judgement:
    """'reuse proven' only when the restore served the prompt, the control reused nothing,
    and the first token's top logprobs equal the cold prefill's."""
    total = prompt_tokens(cold)
    reasons = []
    reused = int((restored.timings or {}).get("cache_n", 0))
    faked = int((control.timings or {}).get("cache_n", 0))
    if reused < REUSE_FRACTION * total:
        reasons.append(f"after restore only {reused} of {total} prompt tokens were reused")
    if faked > CONTROL_FRACTION * total:
        reasons.append(f"the control reused {faked} tokens without a restore: another cache "
                       "(e.g. --cache-ram) could be faking the result")
    gap = logprob_gap(cold.first_logprobs, restored.first_logprobs)
    if gap is None:
        reasons.append("first-token logprobs missing or not comparable")
    elif gap > LOGPROB_TOLERANCE:
        reasons.append(f"first-token logprobs differ from the cold prefill by {gap:.2e}")
    elif cold.first_logprobs[0][0] != restored.first_logprobs[0][0]:
        reasons.append("the most likely first token differs from the cold prefill's")
    return Judgement(NOT_PROVEN if reasons else PROVEN, reasons, gap, total)


def turn(result: ChatResult) -> Turn:
    """One request's evidence for a notebook line: client TTFT and the server's reuse counts."""
    t = result.timings or {}
    cache_n, prompt_n = t.get("cache_n"), t.get("prompt_n")
    return Turn(ttft_s=round(result.ttft_s, 4) if result.ttft_s is not None else None,
                total_s=round(result.total_s, 4),
                cache_n=int(cache_n) if cache_n is not None else None,
                prompt_n=int(prompt_n) if prompt_n is not None else None,
                prompt_ms=t.get("prompt_ms"),
                top_logprobs=[(tok, round(lp, 6)) for tok, lp in result.first_logprobs])
