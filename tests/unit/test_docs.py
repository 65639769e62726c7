"""The Markdown kvlab ships renders as written: README.md and every page under docs/ are parsed
with markdown-it-py (CommonMark plus GFM tables, as GitHub renders them) and checked for

- a table that is broken: a line that looks like a table row (it starts with `|` after
  optional spaces, outside code) that is not part of a rendered table, because a non-table line
  cut the table short or the rows have no header and separator; a line with no `|` that the
  table swallowed as a row of its own; a row with more cells than its header (GitHub drops
  the extra cells without a word);
- a relative link or image that points to no file (http(s), mailto and other schemes, and
  #anchors are not followed);
- a README over 250 lines: it is the first screen and the way in, the reference lives in docs/.

docs/examples/ and docs/validation/ hold generated reports and recorded runs; they are checked
too, as they are, so that a page linking to them never shows a broken one.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 250

_PIPE_ROW = re.compile(r"^[ \t]*\|")
# a scheme (http:, https:, mailto:, ...) or a protocol-relative //host: not a file here
_EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|//)")


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark").enable("table")


def _cells(line: str) -> int:
    """How many cells a table line has, split as markdown-it splits it (on `|` not escaped by a
    backslash; a code span does not protect a `|`), one leading and one trailing `|` dropped."""
    text = line.strip()
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|") and not text.endswith("\\|"):
        text = text[:-1]
    return len(re.split(r"(?<!\\)\|", text))


def _walk(tokens: list[Token]) -> list[Token]:
    """Every token, with the children of inline tokens after their parent."""
    out: list[Token] = []
    for token in tokens:
        out.append(token)
        if token.children:
            out.extend(_walk(token.children))
    return out


def table_problems(text: str) -> list[tuple[int, str]]:
    """(1-based line, what is wrong) for every broken table in `text`."""
    tokens = _parser().parse(text)
    lines = text.splitlines()
    in_table: set[int] = set()
    in_code: set[int] = set()
    problems: list[tuple[int, str]] = []
    for token in tokens:
        if token.map is None:
            continue
        start, end = token.map
        if token.type in ("fence", "code_block", "html_block"):
            in_code.update(range(start, end))
        elif token.type == "table_open":
            in_table.update(range(start, end))
            header = _cells(lines[start])
            for i in range(start + 2, min(end, len(lines))):
                if "|" not in lines[i]:
                    problems.append((i + 1, "a line with no `|` was taken into the table above "
                                            "as a row: put a blank line between them"))
                elif (cells := _cells(lines[i])) > header:
                    problems.append((i + 1, f"a row of {cells} cells under a header of "
                                            f"{header}: the extra cells are not shown (escape "
                                            "a `|` inside a cell as `\\|`)"))
    for i, line in enumerate(lines):
        if _PIPE_ROW.match(line) and i not in in_table and i not in in_code:
            problems.append((i + 1, "looks like a table row but is not in a rendered table: a "
                                    "non-table line cut the table short, or the rows have no "
                                    "header and `|---|` separator"))
    return sorted(problems)


def link_problems(text: str, base: Path, root: Path) -> list[tuple[int, str]]:
    """(1-based line, what is wrong) for every relative link or image in `text` that names no
    file; `base` is the directory the text lives in, `root` the repository (for `/path`)."""
    lines = text.splitlines()
    problems: list[tuple[int, str]] = []
    for block in _parser().parse(text):
        if block.type != "inline" or block.map is None:
            continue
        for token in _walk(block.children or []):
            if token.type == "link_open":
                target = token.attrGet("href")
            elif token.type == "image":
                target = token.attrGet("src")
            else:
                continue
            if not isinstance(target, str) or not target or _EXTERNAL.match(target):
                continue
            path = unquote(urlsplit(target).path)
            if not path:  # a #anchor in the same page
                continue
            resolved = root / path.lstrip("/") if path.startswith("/") else base / path
            if resolved.exists():
                continue
            start, end = block.map
            line = next((i for i in range(start, end) if path in unquote(lines[i])), start)
            problems.append((line + 1, f"{target!r} points to no file ({resolved})"))
    return problems


def check(path: Path, root: Path = ROOT) -> list[str]:
    """Every problem in one Markdown file, as `FILE:LINE: what`."""
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(root) if path.is_relative_to(root) else path
    found = table_problems(text) + link_problems(text, path.parent, root)
    return [f"{name}:{line}: {what}" for line, what in sorted(found)]


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_renders(path: Path) -> None:
    problems = check(path)
    assert not problems, "\n".join(problems)


def test_readme_is_short() -> None:
    count = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, (
        f"README.md is {count} lines, over {README_MAX_LINES}: move reference to docs/")


TABLE = "| command | what it does |\n|---|---|\n| `kvlab a` | one |\n"


def test_a_whole_table_passes() -> None:
    assert table_problems(TABLE) == []
    assert table_problems("```\n| not | a table |\n```\n") == []
    assert table_problems("    | indented | code |\n") == []


def test_a_table_cut_by_a_paragraph_is_caught() -> None:
    text = TABLE + "\nA paragraph between the rows.\n| `kvlab b` | two |\n| `kvlab c` | three |\n"
    assert [line for line, _ in table_problems(text)] == [6, 7]


def test_a_table_cut_by_a_section_is_caught() -> None:
    # what the README did: a heading and a list inside the table, its rows after them as text
    text = TABLE + "### A section\n\n- an item\n  continued\n| `kvlab b` | two |\n"
    assert [line for line, _ in table_problems(text)] == [8]


def test_a_line_swallowed_as_a_row_is_caught() -> None:
    text = TABLE + "A paragraph right under the table.\n"
    assert [line for line, _ in table_problems(text)] == [4]


def test_rows_without_header_are_caught() -> None:
    assert [line for line, _ in table_problems("| a | b |\n| c | d |\n")] == [1, 2]


def test_an_unescaped_pipe_in_a_cell_is_caught() -> None:
    assert [line for line, _ in table_problems(TABLE + "| `a|b` | c |\n")] == [4]
    assert table_problems(TABLE + "| `a\\|b` | c |\n") == []


def test_a_missing_link_target_is_caught(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# there\n", encoding="utf-8")
    (tmp_path / "img.png").write_bytes(b"")
    text = ("[ok](there.md#a) [ok](https://example.com/x.md) [ok](#anchor) ![ok](img.png)\n"
            "\n"
            "see [gone](missing.md) and ![gone](pics/none.png)\n")
    found = link_problems(text, tmp_path, tmp_path)
    assert [line for line, _ in found] == [3, 3]
    assert "missing.md" in found[0][1] and "pics/none.png" in found[1][1]
