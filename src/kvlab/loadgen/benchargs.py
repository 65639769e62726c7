"""`vllm bench serve`'s request and result options under its names (`BenchArgs`, used by
`kvlab load`), and their checks: what each request carries beyond kvlab's own body
(`--header`, `--extra-body`, `--temperature`), what the rows keep (`--metadata`) and which of
vllm bench's figures are shown and saved (`bench_ask`); the options guidellm 0.8 adds
(`--profile`, `--constraint`, `--override`, `--backend`) are read in `guidellm.py`. Each
refusal is one line before any request; nothing that looks like a secret reaches a row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvlab.core import InputError, JsonObject, Say, is_secret_name, secret_in_text

if TYPE_CHECKING:
    from kvlab.loadgen.benchresult import BenchAsk
    from kvlab.loadgen.slo import Objectives


class BenchArgs(BaseModel):
    """`vllm bench serve`'s request and result options, under its names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    header: tuple[str, ...] = Field((), json_schema_extra={"metavar": "KEY=VALUE"},
                                    description="A header sent on every request (repeat the "
                                    "flag for more); one that looks like a secret is sent but "
                                    "never written (the row counts it).")
    extra_body: str | None = Field(None, json_schema_extra={"metavar": "JSON"},
                                   description="A JSON object merged into every request's "
                                   "body (not the fields kvlab sets: model, messages, prompt, "
                                   "stream, max_tokens, ignore_eos).")
    request_id_prefix: str = Field("", description="Each request's X-Request-Id is this and "
                                   "its prompt's number, as vllm bench sends them [default: "
                                   "kvlab- and a random uuid].")
    temperature: float | None = Field(None, ge=0, description="Sampling temperature sent on "
                                      "every request [default: the server's].")
    metadata: tuple[str, ...] = Field((), json_schema_extra={"metavar": "KEY=VALUE"},
                                      description="Kept with the rows and the --save-result "
                                      "document (repeat the flag for more).")
    random_input_len: int | None = Field(None, ge=1, json_schema_extra={
        "aliases": "--synthetic-input-tokens-mean"}, description="Random prompts of this many "
                                         "of the served model's tokens (token ids drawn from "
                                         "its tokens of a generated passage, a fresh draw per "
                                         "request, nothing shared), sent to /v1/completions: "
                                         "vllm bench's random dataset. Replaces the prompt "
                                         "set.")
    input_stddev: float = Field(0.0, ge=0, json_schema_extra={
        "aliases": "--synthetic-input-tokens-stddev"}, description="Each random prompt's "
        "length drawn from a normal of this standard deviation around --random-input-len "
        "(at least 1; seeded by the prompt), as aiperf's.")
    output_tokens_stddev: float = Field(0.0, ge=0, description="Each request's max_tokens "
                                        "drawn from a normal of this standard deviation "
                                        "around --max-tokens (at least 1), as aiperf's; add "
                                        "--ignore-eos for exactly that many.")
    prefix_repetition_prefix_len: int = Field(256, ge=1, description="--dataset-name "
                                              "prefix_repetition: each shared prefix's tokens.")
    prefix_repetition_suffix_len: int = Field(256, ge=1, description="... and each request's "
                                              "own tokens after it.")
    prefix_repetition_num_prefixes: int = Field(10, ge=1, description="... and how many "
                                                "prefixes the requests share out.")
    prefix_repetition_output_len: int | None = Field(None, ge=1, description="... and the "
                                                     "answers' tokens [default: --max-tokens].")
    prompt_form: Literal["ids", "text"] | None = Field(
        None, description="How the --random-input-len prompts are sent: ids (the token ids; "
        "the server counts exactly N and tokenizes nothing) or text (those ids made text by "
        "the server's /detokenize before the run, as vllm bench sends its prompts: the "
        "server's tokenization is inside TTFT, and its count may differ from N by a few) "
        "[default: ids].")
    percentile_metrics: str | None = Field(None, description="vllm bench's figures to show "
                                           "and save: ttft,tpot,itl,e2el,client_queue_time,"
                                           "e2el_including_client_queue [default: "
                                           "ttft,tpot,itl].")
    metric_percentiles: str | None = Field(None, description="Their percentiles, e.g. "
                                           "50,90,99 [default: 99].")
    save_result: bool = Field(False, description="Write each level's result as vllm bench "
                              "serve does: one JSON document, its fields and names.")
    save_detailed: bool = Field(False, description="With --save-result: the per-request lists "
                                "too (no generated_texts: kvlab keeps no text).")
    result_dir: str | None = Field(None, description="--save-result's folder [default: the "
                                   "current one].")
    result_filename: str | None = Field(None, description="--save-result's file name "
                                        "[default: vllm bench's, "
                                        "LABEL-RATEqps-concurrencyN-MODEL-DATE.json].")
    profile: str | None = Field(None, json_schema_extra={"metavar": "kind=KIND,..."},
                                description="guidellm 0.8's load profile (not KVLAB_PROFILE) "
                                "as kvlab's levels, said as understood: kind=synchronous; "
                                "concurrent,streams=C; throughput[,max_concurrency=C]; "
                                "constant|poisson|async,rate=R[,max_concurrency=C]. A list: "
                                "streams[0]=1,streams[1]=4, a JSON object, or --override.")
    constraint: tuple[str, ...] = Field((), json_schema_extra={"metavar": "kind=KIND,..."},
                                        description="guidellm 0.8's limits: kind=max_duration,"
                                        "seconds=S (--max-seconds S), kind=max_requests,"
                                        "count=N or min_requests,count=N (--requests N).")
    override: tuple[str, ...] = Field((), json_schema_extra={"metavar": "KEY VALUES"},
                                      description="guidellm 0.8's values per benchmark, one "
                                      "level each: profile.rate 1,2,4 or profile.streams "
                                      "1,4,8.")
    output_dir: str | None = Field(None, description="One folder for everything the run "
                                   "writes: the notebook (labbook.md, unless --labbook), the "
                                   "per-request JSON lines beside it, each level's vllm bench "
                                   "result document, and after the run the report "
                                   "(report.html, report.md) with its tables as CSV (csv/).")

    def into_output_dir(self) -> BenchArgs:
        """With --output-dir: the result documents saved there."""
        if not self.output_dir:
            return self
        return self.model_copy(update={"save_result": True, "result_dir": self.output_dir})


