"""Every link in the docs goes somewhere: each relative link in README.md, docs/*.md, alerts/*.md, the runbooks (and
the chart's README, if it has one) names a file or directory of the repository, and each anchor a heading of the
page it points into, as GitHub makes anchors of headings. External links are not fetched (no network): they must be
well-formed http(s) or mailto URLs. Links inside code (fenced blocks, `spans`) are text, not links."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title"): text may hold one level of brackets, the target one level of parentheses
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
                    r"\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def pages() -> list[Path]:
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "alerts").glob("*.md")),
             *sorted((REPO / "alerts" / "runbooks").glob("*.md")),
             *sorted((REPO / "helm" / "outrider").glob("README*"))]
    return [p for p in found if p.is_file()]


def prose(text: str) -> Iterator[str]:
    """The lines of a page outside fenced code blocks, with code spans blanked out."""
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and (fence is None or m.group(1) == fence):
            fence = m.group(1) if fence is None else None
            continue
        if fence is None:
            yield CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)


def links(text: str) -> Iterator[str]:
    for line in prose(text):
        yield from (m.group(1) for m in INLINE.finditer(line))
        yield from (m.group(1) for m in AUTOLINK.finditer(line))
        yield from (m.group(1) for m in HREF.finditer(line))
        m = REFERENCE.match(line)
        if m:
            yield m.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (no markup) lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"(\*\*|\*)(\S(?:.*?\S)?)\1", r"\2", text)  # emphasis markers, not the words
    text = re.sub(r"(?<![^\W_])(__|_)(\S(?:.*?\S)?)\1(?![^\W_])", r"\2", text)  # not inside a word: snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor of a Markdown page: its headings' (repeated ones get -1, -2, ...) and explicit <a id=...>."""
    seen: dict[str, int] = {}
    found = set()
    fence = None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if m and (fence is None or m.group(1) == fence):
            fence = m.group(1) if fence is None else None
            continue
        if fence is not None:
            continue
        found |= set(HTML_ANCHOR.findall(line))
        h = HEADING.match(line)
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def broken(page: Path, target: str) -> str | None:
    """Why a link of `page` leads nowhere, or None when it resolves (or is a well-formed external URL)."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme:
        if parts.scheme in ("http", "https"):
            host = parts.hostname or ""
            ok = bool(re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+", host))
            return None if ok and " " not in target else "not a well-formed URL"
        if parts.scheme == "mailto":
            return None if re.fullmatch(r"[^@\s]+@[^@\s]+\.\w+", parts.path) else "not a well-formed address"
        return f"an unexpected scheme {parts.scheme!r}"
    if target.startswith("//") or parts.netloc:
        return "a protocol-relative URL"
    if target.startswith("/"):
        return "an absolute path (it breaks on a mirror): link relative to the page"
    path = urllib.parse.unquote(parts.path)
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
        return f"no file {path}"
    try:
        dest.relative_to(REPO)
    except ValueError:
        return f"{path} is outside the repository"
    if parts.fragment:
        if dest.is_dir() or dest.suffix != ".md":
            return None if re.fullmatch(r"L\d+(-L\d+)?", parts.fragment) else f"an anchor into {path}, not a page"
        if urllib.parse.unquote(parts.fragment).lower() not in anchors(dest):
            return f"no heading #{parts.fragment} in {dest.relative_to(REPO)}"
    return None


def test_every_link_and_anchor_in_the_docs_resolves() -> None:
    bad = [(str(page.relative_to(REPO)), target, why) for page in pages()
           for target in links(page.read_text(encoding="utf-8")) if (why := broken(page, target))]
    assert bad == []


def test_the_pages_checked_include_readme_docs_and_runbooks() -> None:
    names = {str(p.relative_to(REPO)) for p in pages()}
    assert {"README.md", "docs/architecture.md", "alerts/README.md", "alerts/runbooks/meta.md"} <= names


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Why is it slow?", "why-is-it-slow"),
    ("A run's summary, report and comparison", "a-runs-summary-report-and-comparison"),
    ("With no agent on the spool: `outrider standalone`", "with-no-agent-on-the-spool-outrider-standalone"),
    ("The hook's cost", "the-hooks-cost"),
    ("Outrider's series through the application's pipeline", "outriders-series-through-the-applications-pipeline"),
    ("Collector `host`", "collector-host"),
    ("metrics/exposition", "metricsexposition"),
    ("**Bold** and _italic_ words", "bold-and-italic-words"),
    ("snake_case_name", "snake_case_name"),
    ("Sizing a fleet: 1,000 nodes", "sizing-a-fleet-1000-nodes"),
])
def test_a_heading_gets_githubs_anchor(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


@pytest.mark.parametrize(("target", "ok"), [
    ("instrumenting.md", True),
    ("instrumenting.md#checkpoints", True),
    ("#every-alert", True),
    ("../alerts/runbooks/meta.md#watchdog", True),
    ("../alerts/runbooks/", True),
    ("../tests/house/test_doc_links.py", True),
    ("https://pypi.org/project/mutmut/", True),
    ("instrumenting.md#no-such-heading", False),
    ("no-such-page.md", False),
    ("#no-such-heading", False),
    ("../alerts/runbooks/meta.md#nope", False),
    ("/docs/alerts.md", False),
    ("https://exa mple.com/", False),
    ("http://", False),
    ("ftp://example.com/x", False),
    ("../../../etc/passwd", False),
])
def test_a_link_is_told_broken_or_not(target: str, ok: bool) -> None:
    assert (broken(REPO / "docs" / "alerts.md", target) is None) is ok


def test_links_in_code_are_not_links() -> None:
    text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n~~~\n[d](d.md)\n~~~\n[e](e.md \"title\") <https://x.org/>\n"
    assert list(links(text)) == ["a.md", "e.md", "https://x.org/"]


def test_the_readme_opens_with_the_two_commands_and_stays_short() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## The two commands"
    first = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    assert "\npip install -e . && outrider demo\n" in first and "\nbash .ci/run\n" in first
    assert "the test command: python3 -m pytest -q" in first
    assert len(text.splitlines()) <= 300, "README.md is a front page: what Outrider is, the two commands, where next"
