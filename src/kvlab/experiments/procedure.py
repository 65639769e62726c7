"""`kvlab run disagg --part cancel`: the checks of a request cancelled mid-stream followed by
a worker restart, as pure functions of the figures gathered (`cancel_step.py` gathers them).

The P/D lab: "Include a cancelled request and a worker restart in the isolated lab, then verify
a fresh request succeeds." The step streams a long-prompt request through kvlab's proxy and
closes the connection after the first tokens (a user pressing stop), restarts the decode
engine, then asks every process for health and sends a fresh request. `judge` turns the
figures (`CancelEvidence`) into checks, each passed or failed with the figures that decided
it; `verdict` is "pass", or "fail" with the failed checks' names.

"Mid-stream" is decided by decode itself: its counters read at the moment of the cut must
show the request still generating. On a busy CPU, vLLM's front end can hand out the first
tokens only after the engine has generated all of them; a cut then cancels nothing, and the
step says so (and `cancel_step` tries again, up to `ATTEMPTS` cuts) instead of passing a
check it did not make.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Literal

from kvlab.core import SettingError
from kvlab.observe import chunk, data_of
from kvlab.records import CancelEvidence, CancelSpecLine, Check, StreamCut

ATTEMPTS = 3
MIN_ANSWER = 256  # answer tokens the cancelled request may generate, at least
# kvlab's proxy counters (proxy/metrics.py): requests by outcome, client aborts by stage
PROXY_REQUESTS, PROXY_ABORTS = "kvlab_proxy_requests", "kvlab_proxy_aborts"


@dataclass(frozen=True)
class CancelSpec:
    """The cancelled request and the fresh one; sizes fitted to CTX by `resolved`."""

    prompt_tokens: int | None = None  # None: 2048, or half the context when that is less
    max_tokens: int = 1536  # far more than arrive before the cut: the request is mid-stream
    cancel_after: int = 4  # tokens received before the client closes the connection
    fresh_prompt_tokens: int = 256
    fresh_max_tokens: int = 16
    settle_s: float = 60.0  # how long the proxy and decode may take to let the request go

    @property
    def prompt(self) -> int:
        """The cancelled request's prompt length, once `resolved`."""
        if self.prompt_tokens is None:
            raise ValueError("CancelSpec.resolved(ctx) gives the prompt length")
        return self.prompt_tokens

    def resolved(self, ctx: int) -> CancelSpec:
        """The sizes for this context: the answer shortened to fit beside the prompt;
        refuses a prompt that leaves no room for an answer to cancel."""
        prompt = self.prompt_tokens if self.prompt_tokens is not None else min(2048, ctx // 2)
        answer = min(self.max_tokens, ctx - prompt)
        if answer < MIN_ANSWER:
            raise SettingError(f"--cancel-prompt-tokens {prompt}: leaves {max(answer, 0)} "
                               f"answer tokens within CTX {ctx}; use at most "
                               f"{ctx - MIN_ANSWER}")
        if not 1 <= self.cancel_after < answer // 2:
            raise SettingError(f"--cancel-after {self.cancel_after}: give 1 to "
                               f"{answer // 2 - 1} tokens (half the {answer}-token answer)")
        return replace(self, prompt_tokens=prompt, max_tokens=answer)

    def as_record(self) -> CancelSpecLine:
        return CancelSpecLine(prompt_tokens=self.prompt_tokens, max_tokens=self.max_tokens,
                              cancel_after=self.cancel_after,
                              fresh_prompt_tokens=self.fresh_prompt_tokens,
                              fresh_max_tokens=self.fresh_max_tokens, settle_s=self.settle_s)


def _check(name: str, passed: bool, detail: str) -> Check:
    return Check(name=name, passed=passed, detail=detail)


def _cut_check(ev: CancelEvidence) -> Check:
    cut = ev.cut
    if cut.status != 200 or cut.error:
        why = cut.error or f"HTTP {cut.status}"
        return _check("cancelled-mid-stream", False, f"the stream did not run: {why}")
    if cut.finished or cut.tokens < 1:
        return _check("cancelled-mid-stream", False, f"the answer ended after {cut.tokens} "
                     "tokens, before the cut: nothing was cancelled")
    tries = f" (attempt {ev.attempts})" if ev.attempts > 1 else ""
    if cut.decode_running is None:
        return _check("cancelled-mid-stream", False, "decode's /metrics could not be read at "
                     "the cut: whether it was still generating is not known")
    if cut.late:
        return _check("cancelled-mid-stream", False, f"decode had finished "
                     f"({_n(cut.decode_generated)} tokens) before the client read "
                     f"{cut.tokens}: the cut cancelled nothing{tries}")
    return _check("cancelled-mid-stream", True, f"closed after {cut.tokens} of {ev.max_tokens} "
                 f"tokens, {cut.closed_after_s or 0:.2f} s after sending, decode at "
                 f"{_n(cut.decode_generated)} tokens{tries}")


def _n(value: float | None) -> str:
    return f"{value:.0f}" if value is not None else "n/a"


def _proxy_check(ev: CancelEvidence) -> Check:
    if ev.proxy_aborted is None:
        return _check("proxy-counted-abort", False, "the proxy's /metrics could not be read")
    stages = ", ".join(f"{k} +{v or 0:.0f}" for k, v in ev.proxy_aborts_by_stage.items())
    return _check("proxy-counted-abort", ev.proxy_aborted >= 1,
                 f"requests aborted by the client +{ev.proxy_aborted:.0f}; legs closed: {stages}")


def _decode_check(ev: CancelEvidence) -> Check:
    d = ev.decode
    generated, aborted = d.get("generation_tokens"), d.get("requests_aborted") or 0
    finished = (d.get("requests_succeeded") or 0) - aborted  # stop, length, error
    busy = (d.get("requests_running_end") or 0) + (d.get("requests_waiting_end") or 0)
    detail = (f"generated {_n(generated)} of {ev.max_tokens} tokens; counted aborted "
              f"+{aborted:.0f}, finished otherwise +{finished:.0f}; {busy:.0f} running or "
              "waiting afterwards")
    if ev.cut.late:
        return _check("decode-let-go", False, "not tested: decode had finished before the cut")
    if ev.settled_s is None:
        return _check("decode-let-go", False, detail + "; still busy when the wait ended")
    ok = generated is not None and generated < ev.max_tokens and finished == 0 and busy == 0
    return _check("decode-let-go", ok, detail + f" ({ev.settled_s:.1f} s after the cut)")


def _restart_check(ev: CancelEvidence) -> Check:
    r = ev.restart
    if not r.ok:
        return _check("decode-restarted", False, f"did not come back: {r.error}")
    return _check("decode-restarted", True, f"stopped in {r.stop_s or 0:.1f} s (exit "
                 f"{r.exit_code}), ready again in {r.ready_s or 0:.1f} s, pid "
                 f"{r.pids[0] if r.pids else '?'} -> {r.pids[-1] if r.pids else '?'}")


def _fresh_checks(ev: CancelEvidence) -> list[Check]:
    f, served = ev.fresh, ev.fresh_served
    if f.status != 200 or f.error:
        done = _check("fresh-request-completed", False,
                     f"no answer: {f.error or f'HTTP {f.status}'}")
    else:
        done = _check("fresh-request-completed", f.completion_tokens == ev.expected_tokens
                     and f.finish_reason == "length",
                     f"{f.completion_tokens} of {ev.expected_tokens} tokens, finish reason "
                     f"{f.finish_reason}")
    counts = {k: served.get(k) for k in ("prefill", "decode", "proxy_ok")}
    crossed = all((v or 0) >= 1 for v in counts.values())
    return [done, _check("fresh-request-crossed", crossed,
                        f"requests finished since: prefill +{counts['prefill'] or 0:.0f}, "
                        f"decode +{counts['decode'] or 0:.0f}; proxy ok "
                        f"+{counts['proxy_ok'] or 0:.0f}")]


def judge(ev: CancelEvidence) -> list[Check]:
    """Each check of the procedure, in order, with the figures that decided it."""
    said = {"prefill": "alive, /health answered 200", "decode": "alive, /health answered 200",
            "proxy": "/health answered 200: every leg ok"}
    health = [_check(f"{role}-healthy", ev.health.get(role) == "ok",
                    said[role] if ev.health.get(role) == "ok"
                    else ev.health.get(role, "not checked"))
              for role in ("prefill", "decode", "proxy")]
    return [_cut_check(ev), _proxy_check(ev), _decode_check(ev), _restart_check(ev), *health,
            *_fresh_checks(ev)]


def verdict(checks: list[Check]) -> tuple[Literal["pass", "fail"], list[str]]:
    """"pass" when every check passed, else "fail" and the failed checks' names."""
    failed = [c.name for c in checks if not c.passed]
    return ("fail" if failed else "pass"), failed


def take_line(line: str, cut: StreamCut, started: float) -> None:
    """Count one SSE line: a token chunk (`observe/sse.py`'s definition), the end of the
    answer, or an error event."""
    payload = data_of(line)
    if payload is None:
        return
    got = chunk(payload)
    if got.error is not None:
        cut.error = f"error event: {json.dumps(got.error)[:300]}"
    if got.answered or got.reasoned:
        cut.tokens += 1
        if cut.first_token_s is None:
            cut.first_token_s = round(time.perf_counter() - started, 4)
    cut.finished = cut.finished or got.done or got.finished
