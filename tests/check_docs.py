#!/usr/bin/env python3
"""Checks that the documentation matches the code.

1. Every C++ code block (```cpp, ```c++, ```cc) in README.md and docs/*.md is
   quoted from a file the build compiles. The line just before the block (blank
   lines between are allowed) must be a marker

       <!-- quoted from examples/zero/main.cpp -->

   naming a path relative to the repository root: a source under examples/
   (examples/snippets/ holds small compiled files written for the docs), or a
   header or source of a component (runtime/, actors/, optim/, distributed/,
   gpu/, libtorch/, tools/, python/). The block's lines must appear in that file in the same
   order and next to each other (leading and trailing white space and blank
   lines do not count). A line that is only `...` or `// ...` (any indentation)
   stands for any number of the file's lines. C++ in an indented (unfenced)
   code block is refused, as it would escape this check.

2. docs/, README.md and the installed headers stand on their own: they name no
   issue numbers, no spec sections and no paths that a clone of the repository
   does not have (../shared, /work/).

3. docs/torch-to-dopt.md names every installed header (every header of a
   component's dopt/<name>/ tree except those in an internal/ folder, which
   is never installed) in its API index.

4. Every relative link of README.md, docs/*.md and bench/results/*.md (inline
   links and images `[text](target)`, reference definitions `[name]: target`,
   and HTML href/src attributes; not those in code blocks or code spans)
   leads somewhere: the target, relative to the linking file (or to the
   repository root when it starts with '/'), exists, and a #anchor into a
   markdown file is one of that file's headings as GitHub names it
   (lowercase; punctuation other than '-' and '_' dropped; spaces to '-'; the
   second heading of the same name gets -1, the third -2, ...) or an explicit
   <a id="..."> / <a name="...">. A bare #anchor points into the linking page.
   Links with a scheme (https:, mailto:, ...) are not followed.

Usage: check_docs.py <repository root>. Exit status 0 when all is well, 1 with
one line per problem otherwise.
"""
import re
import sys
import urllib.parse
from pathlib import Path

CPP_FENCE = re.compile(r"^```\s*(cpp|c\+\+|cc|cxx)\s*$")
FENCE = re.compile(r"^```")
MARKER = re.compile(r"^<!--\s*quoted from\s+(\S+)\s*-->\s*$")
ELISION = re.compile(r"^(//\s*)?\.\.\.$")
QUOTABLE_ROOTS = ("examples/", "runtime/", "actors/", "optim/", "distributed/", "gpu/", "libtorch/", "tools/",
                  "python/")
FORBIDDEN = [
    (re.compile(r"\bissue\s+#?[0-9]+", re.I), "names an issue number"),
    (re.compile(r"\bspec\s+sections?\b", re.I), "names a spec section"),
    (re.compile(r"\bspec\s+§?[0-9]+(\.[0-9]+)+"), "names a spec section"),
    (re.compile(r"\.\./shared\b"), "names ../shared, which a clone does not have"),
    (re.compile(r"(?<![\w.])/work/"), "names a /work/ path, which a clone does not have"),
]


INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REF_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
HTML_ANCHOR = re.compile(r"<a\b[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def doc_pages(root: Path):
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    return [p for p in pages if p.is_file()]


def installed_headers(root: Path):
    out = []
    for comp in ("runtime", "actors", "optim", "distributed", "gpu", "libtorch"):
        out += [h for h in sorted((root / comp / "dopt").rglob("*.hpp"))
                if "internal" not in h.parent.relative_to(root / comp).parts]
    return out


def blocks(text: str):
    """Yields (line number of the fence, marker or None, block lines)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if CPP_FENCE.match(lines[i].strip()):
            start = i
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            marker = MARKER.match(lines[j].strip()) if j >= 0 else None
            k = i + 1
            while k < len(lines) and not FENCE.match(lines[k].strip()):
                k += 1
            yield start + 1, (marker.group(1) if marker else None), lines[i + 1:k]
            i = k + 1
        elif FENCE.match(lines[i].strip()) and lines[i].strip() != "```":
            # another language's block: skip to its end
            k = i + 1
            while k < len(lines) and lines[k].strip() != "```":
                k += 1
            i = k + 1
        else:
            i += 1


def indented_cpp(text: str, rel):
    """C++ written as an indented code block (four spaces after a blank line),
    which would escape the quote check: it must be a fenced ```cpp block."""
    out, fenced, lines = [], False, text.split("\n")
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or not line.startswith("    ") or (i > 0 and lines[i - 1].strip()):
            continue
        s = line.strip()
        if s.startswith(("*", "-", "|", "<")):
            continue
        if s.startswith("#include") or ("dopt::" in s and s.endswith((";", "{", "}"))):
            out.append(f"{rel}:{i + 1}: C++ in an indented code block: make it a fenced ```cpp block with a "
                       f"'<!-- quoted from <file> -->' line before it")
    return out


