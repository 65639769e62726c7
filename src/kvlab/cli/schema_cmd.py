"""`kvlab schema`: the JSON Schema of every notebook record kind, from the record models."""

from __future__ import annotations

import json

import click

from kvlab.cli.common import Output, json_option


@click.command("schema")
@click.argument("kind", required=False)
@json_option
def schema_command(kind: str | None, as_json: bool) -> None:
    """Print the JSON Schema of each notebook record kind (or of KIND)."""
    from kvlab.core import InputError
    from kvlab.records import BY_KIND, json_schemas

    schemas = json_schemas()
    if kind is not None:
        if kind not in schemas:
            raise InputError(f"no record kind {kind!r}; kinds: {', '.join(BY_KIND)}")
        schemas = {kind: schemas[kind]}
    Output(True).result(schemas, lambda c: c.print(json.dumps(schemas, indent=2)))


COMMANDS = (schema_command,)
