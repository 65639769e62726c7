"""`kvlab load` under `vllm bench serve`'s names: one --slo grammar (with --goodput), gamma
arrivals (--burstiness), what every request carries (--header, --extra-body, --temperature,
the key from OPENAI_API_KEY), what the rows keep (--metadata, the chosen percentiles) and the
result document (--save-result), against the fake engine; the refusals, one line each."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from fakes.sse_upstream import Behaviour, Counters, SseUpstream
from kvlab.core.errors import InputError
from kvlab.loadgen import slo, trace
from kvlab.loadgen.capacity import LatencyTarget
from kvlab.loadgen.runner import Schedule
from kvlab.loadgen.stats import Slo
from kvlab.records import notebook
from kvlab.records.models import LoadRecord

KEY = "sk-test0123456789abcdefXYZ"  # the shape of a real key: the notebook must never hold it


def test_one_slo_grammar_for_goodput_and_targets() -> None:
    both = slo.parse("ttft<=500ms,tpot<=0.05s ttft_p90<=1s,errors<=0.02")
    assert [t.text() for t in both.per_request] == ["ttft<=500ms", "tpot<=50ms"]
    assert [t.text() for t in both.percentiles] == ["ttft_p90<=1000ms"]
    assert both.errors == 0.02 and not both.understood
    assert Slo.of(both) == Slo(ttft_ms=500.0, tpot_ms=50.0)
    target = LatencyTarget.of(both, "x")
    assert [(b.key, b.limit_s) for b in target.bounds] == [("ttft_p90", 1.0)]
    # the older spellings and vllm bench's keep working, and say how they were read
    old = slo.parse("ttft_ms=500,e2e_ms=2000")
    vllm = slo.parse("ttft:500 tpot:50 e2el:2000")
    target_old = slo.parse("ttft_p90<=0.5,tpot_p99<=0.05")
    assert Slo.of(old) == Slo(ttft_ms=500.0, e2e_ms=2000.0)
    assert Slo.of(vllm) == Slo(ttft_ms=500.0, tpot_ms=50.0, e2e_ms=2000.0)
    assert [t.limit_s for t in target_old.percentiles] == [0.5, 0.05]
    assert old.understood[0] == ("--slo ttft_ms=500: understood as ttft<=500ms (kvlab's older "
                                 "goodput spelling, milliseconds)")
    assert "vllm bench's --goodput, milliseconds" in vllm.understood[0]
    aiperf = slo.parse("time_to_first_token:500 inter_token_latency:50 request_latency:2000")
    assert Slo.of(aiperf) == Slo.of(vllm)  # #49: aiperf's long names
    assert "aiperf's --goodput, milliseconds" in aiperf.understood[0]
    assert "older target spelling, seconds" in target_old.understood[0]
    for bad, words in (("ttft<=500", "give the unit"), ("itl<=50ms", "bound a percentile"),
                       ("ttft_p91<=1s", "p50, p90"), ("ttft<=-1ms", "above 0"),
                       ("errors<=0.1", "at least one bound"), ("queue<=1s", "not a bound"),
                       ("ttft:abc", "not a number")):
        with pytest.raises(InputError, match=words):
            slo.parse(bad)
    with pytest.raises(InputError, match="bounds a percentile"):
        LatencyTarget.parse("ttft<=500ms")


def test_burstiness_draws_gamma_gaps_of_mean_one_over_the_rate() -> None:
    """vllm bench's definition: gaps ~ gamma(shape=B, scale=1/(rate x B)): mean 1/rate for
    every B, coefficient of variation 1/sqrt(B); B=1 is the Poisson schedule kvlab drew
    before, B=inf evenly spaced."""
    rate, n = 20.0, 20_000
    for b in (0.25, 1.0, 4.0):
        gaps = [(y - x) / 1e9 for x, y in pairwise(
            Schedule(concurrency=1, rate=rate, burstiness=b, seed=5).offsets_ns(n))]
        mean = statistics.fmean(gaps)
        assert mean == pytest.approx(1 / rate, rel=0.05)
        assert statistics.stdev(gaps) / mean == pytest.approx(b ** -0.5, rel=0.08)
    poisson = Schedule(concurrency=1, rate=rate, seed=5)
    assert poisson.offsets_ns(50) == Schedule(concurrency=1, rate=rate, burstiness=1.0,
                                              seed=5).offsets_ns(50)
    even = Schedule(concurrency=1, rate=rate, burstiness=float("inf")).offsets_ns(4)
    assert even == [0, 50_000_000, 100_000_000, 150_000_000]


def kvlab(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvlab", "load", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def load_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOADTEST_API_KEY_ENV", "LOADTEST_API_KEY", "OPENAI_API_KEY")}
    return {**env, "KVLAB_HOME": str(tmp_path / "home"), "KVLAB_PROFILE": "none",
            "LABBOOK": str(tmp_path / "labbook.md")}


async def against_the_fake(*args: str, env: dict[str, str], behaviour: Behaviour | None = None
                           ) -> tuple[subprocess.CompletedProcess[str], Counters]:
    async with SseUpstream(behaviour or Behaviour(tokens=3)) as up:
        run = await asyncio.to_thread(kvlab, "--base-url", up.base_url.removesuffix("/v1"),
                                      *args, env=env)
    return run, up.counters


def test_vllm_bench_options_reach_every_request_the_row_and_the_result(
        tmp_path: Path) -> None:
    env = {**load_env(tmp_path), "OPENAI_API_KEY": KEY}
    results = tmp_path / "results"
    run, counters = asyncio.run(against_the_fake(
        "--model", "fake", "--num-prompts", "6", "--max-concurrency", "2",
        "--request-rate", "50", "--burstiness", "0.5", "--random-output-len", "3",
        "--endpoint", "/v1/completions", "--header", "X-Team=kv", "--header",
        f"X-Api-Key={KEY}", "--extra-body", '{"top_p": 0.5}', "--temperature", "0",
        "--metadata", "run=one", "--goodput", "ttft:60000", "--percentile-metrics", "ttft,e2el",
        "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(results),
        "--no-progress", env=env))
    assert run.returncode == 0, run.stderr
    said = run.stdout + run.stderr
    assert "API key from OPENAI_API_KEY" in said and KEY not in said
    assert "--slo ttft:60000: understood as ttft<=60000ms (vllm bench's --goodput" in said
    assert len(counters.bodies) == 6 + 2  # and one warm-up per concurrent request
    assert all(b["temperature"] == 0 and b["top_p"] == 0.5 and "prompt" in b
               for b in counters.bodies)
    assert all(h["x-team"] == "kv" and h["x-api-key"] == KEY for h in counters.headers)
    assert set(counters.authorization) == {f"Bearer {KEY}"}
    book = tmp_path / "labbook.md"
    assert KEY not in book.read_text()
    row = notebook.read(book).of(LoadRecord)[0]
    assert (row.ok, row.rate, row.arrivals, row.burstiness) == (6, 50.0, "gamma 0.5", 0.5)
    assert row.request_headers == {"X-Team": "kv"} and row.request_headers_withheld == 1
    assert row.extra_body == {"top_p": 0.5} and row.temperature == 0
    assert row.metadata == {"run": "one"}
    assert row.goodput is not None and row.goodput.slo == {"ttft_ms": 60000.0}
    assert row.vllm_metrics is not None and set(row.vllm_metrics) == {
        f"{s}_{m}_ms" for m in ("ttft", "e2el") for s in ("mean", "median", "std", "p50", "p99")}
    assert row.result_file is not None
    doc_path = Path(row.result_file)
    assert doc_path.parent == results and doc_path.name.startswith(
        "load-50.0qps-concurrency2-fake-")
    doc = json.loads(doc_path.read_text())
    assert KEY not in doc_path.read_text()
    assert list(doc)[:8] == ["date", "endpoint_type", "backend", "label", "model_id",
                             "tokenizer_id", "num_prompts", "run"]
    assert (doc["backend"], doc["num_prompts"], doc["completed"], doc["failed"]) == \
        ("openai", 6, 6, 0)
    assert (doc["request_rate"], doc["burstiness"], doc["max_concurrency"]) == (50.0, 0.5, 2)
    assert doc["total_output_tokens"] == 18 and doc["total_input_tokens"] == 6 * 100
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])
    assert len(doc["latencies"]) == 6 and "ttfts" not in doc  # no --save-detailed
    for key in ("p50_ttft_ms", "p99_e2el_ms", "median_ttft_ms", "std_e2el_ms"):
        assert doc[key] == pytest.approx(row.vllm_metrics[key], abs=1e-6)
    assert doc["p99_e2el_ms"] >= doc["p50_e2el_ms"] > 0
    assert "vllm bench's result in" in run.stdout


def test_an_infinite_rate_is_the_closed_loop(tmp_path: Path) -> None:
    run, _ = asyncio.run(against_the_fake(
        "--model", "fake", "--num-prompts", "3", "--max-concurrency", "1", "--request-rate",
        "inf", "--burstiness", "0.5", "--max-tokens", "2", "--no-progress",
        env=load_env(tmp_path)))
    assert run.returncode == 0, run.stderr
    row = notebook.read(tmp_path / "labbook.md").of(LoadRecord)[0]
    assert (row.ok, row.rate, row.arrivals, row.burstiness) == (3, None, "closed-loop", None)


@pytest.mark.parametrize(("args", "words"), [
    (("--extra-body", '{"model": "x"}'), "--extra-body: 'model' is kvlab's to set (--model)"),
    (("--extra-body", '{"stream": false}'), "'stream' is kvlab's to set"),
    (("--extra-body", "[1]"), "--extra-body: give a JSON object"),
    (("--extra-body", '{"temperature": 1}', "--temperature", "0"), "give it once"),
    (("--header", "Host=elsewhere"), "--header Host: kvlab writes it"),
    (("--header", "no-equals"), "--header 'no-equals': give KEY=VALUE"),
    (("--slo", "ttft_p90<=500ms"), "a --find-capacity target"),
    (("--goodput", "ttft<=500"), "give the unit"),
    (("--burstiness", "0"), "--arrivals '0': give poisson, even or a burstiness above 0"),
    (("--random-input-len", "8", "--endpoint", "chat"), "--random-input-len: random prompts"),
    (("--synthetic-input-tokens-mean", "8", "--endpoint", "chat"),
     "--random-input-len: random prompts"),
    (("--prompt-form", "text"), "--prompt-form text: only random prompts (--random-input-len)"),
    (("--prompt-form", "ids", "--users", "2"), "--prompt-form ids: only random prompts"),
    (("--prompt-form", "words", "--random-input-len", "8"), "--prompt-form"),
    (("--concurrency", "1,2", "--save-result", "--result-filename", "r.json"),
     "--result-filename names one file"),
    (("--percentile-metrics", "ttft,queue"), "--percentile-metrics 'ttft,queue': choose"),
    (("--metadata", f"key={KEY}"), "the notebook never keeps a secret"),
    (("--extra-body", '{"api_key": "x"}'), "--extra-body: it names or holds a secret"),
])
def test_refusals_are_one_line_before_any_request(tmp_path: Path, args: tuple[str, ...],
                                                  words: str) -> None:
    run = kvlab("--base-url", "http://127.0.0.1:9/v1", "--model", "fake", "--no-progress",
                *args, env=load_env(tmp_path))
    assert run.returncode == 2, run.stdout + run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "labbook.md").exists()



def test_aiperf_and_guidellm_names_mean_what_they_mean_there(tmp_path: Path) -> None:
    """aiperf's `--url host:port` (no scheme), `--request-count`, `--concurrency`,
    `--output-tokens-mean`, `--warmup-request-count`; guidellm's `--target` (the server root)
    and `--max-requests`. (aiperf's `--synthetic-input-tokens-mean` is among the refusals:
    the fake has no /tokenize.)"""
    async def both() -> tuple[str, subprocess.CompletedProcess[str], Counters,
                              subprocess.CompletedProcess[str], Counters]:
        async with SseUpstream(Behaviour(tokens=3)) as up:
            hostport = up.base_url.removeprefix("http://").removesuffix("/v1")
            aiperf = await asyncio.to_thread(
                kvlab, "--url", hostport, "--model", "fake", "--request-count", "5",
                "--concurrency", "1", "--output-tokens-mean", "3", "--warmup-request-count",
                "2", "--endpoint", "completions", "--no-progress",
                env=load_env(tmp_path / "a"))
        async with SseUpstream(Behaviour(tokens=3)) as up2:
            guide = await asyncio.to_thread(
                kvlab, "--target", up2.base_url.removesuffix("/v1"), "--model", "fake",
                "--max-requests", "4", "--concurrency", "2", "--no-progress",
                env=load_env(tmp_path / "g"))
        return hostport, aiperf, up.counters, guide, up2.counters

    hostport, aiperf, seen, guide, seen2 = asyncio.run(both())
    assert aiperf.returncode == 0, aiperf.stderr
    assert f"--base-url {hostport}: a host and port, as aiperf takes it" in \
        aiperf.stdout + aiperf.stderr
    assert len(seen.bodies) == 5 + 2  # measured, and the warm-up asked for
    assert all(b["max_tokens"] == 3 and "prompt" in b for b in seen.bodies)
    assert notebook.read(tmp_path / "a" / "labbook.md").of(LoadRecord)[0].ok == 5
    assert guide.returncode == 0, guide.stderr
    assert "a server root, as vllm bench takes it" in guide.stdout + guide.stderr
    assert len(seen2.bodies) == 4 + 2  # one warm-up per concurrent request
    assert notebook.read(tmp_path / "g" / "labbook.md").of(LoadRecord)[0].ok == 4


def random_prompts(form: str, tmp_path: Path, tokenizer: tuple[str, ...]) -> tuple[
        subprocess.CompletedProcess[str], Counters]:
    return asyncio.run(against_the_fake(
        "--model", "fake", "--random-input-len", "12", "--num-prompts", "3",
        "--max-concurrency", "1", "--max-tokens", "2", "--seed", "5", "--prompt-form", form,
        "--no-progress", env=load_env(tmp_path / form),
        behaviour=Behaviour(tokens=2, tokenizer=tokenizer)))


def test_text_prompts_are_the_servers_text_of_the_same_token_ids(tmp_path: Path) -> None:
    """--prompt-form text sends, as a string, what the server's /detokenize made of the
    token ids --prompt-form ids sends (warm-up included); the row says which form."""
    both = ("/tokenize", "/detokenize")
    (ids, sent_ids), (text, sent_text) = (random_prompts(f, tmp_path, both)
                                          for f in ("ids", "text"))
    assert ids.returncode == 0 and text.returncode == 0, ids.stderr + text.stderr
    prompts = [b["prompt"] for b in sent_ids.bodies]
    assert len(prompts) == 1 + 3 and all(isinstance(p, list) and len(p) == 12 for p in prompts)
    assert not sent_ids.detokenized
    assert sent_text.detokenized[1:] == prompts  # after the probe: each prompt's ids, once
    assert [b["prompt"] for b in sent_text.bodies] == [
        " ".join(f"w{t}" for t in p) for p in prompts]
    rows = [notebook.read(tmp_path / f / "labbook.md").of(LoadRecord)[0] for f in ("ids", "text")]
    assert [(r.prompt_form, r.random_input_len, r.ok) for r in rows] == [
        ("ids", 12, 3), ("text", 12, 3)]


def test_text_prompts_without_a_detokenizer_are_refused_before_any_request(
        tmp_path: Path) -> None:
    run, sent = random_prompts("text", tmp_path, ("/tokenize",))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--prompt-form text: no /detokenize answered" in run.stderr
    assert "--tokenize-url" in run.stderr and "Traceback" not in run.stderr
    assert sent.requests == 0 and not (tmp_path / "text" / "labbook.md").exists()


def word_tokenizer(path: Path) -> Path:
    """A tokenizer.json of 50 words (ids 0-49), made here as a user's model directory holds
    one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(49)} | {"[UNK]": 49}
    made = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir(parents=True, exist_ok=True)
    made.save(str(path / "tokenizer.json"))
    return path


