"""`report.html`: the report as one self-contained page.

The labs' decisions come first, each a headline with its figure, its chart beside it, and
links to the rows behind it; its border says which way it came out (green: it paid or is the
one to use; red: it did not pay or cost time; blue: a choice or a trade-off; grey, dashed: not
enough evidence). Then each lab's table with short cells and every row's evidence, what it
was measured on and the command that measures it one click away (a collapsed `<details>`);
then the plots, two to a row (a plot of several panels takes the row), each under the
question it answers and its answer. Plots are inline SVG and the style sheet is inline: the
page needs no network when it is opened (lab machines are often offline). Printed, every
`<details>` opens (the print style sheet, and the `beforeprint` event for browsers without
`::details-content`) and the plots take the page's width one under another. Nothing here
computes a figure: the tables, decisions and plots are the ones `report.md` shows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from html import escape

from kvlab.report.common import Line, Table, brief
from kvlab.report.decisions_common import Decision
from kvlab.report.plots_figure import Plot

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;
max-width:1240px;padding:12px 20px;color:#1d2125}
h1{font-size:21px;margin:4px 0 2px}h2{font-size:18px;margin:22px 0 6px}
h3{font-size:15px;margin:10px 0 2px}.sub{color:#5b636a;font-size:13px;margin:0 0 6px}
h2 .key{font-size:12px;font-weight:400;color:#5b636a;margin-left:14px}
.key i{display:inline-block;width:4px;height:12px;margin:0 4px 0 10px;vertical-align:-1px}
.decisions{list-style:none;padding:0;margin:0}
.decisions li{border-left:5px solid #888;background:#f5f6f7;margin:4px 0;padding:3px 10px;
display:flex;gap:14px;align-items:center;break-inside:avoid}
.yes{border-color:#2e933c!important}.no{border-color:#c0392b!important}
.choice{border-color:#1b6ca8!important}.open{border-color:#b8bcc0!important}
.decisions li.open{border-left-style:dashed}.key i.yes{background:#2e933c}
.key i.no{background:#c0392b}.key i.choice{background:#1b6ca8}.key i.open{background:#b8bcc0}
.decisions .words{flex:1;min-width:0}.decisions .chart{flex:0 0 auto;margin:0}
.chart svg{display:block;width:auto;height:auto;max-width:100%}
.decisions .q{font-weight:600}.decisions .fig{font-variant-numeric:tabular-nums}
.decisions .yours{font-style:italic}
.decisions details{font-size:13px;color:#3a4046}.decisions details p{margin:2px 0}
table{border-collapse:collapse;width:100%;font-size:13px;margin-bottom:6px}
th,td{border:1px solid #d5d9dd;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#eef1f4}td.fig{font-variant-numeric:tabular-nums}
td.absent{color:#6b737a;font-style:italic}tr.more td{border-top:none;padding:0 6px 3px}
tr.more summary{cursor:pointer;color:#1b6ca8;font-size:12px}
tr.more ul{margin:2px 0;padding-left:20px}code{font-size:12px;background:#eef1f4;
padding:0 3px}.verdict{font-weight:600}.pending{color:#8a5a00}
.plots{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:4px 28px}
.plots figure.wide{grid-column:1/-1}
figure{margin:10px 0;break-inside:avoid}figure svg{width:100%;height:auto}
figure .answer{margin:0 0 4px;color:#3a4046}
@page{margin:12mm}
@media print{body{max-width:none;padding:0}.plots{display:block}
.decisions li{display:block}.decisions .chart{margin:4px 0 2px}
table{font-size:10.5px}th,td,.words{overflow-wrap:anywhere}
details::details-content{content-visibility:visible;display:block}
summary{list-style:none}details summary::-webkit-details-marker{display:none}}
"""
# printing opens every <details> where the browser has no ::details-content, and closes
# again those it opened
PRINT = ("<script>let shut=[];addEventListener('beforeprint',()=>{shut=[...document"
         ".querySelectorAll('details:not([open])')];shut.forEach(d=>d.open=true)});"
         "addEventListener('afterprint',()=>shut.forEach(d=>d.open=false))</script>")
