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
tests include may cross folders: they test how the pieces work together.

Within actors/, the same check with ACTORS_ALLOWED: plane/ (the seam) below
sim/, collectives/ and the transports (transport/<name>/), those below core/,
rpc/ on top; dopt/actors/detail/ and internal/ below all of them
(docs/architecture.md, "Inside actors/"). An installed actors header includes
no header of the library's sources and none of internal/."""
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
quoted = re.compile(r'#\s*include\s*"([^"]+)"')


def check_inner_order(comp, src, pub, allowed, folder_of):
    """The order among the responsibility folders of one component's library
    code: the non-test sources and every header of the component they
    include, transitively. folder_of(f) names the folder of a file of the
    component (None: no folder, not checked); a folder may include its own
    files and those of the folders allowed[folder]."""
    if not src.is_dir():
        return

    def resolve(f, name):
        """The file of the component that `#include "name"` in f names, if any."""
        prefix = f"dopt/{comp}/"
        if name.startswith(prefix):
            return pub / name[len(prefix):]
        for base in (f.parent, src):
            cand = base / name
            if cand.exists():
                return cand
        return None

    files = [f for f in list(src.rglob("*")) + list(pub.rglob("*.hpp")) if f.suffix in SUFFIXES]
    for f in files:
        if folder_of(f) is not None and folder_of(f) not in allowed:
            bad.append(f"{f.relative_to(root)}: {folder_of(f)}/ is not a known folder of {comp}/")
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
            if mine and theirs and theirs != mine and theirs not in allowed.get(mine, set()):
                bad.append(f"{f.relative_to(root)}:{n}: {comp}/{mine} includes {theirs}/ "
                           f"({target.relative_to(root)})")


dist = root / "distributed"
src = dist / "src"
pub = dist / "dopt" / "distributed"


def folder_of(f):
    """The responsibility folder of a file of distributed/ (None: not one of them)."""
    if f.parent == pub:
        return PUBLIC_HOME.get(f.stem)
    try:
        return f.relative_to(src).parts[0]
    except ValueError:
        return None


check_inner_order("distributed", src, pub, ALLOWED, folder_of)

# --- inside actors/ ----------------------------------------------------------------
# Lowest first (docs/architecture.md, "Inside actors/"). internal/ and detail/
# are header folders of dopt/actors/ that every folder may include; they
# include only installed headers. The installed headers (dopt/actors/*.hpp)
# are the API: any folder includes them, and they include no folder (below).
ACTORS_LOW = {"internal", "detail"}
ACTORS_TRANSPORTS = {"transport/tcp", "transport/shm", "transport/mpi", "transport/hier", "transport/actor"}
ACTORS_ALLOWED = {
    "internal": set(),
    "detail": set(),
    "plane": ACTORS_LOW,
    "sim": ACTORS_LOW | {"plane"},
    "collectives": ACTORS_LOW | {"plane", "sim"},
    "transport/tcp": ACTORS_LOW | {"plane"},
    "transport/shm": ACTORS_LOW | {"plane"},
    "transport/mpi": ACTORS_LOW | {"plane"},
    "transport/hier": ACTORS_LOW | {"plane", "transport/shm", "transport/tcp"},
    "transport/actor": ACTORS_LOW | {"plane", "transport/tcp"},
    "core": ACTORS_LOW | {"plane", "sim", "collectives"} | ACTORS_TRANSPORTS,
    "rpc": ACTORS_LOW | {"plane", "sim", "collectives", "core"},
}
actors = root / "actors"
actors_src = actors / "src"
actors_pub = actors / "dopt" / "actors"


def actors_folder_of(f):
    """The folder of a file of actors/ (None: an installed header)."""
    try:
        parts = f.relative_to(actors_src).parts
    except ValueError:
        rel = f.relative_to(actors_pub).parts
        return rel[0] if len(rel) > 1 else None
    return "/".join(parts[:2]) if parts[0] == "transport" and len(parts) > 2 else parts[0]


check_inner_order("actors", actors_src, actors_pub, ACTORS_ALLOWED, actors_folder_of)
# The wall: an installed header includes installed headers (and detail/ ones) only.
for f in sorted(actors_pub.rglob("*.hpp")) if actors_pub.is_dir() else []:
    if actors_folder_of(f) == "internal":
        continue
    for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
        m = quoted.search(line)
        if m and not m.group(1).startswith("dopt/") or m and m.group(1).startswith("dopt/actors/internal/"):
            bad.append(f"{f.relative_to(root)}:{n}: an installed header includes {m.group(1)}, which is not installed")

for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