def test_random_prompts_for_a_server_without_tokenize_come_from_tokenizer(
        tmp_path: Path) -> None:
    """#49: against any OpenAI-compatible server with no /tokenize, --random-input-len exited
    2 naming --tokenize-url, a flag not given; vllm bench sizes them with --tokenizer."""
    def run(*more: str) -> tuple[subprocess.CompletedProcess[str], Counters]:
        return asyncio.run(against_the_fake(
            "--model", "fake", "--random-input-len", "12", "--num-prompts", "3",
            "--max-concurrency", "1", "--max-tokens", "2", "--no-progress", *more,
            env=load_env(tmp_path / str(len(more))), behaviour=Behaviour(tokens=2,
                                                                        tokenizer=())))

    bare, none_sent = run()
    assert bare.returncode == 2 and "Traceback" not in bare.stderr
    assert "--random-input-len: no /tokenize answered" in bare.stderr
    assert "give --tokenizer with the model's directory or tokenizer.json" in bare.stderr
    assert none_sent.requests == 0
    local, sent = run("--tokenizer", str(word_tokenizer(tmp_path / "model")))
    assert local.returncode == 0, local.stderr
    prompts = [b["prompt"] for b in sent.bodies]
    assert len(prompts) == 1 + 3
    assert all(len(p) == 12 and set(p) <= set(range(50)) for p in prompts)
    row = notebook.read(tmp_path / "2" / "labbook.md").of(LoadRecord)[0]
    assert row.ok == 3 and row.random_input_len == 12
    wrong = run("--tokenizer", str(tmp_path / "nowhere"))[0]
    assert wrong.returncode == 2 and "--tokenizer" in wrong.stderr and "no tokenizer.json" in \
        wrong.stderr


