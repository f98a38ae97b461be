#!/usr/bin/env python3
"""Checks the layering runtime <- actors <- optim <- distributed (gpu/ and
libtorch/ are leaves above all): no file of a layer includes a header of a
layer above it.

Within distributed/, the sources sit in folders by responsibility, and the
library code (every non-test source, and the headers it includes) keeps an
order among them too: survive/ (what the distributed pieces share to agree
across ranks and to recover from a lost rank) includes none of the others; ddp/ only survive/; zero/ and
local_sgd/ only survive/ and ddp/ (not each other); rpc_optim/ only survive/.
A public header dopt/distributed/<name>.hpp counts as part of the folder that
implements it (PUBLIC_HOME). Unit tests (*.test.cpp) and the headers that only
tests include may cross folders: they test how the pieces work together."""
import pathlib, re, sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
rank = {"runtime": 0, "actors": 1, "optim": 2, "distributed": 3, "gpu": 4, "libtorch": 4}
inc = re.compile(r'#\s*include\s*[<"]dopt/(\w+)/')
SUFFIXES = {".hpp", ".cpp", ".cu", ".cuh", ".h"}
bad = []
for comp, level in rank.items():
    for f in (root / comp).rglob("*"):
        if f.suffix not in SUFFIXES:
            continue
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = inc.search(line)
            if m and m.group(1) in rank and rank[m.group(1)] > level:
                bad.append(f"{f.relative_to(root)}:{n}: {comp} includes dopt/{m.group(1)}/")

# --- inside distributed/ ---------------------------------------------------------
ALLOWED = {
    "survive": set(),
    "ddp": {"survive"},
    "zero": {"survive", "ddp"},
    "local_sgd": {"survive", "ddp"},
    "rpc_optim": {"survive"},
    "train": set(),
    "checkpoint": {"survive", "ddp", "zero", "local_sgd", "rpc_optim", "train"},
}
PUBLIC_HOME = {
    "recovery": "survive",
    "comm_hooks": "ddp", "reducer": "ddp", "quantized_all_reduce": "ddp", "device_ops": "ddp",
    "zero": "zero", "zero_overlap": "zero",
    "averagers": "local_sgd", "post_local_sgd": "local_sgd", "diloco": "local_sgd",
    "distributed_optimizer": "rpc_optim",
    "trainer": "train",
    "checkpointer": "checkpoint",
}
dist = root / "distributed"
src = dist / "src"
pub = dist / "dopt" / "distributed"
quoted = re.compile(r'#\s*include\s*"([^"]+)"')


def folder_of(f):
    """The responsibility folder of a file of distributed/ (None: not one of them)."""
    if f.parent == pub:
        return PUBLIC_HOME.get(f.stem)
    try:
        return f.relative_to(src).parts[0]
    except ValueError:
        return None


def resolve(f, name):
    """The file of distributed/ that `#include "name"` in f names, if any."""
    if name.startswith("dopt/distributed/"):
        return pub / name[len("dopt/distributed/"):]
    for base in (f.parent, src):
        cand = base / name
        if cand.exists():
            return cand
    return None


if src.is_dir():
    files = [f for f in list(src.rglob("*")) + list(pub.glob("*.hpp")) if f.suffix in SUFFIXES]
    for f in files:
        if folder_of(f) is not None and folder_of(f) not in ALLOWED:
            bad.append(f"{f.relative_to(root)}: distributed/src/{folder_of(f)}/ is not a known folder of distributed/")
    includes = {f: [] for f in files}
    for f in files:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            m = quoted.search(line)
            if m:
                target = resolve(f, m.group(1))
                if target is not None:
                    includes[f].append((n, target))
    # library code: the non-test sources and everything they include, transitively
    library = set()
    todo = [f for f in files if f.suffix == ".cpp" and not f.name.endswith(".test.cpp")]
    while todo:
        f = todo.pop()
        if f in library:
            continue
        library.add(f)
        todo.extend(t for _, t in includes.get(f, []) if t in includes)
    for f in sorted(library):
        mine = folder_of(f)
        for n, target in includes[f]:
            theirs = folder_of(target)
            if mine and theirs and theirs != mine and theirs not in ALLOWED.get(mine, set()):
                bad.append(f"{f.relative_to(root)}:{n}: distributed/{mine} includes {theirs}/ "
                           f"({target.relative_to(root)})")

for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
