"""The documentation site as built, and the pages generated from the code.

- tools/check_site.py (run by `make docs` after `mkdocs build`): on the real site every fenced block renders
  as code, every runnable block inside a <pre>, no literal fence marker, no insider word in the prose; and it
  reports each of these when a page has one (the fence form the runnable blocks used before, rendered by the
  site's own Markdown extensions, is the oracle);
- docs/pipeline.md is what tools/pipeline_diagram.py reads from the imports now;
- docs/examples/formats/ is what tools/format_examples.py writes, every reader has its example and its
  section in docs/formats.md, and every example reads back through its reader without a rejection;
- CHANGELOG.md's top entry is pyproject.toml's version.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import check_site  # noqa: E402
import format_examples  # noqa: E402
import pipeline_diagram  # noqa: E402

EXTENSIONS = ["tables", "admonition", "pymdownx.superfences"]


def render(text: str) -> str:
    """A page body as the site's Markdown extensions render it (the [docs] extra; skipped without it, at the
    test rather than at import, so a tier that deselects these tests does not report the module skipped)."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx")
    return markdown.markdown(text, extensions=EXTENSIONS)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.is_file():
        pytest.skip("mkdocs is not installed (the [docs] extra)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(out)], cwd=ROOT, capture_output=True,
                          text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_the_built_site_passes_the_check(site):
    assert check_site.check_site(ROOT / "docs", site) == []
    runnable = sum(r for p in (ROOT / "docs").rglob("*.md") for _, r in check_site.source_blocks(p.read_text("utf-8")))
    assert runnable >= 8
    # every runnable block of a built page is inside a <pre>: its first command is in that page's code
    page = (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    pres = " ".join(re.findall(r"<pre.*?</pre>", page, re.S))
    assert "demo" in re.sub(r"<[^>]+>", "", pres) and "data-prep" in re.sub(r"<[^>]+>", "", pres)


def test_the_old_runnable_fence_is_reported():
    """```bash cpu, the form the runnable blocks had: superfences does not take it, the page shows text."""
    for body in ("Try:\n\n```bash cpu\nlaunch arm=search dry_run=true\n```\n",
                 "Try it:\n```bash cpu\nlaunch arm=search dry_run=true\n```\n"):
        html = render(body)
        assert "<pre" not in html
        problems = check_site.check_page(body, html, "p.md")
        assert any("rendered as code" in p for p in problems), problems


def test_a_runnable_block_that_renders_as_code_passes_and_one_that_does_not_fails():
    good = f"Run:\n\n{check_site.MARKER}\n```bash\nlaunch arm=search dry_run=true\n```\n"
    assert check_site.check_page(good, render(good), "p.md") == []
    assert check_site.source_blocks(good) == [(4, True)]
    # the marker above a fence that does not render (indented into a list item without a blank line)
    bad = f"- item\n{check_site.MARKER}\n```bash cpu\nlaunch arm=search\n```\n"
    assert any("runnable" in p or "rendered as code" in p for p in check_site.check_page(bad, render(bad), "p.md"))


@pytest.mark.parametrize("prose, what", [("Measured before issue 14's changes.", "issue N"),
                                         ("Against the issue's targets: met.", "the issue's"),
                                         ("It took 3 s on this box.", "this box"),
                                         ("Writes $OUT/report.json.", "$OUT")])
def test_an_insider_word_in_the_prose_is_reported(prose, what):
    problems = check_site.check_page(prose, render(prose), "p.md")
    assert len(problems) == 1 and "in the prose" in problems[0], problems
    assert check_site.check_page("The PR/issue headline ends the answer.", render("The PR/issue headline ends the answer."),
                                 "p.md") == []


def test_check_site_exits_1_on_a_broken_page_and_2_on_a_bad_argument(tmp_path):
    docs, site = tmp_path / "docs", tmp_path / "site"
    (docs).mkdir()
    text = "# P\n\n```bash cpu\nlaunch\n```\n"
    (docs / "p.md").write_text(text)
    (site / "p").mkdir(parents=True)
    (site / "p" / "index.html").write_text(render(text))
    tool = [sys.executable, str(ROOT / "tools" / "check_site.py")]
    proc = subprocess.run([*tool, f"site={site}", f"docs={docs}"], capture_output=True, text=True)
    assert proc.returncode == 1 and "docs/p.md: 1 fenced block(s) in the source, 0 rendered" in proc.stderr
    proc = subprocess.run([*tool, "sit=x"], capture_output=True, text=True)
    assert proc.returncode == 2 and "sit=x" in proc.stderr
    assert "check_site.py site=site docs=docs" in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_the_pipeline_page_is_what_the_code_gives():
    assert (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8") == pipeline_diagram.page()


def test_the_pipeline_diagram_follows_the_imports(tmp_path):
    for pkg, body in (("common", ""), ("data_prep", "from common import io\n"), ("evals", "import data_prep.x\n")):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "x.py").write_text(body)
    (tmp_path / "common" / "io.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    _, edges = pipeline_diagram.package_edges(tmp_path)
    assert edges["data_prep"] == {"common": 1} and edges["evals"] == {"data_prep": 1} and edges["common"] == {}
    assert "evals      imports: data_prep (1)" in pipeline_diagram.page(tmp_path)


def test_the_format_examples_are_fresh_and_each_reader_has_one():
    from data_prep.readers import FORMATS, PARSERS

    assert tuple(PARSERS) == FORMATS   # data.sources.*' rule (data_prep.config) names the formats the readers parse
    texts = format_examples.texts()
    out = ROOT / "docs" / "examples" / "formats"
    assert {n: (out / n).read_text(encoding="utf-8") for n in texts if (out / n).is_file()} == texts
    page = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")
    for fmt in PARSERS:
        assert f"{fmt}.json" in texts, f"no example for the {fmt} reader"
        assert f"### `{fmt}`" in page and f'--8<-- "docs/examples/formats/{fmt}.json"' in page


@pytest.mark.parametrize("fmt", ["r2e-gym", "swe-gym", "swe-smith", "openseeker", "search-r1", "canonical"])
def test_each_format_example_reads_back_through_its_reader(fmt):
    from data_prep.readers import read_source

    outs = list(read_source(f"{fmt}:{ROOT / 'docs' / 'examples' / 'formats' / f'{fmt}.json'}"))
    assert len(outs) == 1 and outs[0].reason is None, outs[0].reason
    rec = outs[0].record
    assert rec["messages"] and rec["messages"][-1]["role"] == "assistant"


def test_the_changelog_top_entry_is_the_package_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    entries = re.findall(r"^## \[?(\d+\.\d+\.\d+[^\]\s]*)", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert entries and entries[0] == version, (entries[:1], version)