def test_request_ids_are_the_prefix_and_the_prompts_number(tmp_path: Path) -> None:
    """#49: vllm bench's --request-id-prefix (ids were always kvlab-<uuid>)."""
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--requests", "3", "--concurrency", "1", "--max-tokens", "2",
        "--preamble-tokens", "40", "--request-id-prefix", "bench-", "--no-progress",
        env=load_env(tmp_path / "ids"), behaviour=Behaviour(tokens=2)))
    assert run.returncode == 0, run.stderr
    ids = [h["x-request-id"] for h in seen.headers if "x-request-id" in h]
    assert len(ids) == 1 + 3 and len(set(ids)) == 4
    assert all(i.startswith("bench-") and i.removeprefix("bench-").isdigit() for i in ids)
    row = notebook.read(tmp_path / "ids" / "labbook.md").of(LoadRecord)[0]
    assert row.requests_file is not None
    bad = asyncio.run(against_the_fake("--model", "fake", "--request-id-prefix", "a b",
                                       env=load_env(tmp_path / "bad")))[0]
    assert bad.returncode == 2 and "--request-id-prefix 'a b': visible ASCII" in bad.stderr


def test_several_goodput_and_header_values_after_one_flag(tmp_path: Path) -> None:
    """#49: `--goodput ttft:500 tpot:50` and `--header A=1 B=2`, as vllm bench takes them."""
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--requests", "2", "--concurrency", "1", "--max-tokens", "2",
        "--preamble-tokens", "40", "--header", "X-A=1", "X-B=2", "--goodput", "ttft:60000",
        "time_to_first_token:50000", "--no-progress", env=load_env(tmp_path / "many"),
        behaviour=Behaviour(tokens=2)))
    assert run.returncode == 0, run.stderr
    assert all(h.get("x-a") == "1" and h.get("x-b") == "2" for h in seen.headers
               if "x-request-id" in h)
    row = notebook.read(tmp_path / "many" / "labbook.md").of(LoadRecord)[0]
    assert row.goodput is not None and row.goodput.slo == {"ttft_ms": 50000.0}


