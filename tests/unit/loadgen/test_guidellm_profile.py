"""guidellm 0.8's `guidellm run` names as `kvlab load` reads them (#49): `--profile kind=...`
(synchronous, concurrent's streams, throughput, constant/poisson/async's rate and
max_concurrency), `--constraint kind=...` (max_duration as --max-seconds, max_requests and
min_requests as --requests), `--override profile.rate|profile.streams VALUES` (one level
each) and `--data kind=synthetic_text,...`, each into kvlab's spec and said as understood;
what kvlab cannot do is one line naming the flag and what to give instead. guidellm's own
syntax (0.8.1): `guidellm/utils/click_pydantic.py` and `utils/arg_string.py` (kind=KIND,
key=value, key[i]=value, or a JSON object), `schemas/benchmark/profiles/*.py` and
`schemas/scheduler/constraints/*.py` (the keys), `cli/run.py` (--override KEY VALUES)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab.cli.load_cmd import load_command
from kvlab.cli.options import parse
from kvlab.core import load_settings
from kvlab.core.errors import InputError
from kvlab.loadgen import BenchArgs, LoadArgs, TargetArgs, load_spec
from kvlab.loadgen.spec import LoadSpec

URL = "http://127.0.0.1:9/v1"  # nothing listens: the spec is made before any request


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CONCURRENCY", "REQUESTS", "MAX_TOKENS", "KVLAB_PROFILE", "PROMPT_SET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no ./.env


def spec_of(*argv: str) -> tuple[LoadSpec, str]:
    """`kvlab load ARGV`'s spec, its options read by the command's own parser (aliases, and
    several values after one flag), and what it said."""
    ctx = load_command.make_context("load", ["--base-url", URL, *argv])
    target, load, bench = (parse(m, {k: ctx.params[k] for k in m.model_fields})
                           for m in (TargetArgs, LoadArgs, BenchArgs))
    assert isinstance(target, TargetArgs) and isinstance(load, LoadArgs)
    assert isinstance(bench, BenchArgs)
    said: list[str] = []
    spec = load_spec(load_settings(None, target.overrides()), load,
                     base_url=URL, label="t", engine="vllm", lab=None, bench=bench,
                     say=said.append)
    return spec, "\n".join(said)


@pytest.mark.parametrize(("argv", "levels", "rate", "rates", "burstiness", "words"), [
    (("--profile", "kind=synchronous"), (1,), None, (), 1.0,
     "--profile kind=synchronous: closed loop at concurrency 1"),
    (("--profile", "kind=concurrent,streams=4"), (4,), None, (), 1.0,
     "closed loop at concurrency 4"),
    (("--profile", "kind=concurrent,streams[0]=1,streams[1]=8"), (1, 8), None, (), 1.0,
     "closed loop at concurrency 1, 8"),
    (("--profile", '{"kind": "concurrent", "streams": [2, 3]}'), (2, 3), None, (), 1.0,
     "concurrency 2, 3"),
    (("--profile", "kind=concurrent,streams=1", "--override", "profile.streams", "1,2,4"),
     (1, 2, 4), None, (), 1.0, "closed loop at concurrency 1, 2, 4"),
    (("--profile", "kind=throughput,max_concurrency=16"), (16,), None, (), 1.0,
     "--profile kind=throughput: closed loop at concurrency 16"),
    (("--profile", "kind=throughput", "--max-requests", "30"), (30,), None, (), 1.0,
     "closed loop at concurrency 30"),
    (("--profile", "kind=constant,rate=10", "--concurrency", "8"), (8,), 10.0, (), math.inf,
     "--profile kind=constant: even arrivals at 10 requests a second (--rate --arrivals "
     "even), at most 8 in flight"),
    (("--profile", "kind=async,rate=2.5,max_concurrency=4"), (4,), 2.5, (), math.inf,
     "at most 4 in flight"),
    (("--profile", "kind=poisson,rate=3,max_concurrency=6"), (6,), 3.0, (), 1.0,
     "--profile kind=poisson: Poisson arrivals at 3 requests a second (--rate)"),
    (("--profile", "kind=constant", "--override", "profile.rate", "1,2.5", "--concurrency",
      "64"), (64,), None, (1.0, 2.5), math.inf, "even arrivals at 1, 2.5 requests a second"),
    (("--profile", "kind=constant,rate=1,warmup=0,rampup_duration=0", "--concurrency", "2"),
     (2,), 1.0, (), math.inf, "at most 2 in flight"),
])
def test_a_profile_is_kvlabs_levels(argv: tuple[str, ...], levels: tuple[int, ...],
                                    rate: float | None, rates: tuple[float, ...],
                                    burstiness: float, words: str) -> None:
    spec, said = spec_of(*argv)
    assert (spec.levels, spec.rate, spec.rates, spec.burstiness) == (levels, rate, rates,
                                                                     burstiness)
    assert words in said


def test_constraints_are_max_seconds_and_requests() -> None:
    spec, said = spec_of("--profile", "kind=poisson,rate=2,max_concurrency=4",
                         "--constraint", "kind=max_duration,seconds=30",
                         "--constraint", "kind=max_requests,count=100")
    assert (spec.max_s, spec.requests, spec.rate, spec.levels) == (30.0, 100, 2.0, (4,))
    assert "--constraint kind=max_duration,seconds=30: as --max-seconds 30" in said
    assert "--constraint kind=max_requests,count=100: as --requests 100" in said
    # several after one flag, as the other repeatable options; without a profile; a list of
    # one is that number; min_requests is the same count
    spec, _ = spec_of("--concurrency", "2", "--constraint", "kind=max_duration,seconds=[5]",
                      "kind=min_requests,count=7,stopping_scope=current")
    assert (spec.max_s, spec.requests, spec.levels, spec.rate) == (5.0, 7, (2,), None)


def test_guidellm_08s_synthetic_data_names_its_kind() -> None:
    spec, said = spec_of("--data", "kind=synthetic_text,prompt_tokens=24,output_tokens=3",
                         "--profile", "kind=synchronous")
    assert (spec.random_input_len, spec.max_tokens, spec.levels) == (24, 3, (1,))
    assert spec.endpoint == "completions" and "random prompts of 24 tokens" in said


@pytest.mark.parametrize(("argv", "words"), [
    (("--profile", "kind=sweep"), "--profile kind=sweep: kvlab's --find-capacity searches"),
    (("--profile", "kind=goodput"), "--find-capacity --capacity-knob concurrency --slo"),
    (("--profile", "kind=knee"), "--concurrency 1,2,5,25,50"),
    (("--profile", "kind=replay"), "--trace FILE"),
    (("--profile", "kind=burst,rate=1"), "--profile kind=burst: kvlab takes synchronous"),
    (("--profile", "synchronous"), "'synchronous' is not key=value; give kind=KIND"),
    (("--profile", "rate=2"), "give its kind, e.g. kind=constant,rate=10"),
    (("--profile", "kind=constant"), "--profile kind=constant: give its rate"),
    (("--profile", "kind=concurrent,streams=2.5"),
     "--profile kind=concurrent,streams: give whole numbers from 1"),
    (("--profile", "kind=constant,rate=0"), "--profile kind=constant,rate: give numbers above 0"),
    (("--profile", "kind=constant,rate=2,bogus=1"),
     "--profile kind=constant: bogus is not one of its keys (rate, max_concurrency)"),
    (("--profile", "kind=synchronous,rate=2"), "rate is not one of its keys (none but"),
    (("--profile", "kind=constant,rate=2,warmup=5"), "--warmup N; leave it out"),
    (("--profile", "kind=constant,rate=2,rampup_duration=5"),
     "kvlab starts each level at its full load; leave it out"),
    (("--profile", "kind=constant,rate=2,max_concurrency=2.5"),
     "max_concurrency: give a whole number"),
    (("--profile", "kind=constant,rate=2", "--rate-type", "poisson"),
     "--profile kind=constant and --rate-type poisson: give one"),
    (("--profile", "kind=constant,rate=2", "--rate", "3"), "give the rate once"),
    (("--constraint", "kind=max_errors,count=3"),
     "--constraint kind=max_errors: kvlab runs each level to its end"),
    (("--constraint", "kind=max_error_rate,rate=0.1"), "counts its failures on the row"),
    (("--constraint", "kind=over_saturation"), "--constraint kind=over_saturation: kvlab"),
    (("--constraint", "kind=max_duration,seconds=30,stopping_scope=all"),
     "stopping_scope=all: kvlab runs every level; leave it out"),
    (("--constraint", "kind=max_requests,count=1.5"),
     "--constraint kind=max_requests,count: give a whole number"),
    (("--constraint", "kind=max_requests,count=5", "--constraint", "kind=min_requests,count=6"),
     "both are kvlab's --requests; give one count"),
    (("--constraint", "kind=max_duration,seconds=5", "--max-seconds", "3"),
     "--max-seconds and --constraint kind=max_duration: give it once"),
    (("--override", "profile.rate", "1,2"),
     "--override: it changes the --profile's rate or streams"),
    (("--profile", "kind=concurrent,streams=1", "--override", "profile.rate", "1,2"),
     "--override profile.rate: --profile kind=concurrent has no rate; give --override "
     "profile.streams"),
    (("--profile", "kind=constant,rate=1", "--override", "constraints[0].seconds", "10,20"),
     "--override constraints[0].seconds: kvlab takes profile.rate and profile.streams"),
    (("--profile", "kind=constant,rate=1", "--override", "profile.rate", "1,,4"),
     "a value is missing between commas"),
    (("--profile", "kind=constant,rate=1", "--override", "profile.rate"), "give KEY VALUES"),
    (("--data", "kind=json_file,path=x.jsonl"),
     "--data kind=json_file: kvlab makes kind=synthetic_text prompts; give a file as --data"),
    # the profile makes the levels: one result file for three would be overwritten twice
    (("--profile", "kind=concurrent,streams[0]=1,streams[1]=2,streams[2]=4", "--concurrency",
      "1", "--save-result", "--result-filename", "r.json"),
     "--result-filename names one file: give one level"),
    (("--profile", "kind=constant", "--override", "profile.rate", "1,2", "--concurrency", "1",
      "--save-result", "--result-filename", "r.json"), "--result-filename names one file"),
])
def test_what_kvlab_cannot_do_is_refused_naming_what_to_give(argv: tuple[str, ...],
                                                            words: str) -> None:
    with pytest.raises(InputError) as refused:
        spec_of(*argv)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_refusal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {"KVLAB_HOME": str(tmp_path / "home"), "KVLAB_PROFILE": "none",
           "LABBOOK": str(tmp_path / "labbook.md"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-m", "kvlab", "load", "--base-url", URL, "--model",
                          "fake", "--profile", "kind=sweep,sweep_size=5", "--no-progress"],
                         capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONPATH": ":".join(sys.path)})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == ("kvlab: --profile kind=sweep: kvlab's --find-capacity "
                                  "searches for the highest load that meets a latency target "
                                  "(--slo); give that instead")
    assert not (tmp_path / "labbook.md").exists()


def test_a_guidellm_backend_is_the_base_url_and_the_model(tmp_path: Path) -> None:
    """guidellm 0.8 names the server as `--backend kind=openai_http,target=URL,model=M`
    (`schemas/backends/openai_http.py`): read as --base-url and --model, and said."""
    import asyncio

    from fakes.sse_upstream import Behaviour, SseUpstream
    from unit.loadgen.test_vllm_bench_flags import kvlab, load_env

    async def against(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
        async with SseUpstream(Behaviour(tokens=2)) as up:
            root = up.base_url.removesuffix("/v1")
            done = await asyncio.to_thread(
                kvlab, *(a.replace("ROOT", root) for a in args), env=load_env(tmp_path))
        return done, [str(b.get("model")) for b in up.counters.bodies]

    done, models = asyncio.run(against(
        "--backend", "kind=openai_http,target=ROOT,model=fake", "--profile", "kind=synchronous",
        "--max-requests", "3", "--max-tokens", "2", "--preamble-tokens", "40", "--no-progress"))
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "--backend read as --base-url http://127.0.0.1:" in said and "--model fake" in said
    assert models and set(models) == {"fake"}


@pytest.mark.parametrize(("argv", "words"), [
    (("--backend", "kind=vllm_python,target=x"),
     "--backend kind=vllm_python: kvlab takes openai_http (any OpenAI-compatible server)"),
    (("--backend", "kind=openai_http"), "--backend kind=openai_http: give its target, e.g. "),
    (("--backend", "kind=openai_http,target=http://a:1,api_key=sk-secretvalue123"),
     "--backend kind=openai_http: kvlab reads its target and model; for api_key use kvlab "
     "load's own options"),
    (("--backend", "kind=openai_http,target=http://a:1", "--base-url", "http://b:2/v1"),
     "--backend and --base-url name two servers or models (http://a:1 and http://b:2/v1)"),
    (("--backend", "kind=openai_http,target=http://a:1,model=m", "--model", "n"),
     "--backend and --model name two servers or models (m and n)"),
])
def test_a_backend_kvlab_cannot_read_is_one_line(argv: tuple[str, ...], words: str,
                                                  tmp_path: Path) -> None:
    from unit.loadgen.test_vllm_bench_flags import kvlab, load_env

    done = kvlab(*argv, env=load_env(tmp_path))
    assert done.returncode == 2 and done.stderr.startswith(f"kvlab: {words}"), done.stderr
    assert "Traceback" not in done.stderr and "secretvalue" not in done.stderr