# body fields kvlab sets itself, and the option that sets each
OWNED_BODY = {"model": "--model", "messages": "the workload", "prompt": "the workload",
              "stream": "kvlab always streams", "stream_options": "kvlab reads the usage chunk",
              "max_tokens": "--max-tokens (--random-output-len)",
              "max_completion_tokens": "--max-tokens (--random-output-len)",
              "ignore_eos": "--ignore-eos"}
# headers that frame the request: kvlab writes them
FRAMING_HEADERS = ("host", "content-length", "content-type", "transfer-encoding", "connection",
                   "expect", "te", "upgrade")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def pairs(option: str, given: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE values as (key, value), as vllm bench reads them (the first = splits)."""
    out = []
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{option} {item!r}: give KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def headers(given: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`--header` values, each one header line; refused when it would break the request."""
    out = pairs("--header", given)
    for name, value in out:
        if not _TOKEN.match(name):
            raise InputError(f"--header {name!r}: not a header name (letters, digits, -)")
        if name.lower() in FRAMING_HEADERS:
            raise InputError(f"--header {name}: kvlab writes it (it frames the request); "
                             "leave it out")
        if any(c in value for c in "\r\n\0"):
            raise InputError(f"--header {name}: a value is one line")
    return out


def repetition(bench: BenchArgs, max_tokens: int, say: Say) -> tuple[BenchArgs, int]:
    """vllm bench's prefix_repetition dataset as random token prompts: each a shared prefix
    of --prefix-repetition-prefix-len tokens (one of --prefix-repetition-num-prefixes) and its
    own suffix, answered with --prefix-repetition-output-len tokens, said as understood."""
    b = bench
    tokens = b.prefix_repetition_prefix_len + b.prefix_repetition_suffix_len
    output = b.prefix_repetition_output_len or max_tokens
    say(f"    --dataset-name prefix_repetition: random prompts of {tokens:,} tokens, the first "
        f"{b.prefix_repetition_prefix_len:,} one of {b.prefix_repetition_num_prefixes} shared "
        f"prefixes; answers of at most {output:,}")
    return b.model_copy(update={"random_input_len": tokens}), output


def request_id_prefix(given: str) -> str:
    """`--request-id-prefix`, refused when the id would not be one header value of visible
    characters."""
    if given and not all(33 <= ord(c) < 127 for c in given):
        raise InputError(f"--request-id-prefix {given!r}: visible ASCII characters only (it "
                         "starts a header value)")
    return given


def extra_body(text: str | None, temperature: float | None) -> JsonObject:
    """`--extra-body` as an object, refused when it sets what kvlab sets or holds a secret
    (every row records it)."""
    if not text:
        return {}
    try:
        body = json.loads(text)
    except ValueError:
        raise InputError("--extra-body: not JSON; give an object, e.g. "
                         "'{\"top_p\": 0.9}'") from None
    if not isinstance(body, dict):
        raise InputError("--extra-body: give a JSON object, e.g. '{\"top_p\": 0.9}'")
    for key in body:
        if key in OWNED_BODY:
            raise InputError(f"--extra-body: {key!r} is kvlab's to set ({OWNED_BODY[key]}); "
                             "leave it out")
    if "temperature" in body and temperature is not None:
        raise InputError("--extra-body: temperature is also given by --temperature; give it "
                         "once")
    from kvlab.records import check_no_secrets

    try:
        check_no_secrets(body)
    except ValueError:
        raise InputError("--extra-body: it names or holds a secret, and every row keeps it; "
                         "leave it out (a key goes in OPENAI_API_KEY or LOADTEST_API_KEY)") \
            from None
    return body


def bench_ask(args: BenchArgs, objectives: Objectives | None, levels: int) -> BenchAsk:
    """What to show and save of vllm bench's figures; refused before any request when the
    result cannot be written."""
    from kvlab.loadgen.benchresult import BenchAsk

    one_result_file(args, levels)
    if args.save_result and args.result_dir:
        try:
            Path(args.result_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--result-dir {args.result_dir}: cannot make it "
                             f"({exc.strerror})") from None
    metadata = pairs("--metadata", args.metadata)
    for key, value in metadata:
        kept_clean("--metadata", key, value)
    goodput = tuple((("e2el" if t.metric == "e2e" else t.metric), t.limit_s * 1000)
                    for t in (objectives.per_request if objectives else ()))
    return BenchAsk.parse(args.percentile_metrics, args.metric_percentiles,
                          save=args.save_result, directory=args.result_dir or "",
                          filename=args.result_filename or "", detailed=args.save_detailed,
                          goodput_ms=goodput, metadata=metadata)


def one_result_file(args: BenchArgs, levels: int) -> None:
    """Refuse --result-filename for a run of several levels (each would overwrite the last)."""
    if args.result_filename and levels > 1:
        raise InputError("--result-filename names one file: give one level, or leave it out "
                         "(each level's file is then named as vllm bench names it)")


def kept_clean(option: str, key: str, value: str) -> None:
    """Refuse, before the run, a KEY=VALUE (or JSON) every row will keep when it names or
    holds a secret."""
    if key and is_secret_name(key):
        raise InputError(f"{option} {key}: names a secret; leave it out: the notebook never "
                         "keeps one")
    found = secret_in_text(value)
    if found is not None:
        raise InputError(f"{option}: holds {found}; leave it out: the notebook never keeps a "
                         "secret")