def test_dataset_name_random_alone_is_vllm_benchs_random_prompts(tmp_path: Path) -> None:
    """#49: `--dataset-name random` meant kvlab's shared-prefix set; in vllm bench it is
    random token prompts of --random-input-len (1,024 unless given)."""
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--dataset-name", "random", "--num-prompts", "2",
        "--max-concurrency", "1", "--max-tokens", "2", "--no-progress",
        env=load_env(tmp_path / "random"),
        behaviour=Behaviour(tokens=2, tokenizer=("/tokenize",))))
    assert run.returncode == 0, run.stderr
    assert "--dataset-name random: random prompts of 1,024 tokens" in run.stdout + run.stderr
    assert all(isinstance(b["prompt"], list) and len(b["prompt"]) == 1024 for b in seen.bodies)
    row = notebook.read(tmp_path / "random" / "labbook.md").of(LoadRecord)[0]
    assert (row.random_input_len, row.prompt_set) == (1024, "random")


def test_guidellms_synthetic_data_spec_is_random_prompts(tmp_path: Path) -> None:
    """#49: guidellm's `--data "prompt_tokens=N,output_tokens=M"` was read as a file name."""
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--data", "prompt_tokens=24,output_tokens=3", "--max-requests", "2",
        "--concurrency", "1", "--no-progress", env=load_env(tmp_path / "syn"),
        behaviour=Behaviour(tokens=2, tokenizer=("/tokenize",))))
    assert run.returncode == 0, run.stderr
    assert "random prompts of 24 tokens (--random-input-len), answers of at most 3" in \
        run.stdout + run.stderr
    assert all(len(b["prompt"]) == 24 and b["max_tokens"] == 3 for b in seen.bodies)
    bad = asyncio.run(against_the_fake("--model", "fake", "--data", "prompt_tokens=24,x=1",
                                       env=load_env(tmp_path / "bad")))[0]
    assert bad.returncode == 2 and "'x=1' is not one of them" in bad.stderr


