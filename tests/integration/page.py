"""The report page in a real browser: Debian's Chromium (installed by `.ci/run`), driven by
Playwright with no browser download.

`check(page_path, screenshot)` opens the page at 1280x800 and returns what a reader meets:
console errors, broken images, plots without data, whether the decisions fit the first screen,
the longest visible table cell of the main tables, every SVG word drawn outside its figure or
over another word of it, and each decision's way (its class) and its chart's marks.

`printed(page_path)` lays the page out as it prints on A4 (the print style sheet, 186 mm wide
between 12 mm margins) and returns what stayed hidden (a `<details>` whose content does not
show, an evidence item that does not) and the smallest SVG word in points; then prints it to
PDF (Chrome's printToPDF), which fires `beforeprint`, and says how many `<details>` were still
closed once the page's own handler had run.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREEN = {"width": 1280, "height": 800}

# the plot's own marks, as matplotlib names them in its SVG (axes and text are not data)
DATA_MARKS = ('g[id^="line2d_"] path, g[id^="PathCollection_"] use, '
              'g[id^="LineCollection_"] path, g[id^="PolyCollection_"] path, '
              'g[id^="patch_"] path')

# every SVG <text> of a figure as its words and box, per figure (shared by both layouts)
TEXTS = """const texts = f => [...f.querySelectorAll('svg text')]
  .map(t => ({t, words: t.textContent.trim(), r: t.getBoundingClientRect()}))
  .filter(x => x.words && x.r.width > 0);"""

MEASURE = """() => {
  TEXTS
  const outside = [], overlaps = [];
  for (const f of document.querySelectorAll('figure')) {
    const svg = f.querySelector('svg');
    if (!svg) continue;
    const box = svg.getBoundingClientRect(), seen = texts(f);
    for (const {words, r} of seen)
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1
          || r.bottom > box.bottom + 1) outside.push(`${f.id || f.className}: ${words}`);
    seen.forEach((a, i) => seen.slice(i + 1).forEach(b => {
      const x = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
      const y = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
      if (x > 1 && y > 2) overlaps.push(`${f.id || f.className}: ${a.words} / ${b.words}`);
    }));
  }
  const ways = [...document.querySelectorAll('.decisions li')].map(li => ({
    way: li.className, chart: li.querySelectorAll('figure.chart svg').length,
    marks: li.querySelectorAll('figure.chart MARKS').length}));
  const plots = [...document.querySelectorAll('figure:not(.chart)')].map(f => ({
    id: f.id, svg: !!f.querySelector('svg'),
    marks: f.querySelectorAll('MARKS').length}));
  const cells = [...document.querySelectorAll('table td')].map(td => td.innerText.trim());
  const longest = cells.reduce((a, b) => b.length > a.length ? b : a, '');
  const d = document.querySelector('.decisions');
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length;
  return {plots, longest, cells: cells.length, broken, outside, overlaps, ways,
          decisionsBottom: d ? d.getBoundingClientRect().bottom : null,
          decisions: d ? d.querySelectorAll('li').length : 0,
          external: [...document.querySelectorAll('[src],[href]')]
            .map(e => e.getAttribute('src') || e.getAttribute('href'))
            .filter(u => /^(https?:)?\\/\\//.test(u))};
}""".replace("MARKS", DATA_MARKS).replace("TEXTS", TEXTS)

PRINT_WIDTH = 703  # CSS pixels between A4's 12 mm margins (the print style sheet's @page)
HIDDEN = """() => {
  TEXTS
  const hidden = [...document.querySelectorAll('details')].filter(d =>
    ![...d.children].filter(c => c.tagName !== 'SUMMARY').every(c => c.checkVisibility()));
  const items = [...document.querySelectorAll('tr.more li, .decisions details p')];
  let smallest = [1e9, ''];
  for (const f of document.querySelectorAll('figure')) {
    const svg = f.querySelector('svg');
    if (!svg || !svg.viewBox.baseVal.width) continue;
    // a user unit is a point at the figure's own size; px to pt is 0.75
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width * 0.75;
    for (const {t, words} of texts(f)) {
      const pt = parseFloat(getComputedStyle(t).fontSize) * scale;
      if (pt < smallest[0]) smallest = [pt, `${f.id || f.className}: ${words}`];
    }
  }
  return {hidden: hidden.length, details: document.querySelectorAll('details').length,
          items: items.length, shown: items.filter(e => e.checkVisibility()).length,
          smallest};
}""".replace("TEXTS", TEXTS)


@dataclass(frozen=True)
class Seen:
    errors: list[str]
    broken_images: int
    plots: list[dict[str, object]]
    longest_cell: str
    cells: int
    decisions: int
    decisions_bottom: float | None
    external: list[str]
    outside: list[str]  # "figure: words" drawn past its figure's edge
    overlaps: list[str]  # "figure: words / words" drawn over each other
    ways: list[dict[str, object]]  # each decision: its class, its charts and their marks


@dataclass(frozen=True)
class Printed:
    hidden: int  # <details> whose content does not show in print
    details: int
    items: int  # evidence items and decisions' whole answers
    shown: int
    smallest_pt: float  # the smallest SVG word as printed
    smallest: str  # which
    closed_at_print: int  # <details> still closed when printing to PDF


def chromium() -> str:
    if not Path(CHROMIUM).is_file() and shutil.which("chromium") is None:
        pytest.fail(f"no Chromium at {CHROMIUM}: .ci/run installs Debian's chromium package "
                    "(apt-get install chromium)")
    return CHROMIUM if Path(CHROMIUM).is_file() else str(shutil.which("chromium"))


def check(page_path: Path, screenshot: Path | None = None) -> Seen:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            page = browser.new_page(viewport=SCREEN)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            seen = page.evaluate(MEASURE)
            if screenshot is not None:
                page.screenshot(path=str(screenshot))
        finally:
            browser.close()
    return Seen(errors, seen["broken"], seen["plots"], seen["longest"], seen["cells"],
                seen["decisions"], seen["decisionsBottom"], seen["external"], seen["outside"],
                seen["overlaps"], seen["ways"])


def printed(page_path: Path) -> Printed:
    from playwright.sync_api import sync_playwright

    said: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": PRINT_WIDTH, "height": 1000})
            page.on("console", lambda m: said.append(m.text))
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            page.emulate_media(media="print")
            seen = page.evaluate(HIDDEN)
            page.emulate_media(media="screen")
            # after the page's own handlers: what printing leaves closed
            page.evaluate("addEventListener('beforeprint', () => console.log('closed at print '"
                          " + document.querySelectorAll('details:not([open])').length))")
            page.pdf(format="A4")
        finally:
            browser.close()
    closed = [int(m.rsplit(" ", 1)[1]) for m in said if m.startswith("closed at print ")]
    assert closed, f"printing to PDF fired no beforeprint: {said}"
    return Printed(seen["hidden"], seen["details"], seen["items"], seen["shown"],
                   seen["smallest"][0], seen["smallest"][1], closed[0])
