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

Usage: check_docs.py <repository root>. Exit status 0 when all is well, 1 with
one line per problem otherwise.
"""
import re
import sys
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
          f"{len(installed_headers(root))} headers; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