def test_aiperfs_custom_dataset_types_are_read(tmp_path: Path) -> None:
    """#49: aiperf's `--custom-dataset-type multi_turn` and `single_turn` files were refused,
    and `mooncake_trace` is its name for a trace."""
    turns = tmp_path / "turns.jsonl"
    turns.write_text("".join(json.dumps({"session_id": f"s{i}", "turns": [
        {"text": f"hello {i}"}, {"texts": [f"and then {i}"], "output_length": 2}]}) + "\n"
        for i in range(2)))
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--input-file", str(turns), "--custom-dataset-type", "multi_turn",
        "--max-tokens", "2", "--no-progress", env=load_env(tmp_path / "mt"),
        behaviour=Behaviour(tokens=2)))
    assert run.returncode == 0, run.stderr
    row = notebook.read(tmp_path / "mt" / "labbook.md").of(LoadRecord)[0]
    assert row.dataset is not None and row.dataset.format == "multi_turn"
    assert row.sessions is not None and row.ok == 4  # two users, two turns each
    last = [b["messages"][-1]["content"] for b in seen.bodies]
    assert {"hello 0", "and then 0", "hello 1", "and then 1"} <= set(last)
    single = tmp_path / "single.jsonl"
    single.write_text('{"text": "one"}\n{"text": "two"}\n')
    one = asyncio.run(against_the_fake(
        "--model", "fake", "--input-file", str(single), "--custom-dataset-type", "single_turn",
        "--requests", "2", "--concurrency", "1", "--max-tokens", "2", "--no-progress",
        env=load_env(tmp_path / "st"), behaviour=Behaviour(tokens=2)))[0]
    assert one.returncode == 0, one.stderr
    made = trace.synthetic(3, block_tokens=16, rate=50.0, output_length=2)
    path = trace.write(tmp_path / "trace.jsonl", made)
    moon = asyncio.run(against_the_fake(
        "--model", "fake", "--input-file", str(path), "--custom-dataset-type", "mooncake_trace",
        "--trace-block-size", "16", "--max-tokens", "2", "--no-progress",
        env=load_env(tmp_path / "mc"), behaviour=Behaviour(tokens=2,
                                                          tokenizer=("/tokenize",))))[0]
    assert moon.returncode == 0, moon.stderr
    assert "mooncake_trace: " in moon.stdout + moon.stderr
    replayed = notebook.read(tmp_path / "mc" / "labbook.md").of(LoadRecord)[0]
    assert replayed.trace is not None and replayed.trace.requests == 3