def link_pages(root: Path):
    """The pages whose links are checked: the doc pages and the benchmark reports."""
    return doc_pages(root) + sorted((root / "bench" / "results").glob("*.md"))


def prose_lines(text: str):
    """Yields (line number, line, line with its code spans blanked out) for the
    lines outside fenced code blocks (a link inside a code span is not one)."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip()
        m = re.match(r"(`{3,}|~{3,})", stripped)
        if fence is None and m:  # any indentation, as blocks() reads fences (one in a list item is indented)
            fence = m.group(1)
            continue
        if fence is not None:
            if stripped.startswith(fence) and not stripped[len(fence):].strip(fence[0]).strip():
                fence = None
            continue
        yield n, line, re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line)


def heading_slug(text: str) -> str:
    """The anchor GitHub gives a heading's text (before the -1, -2 of repeats)."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = re.sub(r"(`+)(.+?)\1", r"\2", text)  # code spans: their content
    text = re.sub(r"(\*+)(.+?)\1", r"\2", text)  # emphasis with '*'
    text = re.sub(r"(?<![\w])(_+)(.+?)\1(?![\w])", r"\2", text)  # emphasis with '_' (not inside words)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def anchors_of(page: Path, cache: dict):
    """The anchors a markdown page defines: its headings' and its explicit <a id|name>."""
    if page not in cache:
        anchors, seen = set(), {}
        for _, line, prose in prose_lines(page.read_text(encoding="utf-8")):
            anchors.update(HTML_ANCHOR.findall(prose))
            m = HEADING.match(line)
            if not m:
                continue
            slug = heading_slug(m.group(2))
            if slug in seen:
                seen[slug] += 1
                while f"{slug}-{seen[slug]}" in anchors:
                    seen[slug] += 1
                slug = f"{slug}-{seen[slug]}"
            else:
                seen[slug] = 0
            anchors.add(slug)
        cache[page] = anchors
    return cache[page]


def broken_links(root: Path):
    """One problem per relative link of link_pages() whose file or anchor does not exist."""
    problems, cache, nlinks = [], {}, 0
    for page in link_pages(root):
        rel = page.relative_to(root)
        for n, _, line in prose_lines(page.read_text(encoding="utf-8")):
            targets = [m.group(1) for m in INLINE_LINK.finditer(line)] + HTML_LINK.findall(line)
            ref = REF_DEFINITION.match(line)
            if ref:
                targets.append(ref.group(1))
            for target in targets:
                target = target.strip("<>").strip()
                if not target or SCHEME.match(target) or target.startswith("//"):
                    continue
                nlinks += 1
                path_part, _, anchor = target.partition("#")
                path_part = urllib.parse.unquote(path_part.split("?")[0])
                if not path_part:
                    dest = page
                elif path_part.startswith("/"):
                    dest = root / path_part.lstrip("/")
                else:
                    dest = page.parent / path_part
                dest = dest.resolve()
                if dest != root and root not in dest.parents:
                    problems.append(f"{rel}:{n}: link {target}: leads out of the repository")
                    continue
                if not dest.exists():
                    problems.append(f"{rel}:{n}: link {target}: {dest.relative_to(root)} does not exist (the link is "
                                    f"relative to {rel.parent})")
                    continue
                if anchor and dest.is_file() and dest.suffix == ".md":
                    anchor = urllib.parse.unquote(anchor)
                    if anchor not in anchors_of(dest, cache):
                        problems.append(f"{rel}:{n}: link {target}: {dest.relative_to(root)} has no heading or "
                                        f"<a id> with the anchor #{anchor}")
    return problems, nlinks


