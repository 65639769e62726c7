"""What a load level sent: its workload (a prompt set, user sessions or a replayed trace) and
what each kind showed (returning turns, the trace's sizing and reuse, a user's dataset file),
how its prompts were sized, and what every request carried beyond its prompt.

These are parts of the `load` line (`load.py`) and of a capacity search (`capacity.py`); no
statistic of a level is here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, JsonValue

from kvlab.records.base import Strict


class ThinkTimeLine(Strict):
    """How long a user thinks between a reply and the next turn."""

    kind: Literal["fixed", "exponential", "trace", "paced"]
    mean_s: float
    source: str | None = Field(None, description="Where the mean came from (a paced think "
                               "time's request time, a trace file).")
    in_flight: int | None = Field(None, description="paced: users meant to wait at once.")
    values: int | None = Field(None, description="trace: how many think times it draws from.")


class Workload(Strict):
    """The kind of workload a row measured and its level."""

    kind: Literal["prompt set", "sessions", "trace"]
    concurrency: int | None = Field(None, description="A prompt set's concurrent requests.")
    users: int | None = Field(None, description="Sessions: users live at once.")
    turns: int | None = None
    think_time: ThinkTimeLine | None = None
    user_rate: float | None = Field(None, description="New users a second (None: all there "
                                    "from the start).")
    arrivals: str | None = None
    in_flight_cap: int | None = Field(None, description="A trace's in-flight cap.")
    distinct_opening: bool | None = Field(
        None, description="Sessions: each conversation's system line began with a tag of its "
        "own, so no two conversations shared a cache block (the shared-first-block control).")


class SessionsEvidence(Strict):
    """What user sessions' turns showed: returning turns, how many came back after eviction,
    cached tokens on first and returning turns, the working set."""

    conversations: int
    turns: int
    returning_turns: int
    evicted_turns: int
    held_turns: int
    returning_hit_rate: float | None = None
    returning_cached_tokens_mean: float | None = None
    first_turn_cached_tokens_mean: float | None = None
    working_set_tokens: int
    cache_block_tokens: int
    cache_block_from: str
    eviction_rule: str
    conversations_planned: int | None = None
    conversations_started: int | None = None
    peak_active_users: int | None = None


class TraceEvidence(Strict):
    """A replayed trace: which, how it was sized and sped up, what an infinite cache would
    reuse of it."""

    path: str
    sha256: str
    format: str
    requests: int
    limit: int | None = Field(None, description="--trace-limit: the trace's first N requests, "
                              "counted before any was left out.")
    max_input: int | None = Field(None, description="--trace-max-input, tokens.")
    over_max_input: Literal["truncate", "filter"] | None = Field(
        None, description="What became of a longer request: cut to fit (truncate) or left out "
        "(filter).")
    left_out_over_max_input: int = 0
    truncated_to_max_input: int = 0
    block_tokens: int
    speedup: float
    span_s: float
    distinct_blocks: int
    reusable_fraction_infinite_cache: float | None = None
    outputs_capped: int = 0
    tokens_from: str | None = None


class DatasetEvidence(Strict):
    """A dataset file the user brought: which (its name and digest, never its contents), how
    it was read, and what of it a level sent."""

    file: str = Field(description="The file's name (not its folder).")
    sha256: str
    format: Literal["sharegpt", "prompts", "multi_turn"]
    records: int = Field(description="Records in the file.")
    usable: int = Field(description="Records that can be sent (the rest were skipped).")
    skipped: dict[str, int] = Field(default_factory=dict, description="Records left out, by "
                                    "reason.")
    keys: list[str] = Field(default_factory=list, description="The keys read: the prompt's "
                            "and the output length's (JSONL), conversations (ShareGPT).")
    conversations: int = Field(0, description="Usable records with more than one user turn "
                               "(replayed as user sessions).")
    sent: int = Field(0, description="Records this level sent (or began).")
    first_record: int = Field(0, description="The usable record this level began with "
                              "(0-based; levels and repeats go on through the file).")
    resent: int = Field(0, description="Of those, records an earlier level or repeat of the "
                        "run had sent (the file ran out and began again; their prefixes may "
                        "still be cached).")
    outputs_from_file: int = Field(0, description="Requests whose max_tokens was the "
                                   "record's own output length.")
    outputs_capped: int = Field(0, description="Of those, capped at the run's max_tokens.")


class PromptFit(Strict):
    """The longest prompt set against the context the server serves, before the first
    request (`loadgen/fit.py`)."""

    longest_prompt_tokens: int = Field(description="The longest prompt of the largest level, "
                                       "as the server counts it (its template applied).")
    counted_by: str = Field(description="The tokenizer endpoint that counted it.")
    answer_tokens: int = Field(description="MAX_TOKENS: room each answer needs.")
    served_context: int = Field(description="The context the server states.")
    context_from: str = Field(description="Where the server states it.")
    preamble_asked: int | None = Field(None, description="The preamble asked for, when it "
                                       "was cut to fit (the row's preamble is what was sent).")


class PromptSizing(Strict):
    """How a row's prompts were sized: the model's own tokenizer or the estimate."""

    method: Literal["tokenizer", "estimate"]
    source: str
    tokens_per_word: float
    preamble_tokens_requested: int
    preamble_tokens_actual: int | None = None
    fit: PromptFit | None = None


class PrefixGroups(Strict):
    """A shared-prefix set split into groups, and each group's share of the requests."""

    groups: int
    shares: list[float]


class RequestShape(Strict):
    """What every request of a row carried beyond its prompt (vllm bench serve's options)."""

    temperature: float | None = None
    extra_body: dict[str, JsonValue] | None = Field(None, description="--extra-body, merged "
                                                     "into every request's body.")
    request_headers: dict[str, str] | None = Field(
        None, description="--header, sent on every request, but for those that look like a "
        "secret.")
    request_headers_withheld: int | None = Field(
        None, description="Headers sent whose name or value looks like a secret: left out.")
    metadata: dict[str, str] | None = Field(None, description="--metadata KEY=VALUE.")
    burstiness: float | None = Field(None, description="Open loop: the gamma shape of the "
                                     "arrival gaps (1: Poisson; inf is written as even).")
    random_input_len: int | None = Field(
        None, description="--random-input-len: the token ids drawn for every random prompt "
        "(sent as ids, the server counts exactly these; sent as text, the input token figures "
        "are the server's count of the text, which may differ by a few).")
    input_stddev: float | None = Field(None, description="--synthetic-input-tokens-stddev: "
                                       "the random prompts' lengths spread around "
                                       "random_input_len (a normal, at least 1).")
    output_tokens_stddev: float | None = Field(None, description="--output-tokens-stddev: "
                                               "each request's max_tokens spread around the "
                                               "row's (a normal, at least 1).")
    prompt_form: Literal["ids", "text"] | None = Field(
        None, description="--prompt-form: how the random prompts were sent: ids (their token "
        "ids, no tokenization in TTFT) or text (the server's /detokenize of those ids, made "
        "before the run, as vllm bench sends text: the server's tokenization is inside TTFT).")