def test_aiperfs_spreads_draw_each_prompt_and_answer_length(tmp_path: Path) -> None:
    """#49: aiperf's --synthetic-input-tokens-stddev and --output-tokens-stddev (every prompt
    and answer had the same length): each drawn around the mean, seeded, at least 1."""
    def run(seed: str) -> tuple[subprocess.CompletedProcess[str], Counters]:
        return asyncio.run(against_the_fake(
            "--model", "fake", "--synthetic-input-tokens-mean", "40",
            "--synthetic-input-tokens-stddev", "10", "--output-tokens-mean", "20",
            "--output-tokens-stddev", "5", "--request-count", "30", "--concurrency", "2",
            "--seed", seed, "--no-progress", env=load_env(tmp_path / seed),
            behaviour=Behaviour(tokens=2, tokenizer=("/tokenize",))))

    (first, seen), (again, same) = run("3"), run("3")
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    sizes = [len(b["prompt"]) for b in seen.bodies]
    answers = [b["max_tokens"] for b in seen.bodies]
    assert len(set(sizes)) > 5 and min(sizes) >= 1 and 30 <= sum(sizes) / len(sizes) <= 50
    assert len(set(answers)) > 3 and 15 <= sum(answers) / len(answers) <= 25
    # seeded: the same draws again (two in flight may reach the server in either order)
    assert sorted(len(b["prompt"]) for b in same.bodies) == sorted(sizes)
    row = notebook.read(tmp_path / "3" / "labbook.md").of(LoadRecord)[0]
    assert (row.random_input_len, row.input_stddev, row.output_tokens_stddev) == (40, 10, 5)


