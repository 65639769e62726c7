"""The cache oracle for llama-server's slots: what its prompt cache could have served.

llama-server keeps, per slot, the tokens of the last prompt it processed, and reuses the
longest common prefix of those and the next prompt given to that slot, to the token (there are
no blocks). Which slot a request gets is its own rule (`get_available_slot` in its server):
among the idle slots that hold tokens, the one whose common prefix is the largest share of the
new prompt, if that share is above `--slot-prompt-similarity` (0.5 by default); otherwise the
idle slot used least recently. A request that finds no idle slot waits for the first to free.
At least one prompt token is always computed. The model replays a level's requests in the
order they were sent, each slot busy from a request's send to its end as measured.

The in-RAM prompt cache (`--cache-ram`, on by default; `RamCache`) is replayed by the server's
own rules (`server_prompt_cache` in llama.cpp's server-task.cpp, as vendored in the pinned
sdist): when a slot is taken by LRU, or by similarity while keeping under half of what it
held, its prompt is saved to the cache (unless a saved prompt already starts with it; saved
prompts it starts with are dropped; the oldest go to make room), and the saved prompt that
keeps at least a quarter of itself and beats the slot's own prefix on both the share kept and
the share of the new prompt moves into the slot (leaving the cache). With
`--cache-idle-slots` (on by default) each new request also saves every idle slot, and with a
unified KV cache clears it. After each change the cache drops its oldest prompts past its
byte limit, then past its token limit (the server's whole context, raised to what the byte
limit holds at the cache's bytes per token).

A slot keeps its prompt and the tokens generated after it but the last; their count is known
(the response's) but not their ids, so they are held as ids no prompt has. Where it departs
from the engine: a conversation's next turn, whose prompt holds the reply, is understated by
the reply's tokens, and a saved prompt's bytes are its tokens times a per-token size the
caller gives (the KV arithmetic), not the state's exact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SIMILARITY_DEFAULT = 0.5  # llama-server's --slot-prompt-similarity
KEEP_FOR_SAVE = 0.5  # a slot chosen by similarity that keeps less than this is saved first
KEEP_TO_LOAD = 0.25  # a saved prompt that would keep less of itself is never loaded


@dataclass(frozen=True)
class SlotRequest:
    """One request as sent: its prompt tokens, when it was sent and when it ended, and how
    many generated tokens its slot keeps after the prompt (all but the last sampled)."""

    tokens: Sequence[int]
    sent_s: float
    end_s: float
    generated: int = 0

    def held(self, n: int) -> Sequence[int]:
        """What the slot holds once request `n` (in replay order) ends: the prompt, then its
        generated tokens as ids no prompt holds (negative, this request's own), so that they
        count toward sizes and shares and never match."""
        if not self.generated:
            return self.tokens
        start = -(n + 1) * 2**20
        return [*self.tokens, *range(start, start - self.generated, -1)]


@dataclass
class _Slot:
    tokens: Sequence[int] = ()
    busy_until: float = float("-inf")
    last_used: int = -1  # the replay's counter: llama-server's t_last_used, in order


@dataclass(frozen=True)
class SlotCache:
    """llama-server's slots: how many, and its similarity threshold (0 turns it off)."""

    slots: int
    similarity: float = SIMILARITY_DEFAULT

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("a llama-server has at least one slot")


@dataclass(frozen=True)
class RamCache:
    """llama-server's in-RAM prompt cache: its byte limit (0: none, `--cache-ram -1`), the
    bytes a saved token takes, its token limit (the server's context), whether idle slots are
    saved on each request and whether saving clears them (a unified KV cache)."""

    limit_bytes: int
    bytes_per_token: float
    limit_tokens: int
    save_idle: bool = True
    unified: bool = False

    def __post_init__(self) -> None:
        if self.limit_bytes < 0 or self.bytes_per_token <= 0 or self.limit_tokens < 0:
            raise ValueError("a RAM cache has a limit of 0 or more bytes and tokens, and a "
                             "positive size per token")


@dataclass
class _Ram:
    """The RAM cache's saved prompts, oldest first."""

    shape: RamCache
    saved: list[Sequence[int]] = field(default_factory=list)

    def _bytes(self, tokens: int) -> float:
        return tokens * self.shape.bytes_per_token

    def _size(self) -> float:
        return self._bytes(sum(len(s) for s in self.saved))

    def save(self, prompt: Sequence[int]) -> bool:
        """`server_prompt_cache::alloc`: keep `prompt` unless a saved one starts with it or it
        is larger than the whole cache; whether it was kept."""
        if not prompt or any(common_prefix(s, prompt) == len(prompt) for s in self.saved):
            return False
        limit, size = self.shape.limit_bytes, self._bytes(len(prompt))
        if limit and size > limit:
            return False
        self.saved = [s for s in self.saved if common_prefix(s, prompt) != len(s)]
        while limit and self.saved and self._size() + size > limit:
            self.saved.pop(0)
        self.saved.append(prompt)
        return True

    def load(self, slot: _Slot, prompt: Sequence[int]) -> None:
        """`server_prompt_cache::load`: move the best saved prompt into `slot`, if any."""
        held = common_prefix(slot.tokens, prompt)
        keep = held / len(slot.tokens) if slot.tokens else -1.0
        sim = held / len(prompt) if prompt else 0.0
        best: int | None = None
        for i, saved in enumerate(self.saved):
            found = common_prefix(saved, prompt)
            keep_cur, sim_cur = found / len(saved), found / len(prompt) if prompt else 0.0
            if keep_cur >= KEEP_TO_LOAD and keep < keep_cur and sim < sim_cur:
                best, keep, sim = i, keep_cur, sim_cur
        if best is not None:
            slot.tokens = self.saved.pop(best)

    def trim(self) -> None:
        """`server_prompt_cache::update`: the oldest dropped past the byte, then token limit."""
        limit = self.shape.limit_bytes
        while limit and self.saved and self._size() > limit:
            self.saved.pop(0)
        tokens = sum(len(s) for s in self.saved)
        per_token = max(1.0, self._size() / max(1, tokens))
        cap = (max(self.shape.limit_tokens, int(limit / per_token)) if limit
               else self.shape.limit_tokens)
        while self.shape.limit_tokens and self.saved and tokens > cap:
            tokens -= len(self.saved.pop(0))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The longest common prefix of two token sequences, by halving on slice equality (a
    C-speed comparison, where a token-by-token loop is not)."""
    a, b = list(a), list(b)
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low]; they differ by high
    if a[:high] == b[:high]:
        return high
    while high - low > 1:
        mid = (low + high) // 2
        if a[low:mid] == b[low:mid]:
            low = mid
        else:
            high = mid
    return low


def _choose(slots: list[_Slot], prompt: Sequence[int], now: float,
            similarity: float) -> tuple[_Slot, bool, float]:
    """The slot llama-server gives `prompt` at `now` (waiting for the first to free when
    every slot is busy), whether it updates the RAM cache first (taken by LRU, or keeping less
    than half its prompt), and when it was taken."""
    idle = [s for s in slots if s.busy_until <= now]
    if not idle:
        now = min(s.busy_until for s in slots)
        idle = [s for s in slots if s.busy_until <= now]
    best, share = None, 0.0
    if similarity > 0 and prompt:
        for slot in idle:
            if slot.tokens:
                found = common_prefix(slot.tokens, prompt) / len(prompt)
                if found > share and found > similarity:
                    best, share = slot, found
    if best is not None:
        return best, share * len(prompt) / len(best.tokens) < KEEP_FOR_SAVE, now
    return min(idle, key=lambda s: s.last_used), True, now


def replay(requests: Sequence[SlotRequest], cache: SlotCache,
           ram: RamCache | None = None) -> list[int]:
    """The prompt tokens each request could have found cached, in the order given (sent
    order), with the RAM prompt cache `ram` under the slots (None: off)."""
    slots = [_Slot() for _ in range(cache.slots)]
    store = _Ram(ram) if ram is not None else None
    out: list[int] = []
    for n, request in enumerate(requests):
        slot, update, now = _choose(slots, request.tokens, request.sent_s, cache.similarity)
        if store is not None and update:
            store.save(slot.tokens)
            store.load(slot, request.tokens)
            store.trim()
        reused = common_prefix(slot.tokens, request.tokens)
        out.append(max(0, min(reused, len(request.tokens) - 1)))
        slot.tokens, slot.busy_until, slot.last_used = request.held(n), request.end_s, n
        if store is not None and store.shape.save_idle:
            _save_idle(store, [s for s in slots if s.busy_until <= now])
    return out


def _save_idle(store: _Ram, idle: list[_Slot]) -> None:
    """`--cache-idle-slots`: each idle slot saved as a request starts (and, with a unified KV
    cache, cleared)."""
    for slot in idle:
        if store.save(slot.tokens):
            store.trim()
        if store.shape.unified:
            slot.tokens = ()


def unbounded(requests: Sequence[SlotRequest]) -> list[int]:
    """What any earlier prompt could have served each request (a slot for every prompt):
    the bound no slot choice exceeds."""
    out: list[int] = []
    for i, request in enumerate(requests):
        best = max((common_prefix(p.tokens, request.tokens) for p in requests[:i]), default=0)
        out.append(max(0, min(best, len(request.tokens) - 1)))
    return out
