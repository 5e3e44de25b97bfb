"""Every relative link of README.md and docs/*.md reaches something: the file or folder it names exists, and an
anchor (`#...`, alone or after a Markdown file) is one of that file's headings as GitHub names them. A heading's
anchor, as GitHub writes it: the heading's text (inline code, emphasis and links read as their text) lowercased,
every character other than a letter, a mark, a digit, `_`, `-` or a space dropped, each space made a `-`; a
repeated anchor in one file gets `-1`, `-2`, ... in order."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"(?<!\\)!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def prose(text: str) -> str:
    """The text a reader sees as Markdown: no fenced blocks (a link in a code sample is not followed)."""
    return FENCE.sub("", text)


def heading_text(markdown: str) -> str:
    """A heading's words: links as their text, code, emphasis and HTML tags as the characters they show."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", markdown)
    return re.sub(r"<[^>]+>", "", text)


def github_anchor(heading: str) -> str:
    kept = (ch for ch in heading_text(heading).lower()
            if ch in "-_ " or unicodedata.category(ch)[0] in "LM" or unicodedata.category(ch) in ("Nd", "Nl", "Pc"))
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = prose(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    names = set()
    for heading in HEADING.findall(text):
        base = github_anchor(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        names.add(base if count == 0 else f"{base}-{count}")
    return names | set(HTML_ANCHOR.findall(text))


def links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", prose(path.read_text(encoding="utf-8")))
    return LINK.findall(text) + REFERENCE.findall(text)


def broken(path: Path, root: Path = REPO) -> list[str]:
    """The relative links of a page that reach nothing, each with why (paths relative to `root`)."""
    problems = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        where, _, fragment = target.partition("#")
        file = (path.parent / unquote(where)).resolve() if where else path
        if not file.exists():
            problems.append(f"{target}: no {file.relative_to(root) if file.is_relative_to(root) else file}")
        elif fragment and file.suffix == ".md" and unquote(fragment) not in anchors(file):
            problems.append(f"{target}: {file.relative_to(root)} has no heading #{fragment}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == []


def test_anchors_are_named_as_github_names_them():
    """Three headings this repository has and a made-up one, named by GitHub's rule (it drops what its
    `[^\\p{Word}\\- ]` class matches): dashes kept, each space a dash, backticks, colons, dots, parentheses,
    slashes, commas and multiplication signs dropped, a link read as its text."""
    assert github_anchor("An existing folder: `--resume`, `--overwrite`") == "an-existing-folder---resume---overwrite"
    assert github_anchor("Memory per step (benchmarks/bench_memory_steps.py)") == \
        "memory-per-step-benchmarksbench_memory_stepspy"
    assert github_anchor("Data and weights; one air-gapped path end to end") == \
        "data-and-weights-one-air-gapped-path-end-to-end"
    assert github_anchor("`spec.fabric` on 2 × 8 [GPUs](x.md)") == "specfabric-on-2--8-gpus"


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    """The checker itself, on a page of its own: a missing file, a missing heading, a repeated heading's second
    anchor, a link inside a code block (ignored) and an external one (not followed)."""
    (tmp_path / "other.md").write_text("# Other\n## Same\n## Same\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n[a](other.md#same-1) [b](other.md#same-2) [c](missing.md) [d](#page) [e](#nowhere)\n"
                    "`[f](missing-in-code.md)` [g](https://example.com/x.md)\n```\n[h](missing-in-fence.md)\n```\n",
                    encoding="utf-8")
    assert broken(page, tmp_path) == ["other.md#same-2: other.md has no heading #same-2", "missing.md: no missing.md",
                                      "#nowhere: page.md has no heading #nowhere"]
