#!/usr/bin/env python3
"""docs/configuration.md from dopt's settings table (runtime/src/settings_table.def).

    scripts/settings_doc.py [ROOT]            # writes ROOT/docs/configuration.md
    scripts/settings_doc.py [ROOT] --check    # exit 1 when the page differs from the table

tests/check_docs.py runs the check; the C++ parser reads the same table
(dopt/runtime/settings.hpp)."""
import pathlib
import re
import sys

ENTRY = re.compile(r'^DOPT_SETTING\(\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)",\s*"([^"]*)",\s*"((?:[^"\\]|\\.)*)"\s*\)',
                   re.M)
ORDER = [("runtime", "The runtime"), ("launch", "The launch contract (docs/launching.md)"),
         ("transport", "Planes"), ("shm", "Shared memory"), ("tcp", "TCP"), ("mpi", "MPI"),
         ("checkpoints", "Checkpoints"), ("zero", "ZeroRedundancyOptimizer"),
         ("simulation", "Simulation (docs/testing.md)"), ("python", "The Python package (docs/python.md)"),
         ("tests", "Build and test harnesses")]
KIND = {"integer": "whole number", "bytes": "bytes (K, M, G, T)", "unsigned": "unsigned (or 0x)",
        "flag": "0 or 1", "choice": "one of", "text": "text"}


def entries(root):
    text = (root / "runtime/src/settings_table.def").read_text()
    body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("//"))
    out = [m.groups() for m in ENTRY.finditer(re.sub(r",\s*\n\s*", ", ", body))]
    if not out:
        raise SystemExit("settings_doc: no DOPT_SETTING entries found")
    return out


def page(root):
    rows = entries(root)
    lines = ["# Configuration", "",
             "Every environment variable dopt reads, from its settings table",
             "(`runtime/src/settings_table.def`; this page is generated from it by",
             "`scripts/settings_doc.py` and checked against it by `tests/check_docs.py`). One",
             "parser reads them (`dopt/runtime/settings.hpp`): unset and empty mean the",
             "default, a value of the wrong form is a `ValueError` naming the variable, its value",
             "and what it takes, and a `DOPT_` variable the table does not declare is named in",
             "one note at start (with the closest declared name), so that a misspelt one is",
             "not ignored in silence. Nothing else in the library reads the environment",
             "(`tests/check_settings.py`; the launcher `dopt-run` only passes it on).", "",
             f"{len(rows)} variables.", ""]
    for comp, title in ORDER:
        mine = [r for r in rows if r[4] == comp]
        if not mine:
            continue
        lines += [f"## {title}", "", "| variable | takes | default | what it does |", "|---|---|---|---|"]
        for name, kind, default, rng, _, what in mine:
            takes = KIND[kind]
            if kind == "choice":
                takes += " " + ", ".join(f"`{c}`" for c in rng.split("|"))
            elif kind in ("integer", "bytes") and rng:
                takes += f", {rng.replace('..', ' to ')}"
            lines.append(f"| `{name}` | {takes} | {default} | {what.replace('|', '/')} |")
        lines.append("")
    unknown = sorted({r[4] for r in rows} - {c for c, _ in ORDER})
    if unknown:
        raise SystemExit(f"settings_doc: components without a section: {unknown}")
    return "\n".join(lines)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    want = page(root)
    target = root / "docs" / "configuration.md"
    if "--check" in sys.argv:
        have = target.read_text() if target.exists() else ""
        if have != want:
            print("settings_doc: docs/configuration.md differs from runtime/src/settings_table.def; "
                  "run scripts/settings_doc.py")
            return 1
        print(f"settings_doc: docs/configuration.md matches the table ({len(entries(root))} variables)")
        return 0
    target.write_text(want)
    print(f"settings_doc: wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
