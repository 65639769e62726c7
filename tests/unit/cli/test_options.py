"""Click options generated from arguments models (`cli/options.py`): flags, defaults, switches,
choices, repeats, and a refused value as one usage line naming the option."""

from __future__ import annotations

from typing import Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field, ValidationError

from kvlab.cli.options import arguments, flag_of
from kvlab.experiments import RUN_ALL
from kvlab.experiments.all_args import AllArgs


class Example(BaseModel):
    prompt_tokens: int = Field(2000, ge=16, description="Prompt length.")
    ctx: int = Field(4096, description="Context.", json_schema_extra={"flag": "--ctx-size"})
    cache_type: Literal["f16", "q8_0"] = Field("q8_0", description="KV type.")
    keep: bool = Field(False, description="Keep it.")
    prefix: bool = Field(True, description="Prefix caching.")
    only: tuple[Literal["a", "b"], ...] = Field((), description="Repeatable.")
    label: str | None = Field(None, description="A label.", json_schema_extra={"metavar": "NAME"})


@click.command()
@arguments(Example, "args")
def show(args: Example) -> None:
    click.echo(args.model_dump_json())


def run(*argv: str) -> click.testing.Result:
    return CliRunner().invoke(show, list(argv))


def test_defaults_come_from_the_model() -> None:
    result = run()
    assert result.exit_code == 0, result.output
    assert Example.model_validate_json(result.output) == Example()


def test_each_kind_of_field_parses() -> None:
    result = run("--prompt-tokens", "64", "--ctx-size", "512", "--cache-type", "f16", "--keep",
                 "--no-prefix", "--only", "b", "--only", "a", "--label", "x")
    assert result.exit_code == 0, result.output
    got = Example.model_validate_json(result.output)
    assert got == Example(prompt_tokens=64, ctx=512, cache_type="f16", keep=True, prefix=False,
                          only=("b", "a"), label="x")


def test_a_value_the_model_refuses_names_the_option_and_exits_2() -> None:
    result = run("--prompt-tokens", "3")
    assert result.exit_code == 2
    assert "--prompt-tokens: Input should be greater than or equal to 16" in result.output
    assert "Traceback" not in result.output


def test_a_choice_outside_the_literal_is_refused_by_click() -> None:
    result = run("--cache-type", "q2_k")
    assert result.exit_code == 2 and "--cache-type" in result.output


def test_help_shows_descriptions_defaults_and_metavars() -> None:
    text = CliRunner().invoke(show, ["--help"]).output
    assert "--ctx-size INTEGER" in text and "Context." in text
    assert "--label NAME" in text and "--prefix / --no-prefix" in text
    assert "[default: 2000]" in text


def test_flag_names() -> None:
    assert flag_of("prompt_tokens", Example.model_fields["prompt_tokens"]) == "--prompt-tokens"
    assert flag_of("ctx", Example.model_fields["ctx"]) == "--ctx-size"


def test_run_all_only_offers_exactly_what_run_all_runs() -> None:
    @click.command()
    @arguments(AllArgs, "args")
    def cmd(args: BaseModel) -> None:
        del args

    only = next(p for p in cmd.params if p.name == "only")
    assert isinstance(only.type, click.Choice) and tuple(only.type.choices) == RUN_ALL
    refused = CliRunner().invoke(cmd, ["--only", "offload-sizes"])
    assert refused.exit_code == 2 and "offload-sizes" in refused.output
    with pytest.raises(ValidationError, match="no experiment of `kvlab run all`"):
        AllArgs(only=("offload-sizes",))


@pytest.mark.parametrize("model", [Example, AllArgs])
def test_every_field_becomes_an_option(model: type[BaseModel]) -> None:
    @click.command()
    @arguments(model, "args")
    def cmd(args: BaseModel) -> None:
        del args

    declared = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    assert {flag_of(n, f) for n, f in model.model_fields.items()} <= declared


def test_several_values_after_one_repeatable_flag_are_each_given_it() -> None:
    """#49: vllm bench takes `--goodput ttft:500 tpot:50` and `--header A=1 B=2`."""
    import click

    from kvlab.cli.options import spread

    params: list[click.Parameter] = [
        click.Option(["--goodput"], multiple=True), click.Option(["--header"], multiple=True),
        click.Option(["--concurrency"])]
    assert spread(["--goodput", "ttft:500", "tpot:50", "--concurrency", "4", "--header=A=1",
                   "B=2"], params) == [
        "--goodput", "ttft:500", "--goodput", "tpot:50", "--concurrency", "4", "--header=A=1",
        "--header", "B=2"]
    assert spread(["--concurrency", "1", "2"], params) == ["--concurrency", "1", "2"]
    assert spread(["--header", "A=1", "--", "x"], params) == ["--header", "A=1", "--", "x"]
