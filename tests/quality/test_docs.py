"""The documentation holds together: the README stays a front door (at most 150 lines, the
install-and-run and test commands at its top, every page of docs/ reachable from it), every
relative link of the README, docs/ and the chart's README reaches a file that exists (and a
heading of it, for a link with an anchor), and docs/configuration.md is what
scripts/gen-config-docs writes from the settings."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.quality

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted([README, ROOT / "charts" / "schedext" / "README.md", *(ROOT / "docs").glob("*.md")])
# The commands the repository's contract puts at the README's very top.
INSTALL_AND_RUN = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/schedext serve"
TEST_SUITE = "scripts/test"

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = _LINK.sub(lambda m: m.group(0)[1 : m.group(0).index("]")], heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose(path):
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in prose(path):
        for target in _LINK.findall(_CODE_SPAN.sub("code", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                yield number, target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path) -> None:
    broken = []
    for number, target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not linked.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; feature reference goes in docs/"
    top = "\n".join(lines[:15])
    assert INSTALL_AND_RUN in top, "README.md's top lacks the install-and-run command"
    assert re.search(rf"^{re.escape(TEST_SUITE)}$", top, re.M), "README.md's top lacks scripts/test"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"exec {TEST_SUITE}" in ci, ".ci/run must run what the README tells a developer to"


def test_every_page_of_docs_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve() for _, target in relative_links(README)
    }
    orphans = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"README.md links to no docs/ page named {orphans}"


def test_the_configuration_page_matches_a_fresh_generation() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-config-docs"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