def test_max_seconds_sends_nothing_after_it(tmp_path: Path) -> None:
    """#49: guidellm's --max-seconds (at most; --duration is at least): an open-loop level
    at 20 a second asked for 400 requests stops sending after 1 s, its in-flight answers
    finish, the rest are counted unsent; a closed loop stops the same way."""
    def run(*more: str) -> tuple[subprocess.CompletedProcess[str], LoadRecord]:
        label = str(len(more)) + more[0]
        done, _ = asyncio.run(against_the_fake(
            "--model", "fake", "--requests", "400", "--max-tokens", "4", "--preamble-tokens",
            "40", "--max-seconds", "1", "--warmup", "0", "--no-progress", *more,
            env=load_env(tmp_path / label), behaviour=Behaviour(tokens=4, itl_s=0.02)))
        return done, notebook.read(tmp_path / label / "labbook.md").of(LoadRecord)[0]

    for more in (("--rate", "20", "--concurrency", "64"), ("--concurrency", "2")):
        done, row = run(*more)
        assert done.returncode == 0, done.stderr
        assert row.cut_at_max_seconds and row.max_seconds == 1.0
        assert 5 <= row.requests <= 40 and row.requests_planned == 400, row.requests
        assert row.ok == row.requests and (row.unsent or 0) == 400 - row.requests
        assert (row.duration_s or 0) < 2.0


