#!/usr/bin/env python3
"""Checks the links of README.md and the book (docs/src/**/*.md); stdlib only.

Usage: python3 ci/check-links.py [REPO_ROOT]      (exit 1 and one line per fault if any)

* every relative link (inline, image or reference definition) names a file or directory
  that exists; links from the book stay inside docs/src (the built book holds nothing else);
* every `#anchor` (alone or after a .md path) names a heading of that page, slugged as
  mdBook and GitHub do (lower case, spaces to '-', other punctuation dropped, duplicates
  '-1', '-2', ...), or an explicit `<a id=...>` / `{#id}`;
* every page under docs/src is listed in docs/src/SUMMARY.md, and every entry there exists.

Absolute URLs (`scheme:`) are not fetched: CI has no business with the network here.
Links inside code (fenced blocks, `inline code`) are not links and are skipped.
"""

import re
import sys
from pathlib import Path

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)\s*=\s*["']([^"']+)["']|\{#([A-Za-z0-9_-]+)\}""")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading):
    """The anchor mdBook and GitHub give a heading's text."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline html
    text = re.sub(r"\{#[^}]*\}", "", text).strip()
    out = []
    for ch in text:
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    """Every anchor a page defines."""
    if path not in _anchor_cache:
        seen = {}
        found = set()
        for _, line in prose_lines(path.read_text(encoding="utf-8")):
            for m in EXPLICIT_ID.finditer(line):
                found.add(m.group(1) or m.group(2))
            h = HEADING.match(line)
            if not h:
                continue
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        _anchor_cache[path] = found
    return _anchor_cache[path]


def links(path):
    """(line number, target) of every link in a page's prose."""
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        m = REF_DEF.match(line)
        if m:
            yield n, m.group(1)
            continue
        bare = CODE_SPAN.sub("", line)
        for m in INLINE_LINK.finditer(bare):
            yield n, m.group(1)


def check_page(root, book, page, faults):
    for n, target in links(page):
        where = f"{page.relative_to(root)}:{n}"
        if not target or SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            faults.append(f"{where}: link to a missing file: {target}")
            continue
        if book in page.parents and book != dest and book not in dest.parents:
            faults.append(f"{where}: link leaves the book (docs/src), so the built book breaks it: {target}")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix != ".md":
                faults.append(f"{where}: anchor on a file that is not a page: {target}")
            elif anchor not in anchors(dest):
                faults.append(f"{where}: no heading gives the anchor #{anchor} in {dest.relative_to(root)}")


def check_summary(root, book, faults):
    summary = book / "SUMMARY.md"
    if not summary.exists():
        faults.append(f"{summary.relative_to(root)}: missing")
        return
    listed = set()
    for n, target in links(summary):
        if not target or SCHEME.match(target):  # an empty target is a draft chapter
            continue
        dest = (book / target.partition("#")[0]).resolve()
        listed.add(dest)
        if not dest.is_file():
            faults.append(f"{summary.relative_to(root)}:{n}: lists a page that does not exist: {target}")
    for page in sorted(book.rglob("*.md")):
        if page != summary and page.resolve() not in listed:
            faults.append(f"{page.relative_to(root)}: not listed in docs/src/SUMMARY.md")


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
    book = root / "docs" / "src"
    pages = [root / "README.md"] + sorted(book.rglob("*.md"))
    faults = []
    for page in pages:
        if page.exists():
            check_page(root, book, page, faults)
        else:
            faults.append(f"{page.relative_to(root)}: missing")
    check_summary(root, book, faults)
    for f in faults:
        print(f, file=sys.stderr)
    count = sum(1 for _ in pages)
    if faults:
        print(f"check-links: {len(faults)} broken link(s) in {count} page(s)", file=sys.stderr)
        return 1
    print(f"check-links: {count} page(s), every link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
