"""Click options made from an arguments model, so a command's options are declarations.

Each field of a pydantic model is one option: `--kebab-case` of its name unless its
`json_schema_extra` names the flag (`{"flag": "--ctx"}`), with other tools' names for it as
aliases (`{"aliases": "--num-prompts"}`, space-separated), its help the field's description, its
default the field's default, its choices a `Literal`'s values; a `bool` is a switch (`--x/--no-x`
when it defaults to true), a `tuple[...]` takes the option again for each value. `arguments`
adds the options to a command and hands the function the validated model instead of the
separate values: a value the model refuses is one line naming the option (exit 2), never a
traceback.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Literal, ParamSpec, TypeVar

import click
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")
R = TypeVar("R")
OptionType = click.ParamType[object, str]
_SCALARS: dict[object, OptionType] = {int: click.INT, float: click.FLOAT, str: click.STRING,
                                          Path: click.Path(path_type=Path)}


def _extra(field: FieldInfo, key: str) -> str | None:
    extra = field.json_schema_extra
    value = extra.get(key) if isinstance(extra, dict) else None
    return str(value) if value else None


def flag_of(name: str, field: FieldInfo) -> str:
    """The option a field is given as."""
    return _extra(field, "flag") or "--" + name.replace("_", "-")


def _inner(annotation: object) -> tuple[object, bool]:
    """The annotation without `| None`, and whether it repeats (`tuple[X, ...]`)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple:
        return args[0], True
    return annotation, False


def _choices(annotation: object) -> list[str] | None:
    """The words of a Literal, or of a union of Literals (None: neither)."""
    if typing.get_origin(annotation) is Literal:
        return [str(a) for a in typing.get_args(annotation)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        found = [_choices(a) for a in typing.get_args(annotation)]
        return [w for words in found for w in words or []] if all(found) else None
    return None


def _param_type(annotation: object) -> OptionType:
    if (words := _choices(annotation)) is not None:
        return click.Choice(words)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    raise TypeError(f"no option type for {annotation!r}: give the field a plain type")


def option_for(name: str, field: FieldInfo) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The click option of one field."""
    flag, help_text = flag_of(name, field), field.description or ""
    aliases = (_extra(field, "aliases") or "").split()
    inner, repeats = _inner(field.annotation)
    default = field.get_default(call_default_factory=True)
    if inner is bool:
        decls = [f"{flag}/--no-{flag[2:]}" if default is True else flag]
        return click.option(*decls, *aliases, name, is_flag=True, default=bool(default),
                            help=help_text)
    shown = default not in (None, (), "")
    listed = field.json_schema_extra.get("choices") \
        if isinstance(field.json_schema_extra, dict) else None
    kind = click.Choice([str(c) for c in listed]) if isinstance(listed, list) \
        else _param_type(inner)
    return click.option(flag, *aliases, name, type=kind, multiple=repeats,
                        default=default if default is not None else None,
                        show_default=shown, help=help_text, metavar=_extra(field, "metavar"))


def arguments(model: type[M], param: str = "args"
              ) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Add `model`'s options to a command; the function gets the model as `param`."""
    def decorate(func: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(func)
        def wrapper(*args: object, **values: object) -> R:
            given = {name: values.pop(name) for name in model.model_fields if name in values}
            values[param] = parse(model, given)
            return func(*args, **values)

        command: Callable[..., R] = wrapper
        for name, field in reversed(model.model_fields.items()):
            command = option_for(name, field)(command)
        return command
    return decorate


def parse(model: type[M], given: dict[str, object]) -> M:
    """`given` (option values by field name) validated into `model`; a refusal is a usage
    error naming the option and what to give."""
    try:
        return model.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        field = model.model_fields.get(name)
        where = flag_of(name, field) if field is not None else "an option"
        raise click.UsageError(f"{where}: {first['msg']}") from None


class SpreadCommand(click.Command):
    """A command without positional arguments whose repeatable options also take several
    values after one flag, as vllm bench's `--goodput ttft:500 tpot:50` and `--header A=1 B=2`
    do: each value up to the next option is given the flag again before click reads them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread(args, self.params))


def spread(args: list[str], params: list[click.Parameter]) -> list[str]:
    """`args` with `--flag a b` made `--flag a --flag b` for every repeatable option."""
    repeating = {o for p in params if isinstance(p, click.Option) and p.multiple for o in p.opts}
    out: list[str] = []
    flag = None
    for arg in args:
        if arg == "--":
            flag = None
        elif arg.startswith("-"):
            name = arg.split("=", 1)[0]
            flag = name if name in repeating else None
        elif flag is not None and out and out[-1] != flag:
            out.append(flag)
        out.append(arg)
    return out
