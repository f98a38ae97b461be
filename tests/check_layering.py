#!/usr/bin/env python3
"""Checks the layering runtime <- actors <- optim (gpu/ and libtorch/ are leaves above all):
no file of a layer includes a header of a layer above it."""
import pathlib, re, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rank = {"runtime": 0, "actors": 1, "optim": 2, "gpu": 3, "libtorch": 3}
inc = re.compile(r'#\s*include\s*[<"]dopt/(\w+)/')
bad = []
for comp, level in rank.items():
    for f in (root / comp).rglob("*"):
        if f.suffix not in {".hpp", ".cpp", ".cu", ".cuh", ".h"}:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = inc.search(line)
            if m and m.group(1) in rank and rank[m.group(1)] > level:
                bad.append(f"{f.relative_to(root)}:{n}: {comp} includes dopt/{m.group(1)}/")
for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