def quoted_in(block, source_lines):
    """None when the block's lines occur in source_lines as described above,
    else the first block line that could not be matched."""
    src = [s.strip() for s in source_lines if s.strip()]
    segments, cur = [], []
    for line in block:
        s = line.strip()
        if not s:
            continue
        if ELISION.match(s):
            segments.append(cur)
            cur = []
        else:
            cur.append(s)
    segments.append(cur)
    segments = [seg for seg in segments if seg]
    pos = 0
    for seg in segments:
        found = -1
        for start in range(pos, len(src) - len(seg) + 1):
            if src[start:start + len(seg)] == seg:
                found = start
                break
        if found < 0:
            # name the longest prefix that does match, to point at the line that differs
            best = 0
            for start in range(pos, len(src)):
                n = 0
                while n < len(seg) and start + n < len(src) and src[start + n] == seg[n]:
                    n += 1
                best = max(best, n)
            return seg[min(best, len(seg) - 1)]
        pos = found + len(seg)
    return None


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = []
    nblocks = 0
    for page in doc_pages(root):
        rel = page.relative_to(root)
        for line_no, marker, block in blocks(page.read_text(encoding="utf-8")):
            nblocks += 1
            where = f"{rel}:{line_no}"
            if marker is None:
                problems.append(f"{where}: C++ block without a '<!-- quoted from <file> -->' line before it")
                continue
            if not marker.startswith(QUOTABLE_ROOTS) or ".." in marker:
                problems.append(f"{where}: quotes {marker}, which is not a source the build compiles "
                                f"(one of {', '.join(QUOTABLE_ROOTS)})")
                continue
            source = root / marker
            if not source.is_file():
                problems.append(f"{where}: quotes {marker}, which does not exist")
                continue
            missing = quoted_in(block, source.read_text(encoding="utf-8").split("\n"))
            if missing is not None:
                problems.append(f"{where}: not in {marker} (in this order): {missing!r}")
        problems += indented_cpp(page.read_text(encoding="utf-8"), rel)
    for path in doc_pages(root) + installed_headers(root):
        rel = path.relative_to(root)
        for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
            for pattern, why in FORBIDDEN:
                if pattern.search(line):
                    problems.append(f"{rel}:{n}: {why}: {line.strip()}")
    link_problems, nlinks = broken_links(root)
    problems += link_problems
    api_page = root / "docs" / "torch-to-dopt.md"
    if api_page.is_file():
        api = api_page.read_text(encoding="utf-8")
        for h in installed_headers(root):
            if h.name not in api:
                problems.append(f"docs/torch-to-dopt.md: the public header {h.relative_to(root)} is not in the "
                                f"API index (list its entry points there)")
    gen = root / "scripts" / "settings_doc.py"
    if gen.is_file():  # docs/configuration.md is the settings table's (runtime/src/settings_table.def)
        import importlib.util
        spec = importlib.util.spec_from_file_location("settings_doc", gen)
        settings_doc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(settings_doc)
        page = root / "docs" / "configuration.md"
        if not page.is_file() or page.read_text(encoding="utf-8") != settings_doc.page(root):
            problems.append("docs/configuration.md differs from runtime/src/settings_table.def: run "
                            "scripts/settings_doc.py")
    for p in problems:
        print(p)
    print(f"check_docs: {nblocks} C++ blocks in {len(doc_pages(root))} pages, "
          f"{len(installed_headers(root))} headers, {nlinks} relative links in {len(link_pages(root))} pages; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
