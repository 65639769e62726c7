"""The words `report.html` shows a reader, from the committed notebooks (the CPU demo, the H200
runs): no verdict word only kvlab knows ("crossed", a crossing's `pays-nowhere`), no raw
backtick (a row name, a cell cut inside a `code` span), every decision's headline a whole
phrase (short, not ending on a separator, its brackets and code spans closed), and a border
that says which way the answer came out: a negative answer is never drawn as a positive one.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from kvlab.report import build
from kvlab.report.decisions_common import HEADLINE_LIMIT, Decision
from kvlab.report.html import tone

DOCS = Path(__file__).resolve().parents[3] / "docs"
NOTEBOOKS = {"cpu-demo": DOCS / "examples" / "cpu-demo" / "notebook.jsonl",
             "h200-quick": DOCS / "validation" / "h200-run-all" / "quick-2026-12-07"
             / "notebook.jsonl",
             "h200-redo": DOCS / "validation" / "h200-redo" / "notebook.jsonl",
             "h200-x2-ray": DOCS / "validation" / "h200-x2-ray" / "notebook.jsonl",
             "h200-oracle": DOCS / "validation" / "h200-oracle" / "notebook.jsonl",
             "h200-tier-sizes": DOCS / "validation" / "h200-tier-sizes" / "notebook.jsonl"}
KVLAB_WORDS = re.compile(r"\bcrossed\b|\bpays-(above|below|everywhere|nowhere)\b|"
                         r"not-enough-evidence")
SEPARATORS = ("·", ":", ";", ",", "(", "-", "—", "/")


def _visible(page: str) -> str:
    """The page's text as a reader sees it (no style sheet, no script, no tags)."""
    page = re.sub(r"<style>.*?</style>|<script>.*?</script>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_the_committed_reports_speak_a_readers_words(name: str) -> None:
    report = build(NOTEBOOKS[name])
    said = [line.verdict for t in report.tables for line in t.lines]
    said += [line.name for t in report.tables for line in t.lines]
    said += [w for d in report.decisions for w in (d.head, d.figure)]
    said += [p.title for d in report.decisions for p in d.chart]
    found = [w for w in said if KVLAB_WORDS.search(w)]
    assert found == [], found
    assert "`" not in _visible(report.html())  # every code span is <code>, none cut open


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_every_headline_is_a_whole_short_phrase(name: str) -> None:
    for d in build(NOTEBOOKS[name]).decisions:
        head = d.head
        assert head and len(head) <= HEADLINE_LIMIT, head
        assert not head.rstrip().endswith(SEPARATORS), head
        assert head.count("(") == head.count(")") and head.count("`") % 2 == 0, head


def test_the_demos_headlines_say_the_answer() -> None:
    """The committed CPU demo's and H200 quick pass's headlines (the first of them was
    "On llama.cpp the RAM prompt cache ·", a fragment)."""
    demo = {d.question: d.head for d in build(NOTEBOOKS["cpu-demo"]).decisions}
    assert list(demo.values()) == [
        "On llama.cpp the RAM prompt cache paid against none",
        "The store did not pay",
        "On llama.cpp, a restore from disk started 116x faster than a cold prefill",
        "q8_0 held 1.88x the tokens of f16 and was slower to first token",
        "On llama.cpp, 13 MiB of RAM cache was enough (90% of the best gain)",
        "Not enough evidence: a sweep of opening lengths is not in the notebook",
        "Use one machine, no split",
        "Not enough evidence: the replicas lab is not in the notebook"]
    quick = {d.question: d for d in build(NOTEBOOKS["h200-quick"]).decisions}
    router = quick["Which router would you put in front of your replicas?"]
    assert router.decided and router.head == ("With 3 replicas, route by least-outstanding "
                                              "(kvlab proxy)")


def test_a_negative_answer_is_not_drawn_as_a_positive_one() -> None:
    """The page's border: green only where the answer is yes (it paid, use it); a decided
    "cost time" or "use one machine" is red; a choice blue; an undecided one grey."""
    found = {d.question: d for d in build(NOTEBOOKS["h200-quick"]).decisions}
    assert tone(found["Did the host tier pay?"]) == "no"  # it cost time
    assert tone(found["Which configuration would you actually use?"]) == "no"  # no split
    assert tone(found["What did the disk tier cost, and what would it save?"]) == "open"
    redo = {d.question: d for d in build(NOTEBOOKS["h200-redo"]).decisions}
    assert tone(redo["Did the host tier pay?"]) == "yes"  # 0.59x [0.52, 0.66]
    page = build(NOTEBOOKS["h200-quick"]).html()
    assert '<li class="no"><div class="words"><span class="q">Offload lab: Did the host tier ' \
        "pay?</span> The host tier cost time" in page


def test_a_cut_cell_closes_no_code_span_it_opened() -> None:
    from kvlab.report.common import brief

    cut = brief("kvlab would install only its CPU build: `kvlab engines install --only mlx` "
                "builds it " + "x" * 120, 60)  # the cut falls inside the code span
    assert cut == "kvlab would install only its CPU build: …", cut


def test_an_undecided_headline_is_cut_at_a_clause_not_a_word() -> None:
    from kvlab.report.decisions_common import _undecided

    d: Decision = _undecided("pd", "Q?", "the topology of the split `disagg` (across two "
                             "machines, nixl connector) was not recorded, so which configuration "
                             "it measured is unknown; more")
    assert d.head == "Not enough evidence: the topology of the split `disagg` was not recorded"
