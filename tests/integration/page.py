"""The report page in a real browser: Debian's Chromium (installed by `.ci/run`), driven by
Playwright with no browser download.

`check(page_path, screenshot)` opens the page at 1280x800 and returns what a reader meets:
console errors, broken images, plots without data, whether the decisions fit the first screen
and the longest visible table cell of the main tables.
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

MEASURE = """() => {
  const plots = [...document.querySelectorAll('figure')].map(f => ({
    id: f.id, svg: !!f.querySelector('svg'),
    marks: f.querySelectorAll('MARKS').length}));
  const cells = [...document.querySelectorAll('table td')].map(td => td.innerText.trim());
  const longest = cells.reduce((a, b) => b.length > a.length ? b : a, '');
  const d = document.querySelector('.decisions');
  const broken = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length;
  return {plots, longest, cells: cells.length, broken,
          decisionsBottom: d ? d.getBoundingClientRect().bottom : null,
          decisions: d ? d.querySelectorAll('li').length : 0,
          external: [...document.querySelectorAll('[src],[href]')]
            .map(e => e.getAttribute('src') || e.getAttribute('href'))
            .filter(u => /^(https?:)?\\/\\//.test(u))};
}""".replace("MARKS", DATA_MARKS)


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
                seen["decisions"], seen["decisionsBottom"], seen["external"])
