"""`report.html`: the report as one self-contained page.

The labs' decisions come first, one line each with its figure and links to the rows behind
it; then each lab's table with short cells and every row's evidence, what it was measured on
and the command that measures it one click away (a collapsed `<details>`); then the plots,
each under the question it answers and its answer. Plots are inline SVG and the style sheet
is inline: the page needs no network when it is opened (lab machines are often offline) and
prints as it shows. Nothing here computes a figure: the tables, decisions and plots are the
ones `report.md` shows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from kvlab.report.common import Line, Table, brief
from kvlab.report.decisions_common import Decision
from kvlab.report.plots_figure import Plot

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;
max-width:1240px;padding:12px 20px;color:#1d2125}
h1{font-size:21px;margin:4px 0 2px}h2{font-size:18px;margin:26px 0 8px}
h3{font-size:15px;margin:14px 0 2px}.sub{color:#5b636a;font-size:13px;margin:0 0 10px}
.decisions{list-style:none;padding:0;margin:0}
.decisions li{border-left:5px solid #888;background:#f5f6f7;margin:5px 0;padding:5px 10px}
.decisions li.yes{border-color:#2e933c}.decisions li.no{border-color:#c9a227}
.decisions .q{font-weight:600}.decisions .fig{font-variant-numeric:tabular-nums}
.decisions .yours{font-style:italic}
.decisions details{font-size:13px;color:#3a4046}
table{border-collapse:collapse;width:100%;font-size:13px;margin-bottom:6px}
th,td{border:1px solid #d5d9dd;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#eef1f4}td.fig{font-variant-numeric:tabular-nums}
td.absent{color:#6b737a;font-style:italic}tr.more td{border-top:none;padding:0 6px 3px}
tr.more summary{cursor:pointer;color:#1b6ca8;font-size:12px}
tr.more ul{margin:2px 0;padding-left:20px}code{font-size:12px;background:#eef1f4;
padding:0 3px}.verdict{font-weight:600}.pending{color:#8a5a00}
figure{margin:14px 0;break-inside:avoid}figure svg{max-width:100%;height:auto}
figure .answer{margin:0 0 4px;color:#3a4046}
@media print{tr.more details{display:block}body{max-width:none}}
"""
LAB_NAMES = {"offload": "Offload lab", "pd": "P/D lab"}


def page(title: str, tables: Sequence[Table], decisions: Sequence[Decision],
         plots: Sequence[Plot], pending: str = "", starts: str = "") -> str:
    """The whole page; `pending` says which experiments have not run (a report written while
    a run goes on, or after it was cut), `starts` how much of the latest run went to engine
    starts."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{escape(title)}</h1>"]
    if pending:
        parts.append(f'<p class="sub pending">{escape(pending)}</p>')
    if starts:
        parts.append(f'<p class="sub">{escape(starts)}</p>')
    parts += _decisions(decisions, tables)
    for table in tables:
        parts += _table(table)
    if plots:
        parts.append("<h2>Plots</h2>")
        parts += [_figure(p) for p in plots]
    parts.append("</body></html>")
    return "\n".join(parts)


def _decisions(decisions: Sequence[Decision], tables: Sequence[Table]) -> list[str]:
    if not decisions:
        return []
    anchors = {line.anchor for t in tables for line in t.lines if line.anchor}
    out = ["<h2>Decisions</h2>", '<ul class="decisions">']
    for d in decisions:
        links = " ".join(f'<a href="#{escape(a)}">{escape(a)}</a>'
                         for a in dict.fromkeys(d.rows) if a in anchors)
        figure = f' · <span class="fig">{escape(d.figure)}</span>' if d.figure else ""
        out.append(f'<li class="{"yes" if d.decided else "no"}">'
                   f'<span class="q">{escape(LAB_NAMES.get(d.lab, d.lab))}: '
                   f'{escape(d.question)}</span> {_text(headline(d))}{figure}'
                   + (f" <small>(rows: {links})</small>" if links else "")
                   + (f'<br><span class="yours">Your answer: {_text(d.yours)}</span>'
                      if d.yours else "")
                   + f"<details><summary>the whole answer</summary>{_text(d.answer)}"
                   "</details></li>")
    out.append("</ul>")
    return out


def headline(d: Decision) -> str:
    """The answer's first clause (an undecided one with its reason), short enough for one
    line."""
    if not d.decided:
        return brief(d.answer.split("; ")[0].rstrip("."), 110)
    first = re.split(r": |; | \(", d.answer, maxsplit=1)[0].rstrip(".")
    return brief(first, 90)


def _table(table: Table) -> list[str]:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.header)
    out = [f"<h2>{escape(table.title)}</h2>", f"<table><thead><tr>{head}</tr></thead><tbody>"]
    width = len(table.header)
    for line in table.lines:
        out += [_row(line, width), _more(line, width)]
    out.append("</tbody></table>")
    return out


def _row(line: Line, width: int) -> str:
    ident = f' id="{escape(line.anchor)}"' if line.anchor else ""
    cells = [f"<td>{escape(line.name)}</td>", f"<td>{escape(brief(line.how))}</td>"]
    if line.absent:
        cells.append(f'<td class="absent" colspan="{width - 3}">{_text(brief(line.cells[0]))}'
                     "</td>")
    else:
        cells += [f'<td class="fig">{_text(brief(c))}</td>' for c in line.cells]
    cells.append(f'<td class="verdict">{escape(line.verdict)}</td>')
    return f"<tr{ident}>{''.join(cells)}</tr>"


def _more(line: Line, width: int) -> str:
    items = "".join(f"<li>{_text(e)}</li>" for e in line.evidence)
    on = f"<p>Measured on {escape(line.measured_on)}.</p>" if line.measured_on else ""
    cmd = (f"<p>To measure it: <code>{escape(line.command)}</code></p>" if line.command
           else "")
    body = f"<ul>{items}</ul>" if items else ""
    summary = "evidence and command" if items else "command"
    if not (items or on or cmd):
        return ""
    return (f'<tr class="more"><td colspan="{width}"><details><summary>{summary}</summary>'
            f"{body}{on}{cmd}</details></td></tr>")


def _text(text: str) -> str:
    """Escaped text with the markdown `code` spans the rows use made `<code>`."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text))


def _figure(plot: Plot) -> str:
    svg = plot.svg
    return (f'<figure id="plot-{escape(plot.path.stem)}"><h3>{escape(plot.question)}</h3>'
            f'<p class="answer">{_text(plot.answer)}</p>{svg}</figure>')
