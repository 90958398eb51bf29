"""Check the built documentation site against its sources; `make docs` runs it after `mkdocs build`.

    python tools/check_site.py [site=site] [docs=docs]

For every page of docs/ (site/<page>/index.html):
- every fenced code block of the source renders as a <pre> (a fence the Markdown extensions do not accept
  becomes a paragraph or a line of inline code, and `mkdocs build --strict` does not notice);
- no literal fence marker (```) is left in the rendered text outside a <pre>;
- every runnable block (the `<!-- runnable: cpu -->` marker line, or its `stops-at:` form, right above a fence; the docs test runs
  these) is the next element after its marker and is a <pre>;
- no prose uses a word only the project's authors know: "issue N", "the issue's", "this box", `$OUT`.

Prints one line per problem (page and what) and exits 1 when there is any; 2 for a bad argument.
"""
from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from docs_blocks import MARKER, is_marker  # noqa: E402,F401  (the runnable marker, with or without stops-at:)

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<mark>`{3,}|~{3,})(?P<info>.*)$")
INSIDER = [(re.compile(r"\bissues? #?\d+", re.I), "a tracker number ('issue N')"),
           (re.compile(r"\bthe issue's\b", re.I), "\"the issue's\""),
           (re.compile(r"\bthis box\b", re.I), "\"this box\""),
           (re.compile(r"\$OUT\b"), "$OUT")]


def source_blocks(text: str) -> list[tuple[int, bool]]:
    """(line, runnable) of each fenced code block of a Markdown source, in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m["mark"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        runnable = i > 0 and is_marker(lines[i - 1])
        blocks.append((i + 1, runnable))
        close = re.compile(rf"^[ \t]*{re.escape(m['mark'][0])}{{{len(m['mark'])},}}[ \t]*$")
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            i += 1
        i += 1
    return blocks


class _Page(HTMLParser):
    """The rendered content of one page: its <pre> count, the text outside <pre>, and, for each runnable
    marker, whether the next element is a <pre> (possibly inside the highlight <div>)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pre = 0
        self.depth = 0            # inside <pre>
        self.skip = 0             # inside <script>/<style>
        self.prose: list[str] = []
        self.markers: list[bool] = []
        self._waiting = False     # a marker seen, its block not yet

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if self._waiting and tag != "div":
            self.markers.append(tag == "pre")
            self._waiting = False
        if tag == "pre":
            self.pre += 1
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "pre" and self.depth:
            self.depth -= 1
        if tag in ("script", "style") and self.skip:
            self.skip -= 1

    def handle_comment(self, data):
        if is_marker(f"<!--{data}-->"):
            if self._waiting:
                self.markers.append(False)
            self._waiting = True

    def handle_data(self, data):
        if self._waiting and data.strip():
            self.markers.append(False)
            self._waiting = False
        if not self.depth and not self.skip:
            self.prose.append(data)

    def close(self):
        super().close()
        if self._waiting:
            self.markers.append(False)
            self._waiting = False


def html_of(page: Path, docs: Path, site: Path) -> Path:
    """The built file of a docs page (mkdocs' directory URLs)."""
    rel = page.relative_to(docs).with_suffix("")
    return site / ("index.html" if rel.name == "index" and rel.parent == Path(".") else
                   rel.parent / ("" if rel.name == "index" else rel.name) / "index.html")


def check_page(source: str, html: str, name: str) -> list[str]:
    """The problems of one page: its Markdown source against its built HTML."""
    parser = _Page()
    parser.feed(html)
    parser.close()
    problems, blocks = [], source_blocks(source)
    if parser.pre != len(blocks):
        problems.append(f"{name}: {len(blocks)} fenced block(s) in the source, {parser.pre} rendered as code "
                        f"(<pre>): a fence the Markdown extensions do not accept renders as text")
    prose = "".join(parser.prose)
    for line in prose.splitlines():
        if "```" in line:
            problems.append(f"{name}: a literal fence marker in the rendered text: {line.strip()[:80]!r}")
    runnable = [line for line, r in blocks if r]
    if len(parser.markers) != len(runnable):
        problems.append(f"{name}: {len(runnable)} runnable block(s) in the source, {len(parser.markers)} marker(s) "
                        f"in the HTML")
    for line, ok in zip(runnable, parser.markers):
        if not ok:
            problems.append(f"{name}:{line}: the runnable block does not render as code (<pre>)")
    flat = " ".join(prose.split())
    for pattern, what in INSIDER:
        for m in pattern.finditer(flat):
            context = flat[max(0, m.start() - 40):m.end() + 40]
            problems.append(f"{name}: {what} in the prose: ...{context}...")
    return problems


def check_site(docs: Path, site: Path) -> list[str]:
    """Every problem of the built site, page by page (a page not built is one)."""
    problems = []
    for page in sorted(docs.rglob("*.md")):
        if page.relative_to(docs).parts[0] == "keys":          # included into the stage pages, not built alone
            continue
        built = html_of(page, docs, site)
        name = str(page.relative_to(docs.parent)) if docs.parent != docs else page.name
        if not built.is_file():
            problems.append(f"{name}: not built ({built} missing)")
            continue
        problems += check_page(page.read_text(encoding="utf-8"), built.read_text(encoding="utf-8"), name)
    return problems


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    args = {"site": "site", "docs": "docs"}
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq or key not in args:
            print(f"check_site: bad argument {a!r}: expected site=DIR or docs=DIR", file=sys.stderr)
            return 2
        args[key] = value
    docs, site = (Path(args[k]) if Path(args[k]).is_absolute() else Path.cwd() / args[k] for k in ("docs", "site"))
    for key, path in (("docs", docs), ("site", site)):
        if not path.is_dir():
            print(f"check_site: {key}={args[key]}: no such directory", file=sys.stderr)
            return 2
    problems = check_site(docs, site)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"check_site: {len(problems)} problem(s) in {site}", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
