"""The documentation site: every page under docs/ is in mkdocs.yml's nav, every public
namespace has an API page, and every picture a page shows is there.

.ci/run builds the site with ``mkdocs build --strict`` (a broken link or docstring fails
it); these checks need no MkDocs and fail first, with the page's name.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tests.support import ROOT
from tests.support.browser import chromium
from tests.test_exports import PUBLIC

DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names (``Title: path.md`` lines under ``nav:``)."""
    text = CONFIG.read_text(encoding="utf-8")
    nav = text[text.index("\nnav:\n") :]
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, flags=re.M)


def test_every_page_is_in_the_nav() -> None:
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    listed = nav_pages()
    missing = [page for page in pages if page not in listed]
    assert missing == [], f"add these to mkdocs.yml's nav: {missing}"
    assert [page for page in listed if not (DOCS / page).is_file()] == []
    assert len(listed) == len(set(listed))
    assert listed[0] == "index.md"


def test_every_public_namespace_has_an_api_page() -> None:
    for namespace in sorted(PUBLIC | {"kernel.mcp", "agents_sdk"}):
        page = DOCS / "api" / f"{namespace}.md"
        assert page.is_file(), page
        assert f"::: {namespace}\n" in page.read_text(encoding="utf-8")


def test_every_picture_a_page_or_the_readme_shows_exists() -> None:
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md"]:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.name}: {target}"


def test_the_trace_picture_is_drawn_from_the_spans_a_receiver_got(tmp_path: Path) -> None:
    from tests.support.trace_waterfall import draw

    db = tmp_path / "trading.db"
    shutil.copy(ROOT / "tests" / "golden" / "trading.db", db)
    out = tmp_path / "trace.png"
    spans = draw(str(db), out, chromium())
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # One trace, one root (the workflow), every other span under a span of the trace.
    assert len({s["trace_id"] for s in spans}) == 1
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_span_id"] not in ids]
    assert [r["name"].split()[0] for r in roots] == ["invoke_workflow"]


def test_extras_are_named_by_the_distribution() -> None:
    # The distribution is dir-kernel (pip install 'dir-kernel[mcp]'); `dirk` is only the command.
    texts = [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "kernel").rglob("*.py")]
    wrong = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in texts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"(?<![\w-])dirk\[", line)
    ]
    assert wrong == []
