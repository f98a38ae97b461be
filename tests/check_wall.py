#!/usr/bin/env python3
"""The wall between dopt's public headers and its internals is a folder.

Installed (cmake/DoptHelpers.cmake takes them all, by folder, no list):
  <component>/dopt/<component>/*.hpp          the public API
  <component>/dopt/<component>/detail/*.hpp   template machinery users' code
                                              instantiates (may name detail::)
Never installed:
  <component>/dopt/<component>/internal/*.hpp shared between components' sources
  <component>/src/**                          one component's sources

Fails when
  * an installed header outside detail/ names `detail::` or opens a detail namespace;
  * an installed header includes a dopt header that is not installed (a consumer
    of the installed package could not compile it);
  * an example (examples/) or a benchmark (bench/) includes a dopt header that is
    not installed, or reaches into a component's sources with a relative path.
    Exempt, by folder: bench/internal/ (benchmarks of the library's own pieces:
    the TCP mesh and its ring collectives, the handshake, /dev/shm's huge-page
    mode) and examples/snippets/internal/ (the code docs/transport.md, a page
    about those pieces, quotes). They are built from the source tree, never
    against an installed dopt;
  * an installed header carries a test hook (a name with `for_testing`/`test_hook`).
"""
import pathlib, re, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
COMPONENTS = ["runtime", "actors", "optim", "distributed", "gpu", "libtorch"]


def installed_headers():
    out = {}
    for comp in COMPONENTS:
        base = root / comp / "dopt" / comp
        for pattern in ("*.hpp", "detail/*.hpp"):
            for h in sorted(base.glob(pattern)):
                out[h.relative_to(root / comp).as_posix()] = h
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


installed = installed_headers()
dopt_include = re.compile(r'^\s*#\s*include\s*[<"](dopt/[^">]+)[">]', re.M)
any_include = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
bad = []

for name, path in installed.items():
    text = path.read_text(errors="replace")
    code = strip_comments(text)
    in_detail = "/detail/" in name
    names_detail = bool(re.search(r"\bdetail::|namespace\s+(?:[\w:]+::)?detail\b", code))
    if not in_detail and names_detail:
        bad.append(f"{name}: an installed header names detail:: outside a detail/ folder")
    if re.search(r"for_testing|test_hook", code):
        bad.append(f"{name}: an installed header carries a test hook")
    for inc in dopt_include.findall(text):
        if inc not in installed:
            bad.append(f"{name}: includes {inc}, which is not installed")
    for inc in any_include.findall(text):
        if not inc.startswith("dopt/") and not (path.parent / inc).exists():
            continue
        if not inc.startswith("dopt/"):
            target = (path.parent / inc).resolve()
            if target not in {p.resolve() for p in installed.values()}:
                bad.append(f"{name}: includes \"{inc}\", which is not installed")

EXEMPT = ("bench/internal/", "examples/snippets/internal/")
for folder in ("examples", "bench"):
    for f in sorted((root / folder).rglob("*")):
        if f.suffix not in {".cpp", ".hpp", ".h", ".cu"}:
            continue
        if f.relative_to(root).as_posix().startswith(EXEMPT):
            continue
        text = f.read_text(errors="replace")
        rel = f.relative_to(root).as_posix()
        for inc in dopt_include.findall(text):
            if inc not in installed:
                bad.append(f"{rel}: includes {inc}, which is not installed")
        for inc in any_include.findall(text):
            if inc.startswith("dopt/"):
                continue
            target = (f.parent / inc).resolve()
            inside = any(target.is_relative_to(root / c) for c in COMPONENTS)
            if inside:
                bad.append(f"{rel}: includes \"{inc}\", a file of a component's internals")

for b in bad:
    print(b)
print(f"wall: {len(installed)} installed headers, {len(bad)} problem(s)")
sys.exit(1 if bad else 0)
