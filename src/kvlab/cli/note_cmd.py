"""`kvlab note`: the user's own answer to one of the labs' questions (task 6 asks for three
sentences), appended to the notebook as a `note` line; the report shows it beside the answer
kvlab drafted from the rows."""

from __future__ import annotations

import click

from kvlab.cli.common import Output, json_option, settings_from
from kvlab.records import NOTE_TOPICS


@click.command("note")
@click.argument("words", nargs=-1, required=True)
@click.option("--about", type=click.Choice(NOTE_TOPICS), required=True,
              help="Which question it answers: the host tier, the shared store, the disk "
                   "tier, the quantised cache, or which configuration you would use.")
@click.option("--labbook", help="Notebook to append to (default: LABBOOK).")
@json_option
@click.pass_context
def note_command(ctx: click.Context, words: tuple[str, ...], about: str, labbook: str | None,
                 as_json: bool) -> None:
    """Append your own answer to one of the labs' questions to the notebook."""
    from kvlab.core import InputError, secret_in_text
    from kvlab.records import LAB_OFFLOAD, LAB_PD, NoteRecord, notebook

    text = " ".join(words).strip()
    if not text or len(text) > 2000:
        raise InputError("give the note in 1 to 2,000 characters (nothing was written)")
    secret = secret_in_text(text)
    if secret is not None:  # the notebook is shared and kept: never a key in it
        raise InputError(f"the note holds {secret}; leave it out (nothing was "
                         "written)")
    settings = settings_from(ctx, labbook=labbook).values
    line = NoteRecord(label=f"note-{about}", about=about, text=text,  # type: ignore[arg-type]
                      lab=LAB_PD if about == "configuration" else LAB_OFFLOAD)
    notebook.append(settings.labbook, line)
    Output(as_json).result({"appended": line.line(), "labbook": settings.labbook},
                           lambda c: c.print(f"note on {about} appended to {settings.labbook}"))


COMMANDS = (note_command,)