KEY = ('<span class="key"><i class="yes"></i>it paid, or use it<i class="no"></i>it did not '
       'pay, or cost time<i class="choice"></i>a choice or a trade-off<i class="open"></i>'
       "not enough evidence</span>")
LAB_NAMES = {"offload": "Offload lab", "pd": "P/D lab"}


def page(title: str, tables: Sequence[Table], decisions: Sequence[Decision],
         plots: Sequence[Plot], pending: str = "", starts: str = "",
         charts: Mapping[str, Plot] | None = None) -> str:
    """The whole page; `pending` says which experiments have not run (a report written while
    a run goes on, or after it was cut), `starts` how much of the latest run went to engine
    starts, `charts` each decision's chart by its question."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(title)}</title><style>{STYLE}</style>{PRINT}</head><body>",
             f"<h1>{escape(title)}</h1>"]
    if pending:
        parts.append(f'<p class="sub pending">{escape(pending)}</p>')
    if starts:
        parts.append(f'<p class="sub">{escape(starts)}</p>')
    parts += _decisions(decisions, tables, charts or {})
    for table in tables:
        parts += _table(table)
    if plots:
        parts += ["<h2>Plots</h2>", '<div class="plots">', *(_figure(p) for p in plots),
                  "</div>"]
    parts.append("</body></html>")
    return "\n".join(parts)


def tone(d: Decision) -> str:
    """Which way a decision came out, as its class on the page: yes, no, choice or open."""
    return d.outcome if d.decided else "open"


def _decisions(decisions: Sequence[Decision], tables: Sequence[Table],
               charts: Mapping[str, Plot]) -> list[str]:
    if not decisions:
        return []
    anchors = {line.anchor for t in tables for line in t.lines if line.anchor}
    out = [f"<h2>Decisions{KEY}</h2>", '<ul class="decisions">']
    for d in decisions:
        links = " ".join(f'<a href="#{escape(a)}">{escape(a)}</a>'
                         for a in dict.fromkeys(d.rows) if a in anchors)
        figure = f' · <span class="fig">{escape(d.figure)}</span>' if d.figure else ""
        chart = charts.get(d.question)
        drawn = (f'<figure class="chart" aria-label="{escape(d.question)}">{chart.svg}</figure>'
                 if chart is not None else "")
        rows = f" <small>(rows: {links})</small>" if links else ""
        out.append(f'<li class="{tone(d)}"><div class="words">'
                   f'<span class="q">{escape(LAB_NAMES.get(d.lab, d.lab))}: '
                   f'{escape(d.question)}</span> {_text(d.head)}{figure}'
                   + (f'<br><span class="yours">Your answer: {_text(d.yours)}</span>'
                      if d.yours else "")
                   + f"<details><summary>the whole answer{rows}</summary><p>{_text(d.answer)}</p>"
                   f"</details></div>{drawn}</li>")
    out.append("</ul>")
    return out


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
    cells = [f"<td>{_text(line.name)}</td>", f"<td>{escape(brief(line.how))}</td>"]
    if line.absent:
        cells.append(f'<td class="absent" colspan="{width - 3}">{_text(brief(line.cells[0]))}'
                     "</td>")
    else:
        cells += [f'<td class="fig">{_text(brief(c))}</td>' for c in line.cells]
    cells.append(f'<td class="verdict">{_text(brief(line.verdict))}</td>')
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
    wide = ' class="wide"' if plot.wide else ""
    return (f'<figure id="plot-{escape(plot.path.stem)}"{wide}><h3>{escape(plot.question)}'
            f'</h3><p class="answer">{_text(plot.answer)}</p>{plot.svg}</figure>')