def test_guidellms_rate_types_are_kvlabs_levels(tmp_path: Path) -> None:
    """#49: guidellm's --rate-type with --rate, said as understood."""
    def run(*more: str) -> tuple[subprocess.CompletedProcess[str], list[LoadRecord]]:
        label = "-".join(more).replace(".", "")
        done, _ = asyncio.run(against_the_fake(
            "--model", "fake", "--max-requests", "6", "--max-tokens", "2", "--preamble-tokens",
            "40", "--no-progress", *more, env=load_env(tmp_path / label),
            behaviour=Behaviour(tokens=2)))
        book = tmp_path / label / "labbook.md"
        return done, notebook.read(book).of(LoadRecord) if book.exists() else []

    done, rows = run("--rate-type", "synchronous")
    assert done.returncode == 0 and [r.concurrency for r in rows] == [1], done.stderr
    assert "--rate-type synchronous: closed loop at concurrency 1" in done.stdout + done.stderr
    done, rows = run("--rate-type", "concurrent", "--rate", "2,3")
    assert done.returncode == 0 and [(r.concurrency, r.rate) for r in rows] == [
        (2, None), (3, None)], done.stderr
    done, rows = run("--rate-type", "constant", "--rate", "30")
    assert done.returncode == 0 and rows[0].rate == 30 and rows[0].arrivals == "even"
    done, rows = run("--rate-type", "sweep")
    assert done.returncode == 2 and "give that instead" in done.stderr and not rows


def test_one_output_dir_holds_what_other_tools_read(tmp_path: Path) -> None:
    """#49: --output-dir: the per-request JSON lines, vllm bench's result document, the levels
    as CSV and the HTML report, in one folder."""
    folder = tmp_path / "out"
    env = load_env(tmp_path / "env")
    env.pop("LABBOOK", None)
    run, _ = asyncio.run(against_the_fake(
        "--model", "fake", "--requests", "3", "--concurrency", "1,2", "--max-tokens", "2",
        "--preamble-tokens", "40", "--output-dir", str(folder), "--no-progress", env=env,
        behaviour=Behaviour(tokens=2)))
    assert run.returncode == 0, run.stderr
    rows = notebook.read(folder / "labbook.md").of(LoadRecord)
    assert [r.concurrency for r in rows] == [1, 2]
    assert all(r.result_file and (folder / Path(r.result_file).name).is_file() for r in rows)
    assert len(list((folder / "kvlab-requests").glob("*.jsonl"))) == 2
    assert (folder / "report.html").is_file() and list((folder / "csv").glob("*.csv"))
    document = json.loads((folder / Path(rows[0].result_file or "").name).read_text())
    assert document["completed"] == 3


def test_prefix_repetition_is_random_prompts_sharing_a_few_prefixes(tmp_path: Path) -> None:
    """#49: vllm bench's --dataset-name prefix_repetition (and its four sizes)."""
    run, seen = asyncio.run(against_the_fake(
        "--model", "fake", "--dataset-name", "prefix_repetition",
        "--prefix-repetition-prefix-len", "20", "--prefix-repetition-suffix-len", "6",
        "--prefix-repetition-num-prefixes", "3", "--prefix-repetition-output-len", "2",
        "--num-prompts", "9", "--max-concurrency", "1", "--no-progress",
        env=load_env(tmp_path / "rep"), behaviour=Behaviour(tokens=2, tokenizer=("/tokenize",))))
    assert run.returncode == 0, run.stderr
    prompts = [b["prompt"] for b in seen.bodies]
    assert all(len(p) == 26 and b["max_tokens"] == 2 for p, b in zip(prompts, seen.bodies,
                                                                      strict=True))
    measured = prompts[1:]  # after the warm-up's
    assert len({tuple(p[:20]) for p in measured}) == 3  # three prefixes shared out
    assert len({tuple(p[20:]) for p in measured}) == 9  # each its own suffix
    missing = asyncio.run(against_the_fake("--model", "fake", "--custom-dataset-type",
                                           "mooncake_trace", env=load_env(tmp_path / "mc")))[0]
    assert missing.returncode == 2 and "give the file" in missing.stderr
