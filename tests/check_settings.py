#!/usr/bin/env python3
"""One settings table: the library reads the environment only through
runtime/src/settings.cpp (dopt/runtime/settings.hpp), and every DOPT_
variable named in the code is declared in runtime/src/settings_table.def.

    check_settings.py ROOT

Scope: the libraries (runtime, actors, optim, distributed, gpu, libtorch), the Python
package's C++ and Python sources, the benchmarks, tools other than dopt-run
(a launcher that only passes the environment on, linking no dopt library),
scripts/ and the test harnesses. Tests themselves (*.test.cpp) may set and
restore variables; the names they use must still be declared."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
table = (root / "runtime/src/settings_table.def").read_text()
declared = set(re.findall(r'^DOPT_SETTING\("(DOPT_[A-Z0-9_]+)"', table, re.M))
READS = re.compile(r"\b(getenv|secure_getenv|environ)\b")
# Where code reads (or sets, for a child) an environment variable by name.
USES = [re.compile(p) for p in (
    r'(?:getenv|setenv|unsetenv|settings::\w+)\(\s*"(DOPT_[A-Z0-9_]+)"',          # C++
    r'environ(?:\.get|\.pop|\.setdefault)?\s*[\[(]\s*["\'](DOPT_[A-Z0-9_]+)',    # Python
    r'os\.getenv\(\s*["\'](DOPT_[A-Z0-9_]+)',
    r'\$\{?(DOPT_[A-Z0-9_]+)',                                                        # shell
)]
allowed_reader = {pathlib.Path("runtime/src/settings.cpp"), pathlib.Path("tools/dopt_run.cpp"),
                  pathlib.Path("tools/dopt_run_secret.cpp")}
problems = []
code_dirs = ["runtime", "actors", "optim", "distributed", "gpu", "libtorch", "python/src", "python/dopt", "bench", "tools",
             "scripts", "tests", "examples", "fuzz"]
for d in code_dirs:
    for f in sorted((root / d).rglob("*")):
        if f.suffix not in {".cpp", ".hpp", ".h", ".cu", ".cuh", ".py", ".sh"} or not f.is_file():
            continue
        rel = f.relative_to(root)
        if rel.name in {"check_settings.py", "settings.test.cpp"}:  # they name undeclared variables on purpose
            continue
        text = f.read_text(errors="replace")
        is_test = ".test." in f.name or rel.parts[0] in {"tests", "fuzz", "scripts"} or "/tests/" in str(rel)
        if f.suffix in {".cpp", ".hpp", ".h", ".cu", ".cuh"} and not is_test and rel not in allowed_reader:
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("//", 1)[0]
                if READS.search(code):
                    problems.append(f"{rel}:{n}: reads the environment outside the settings table "
                                    f"(use dopt/runtime/settings.hpp): {line.strip()}")
        for n, line in enumerate(text.splitlines(), 1):
            for use in USES:
                for name in use.findall(line):
                    if name not in declared:
                        problems.append(f"{rel}:{n}: {name} is not declared in runtime/src/settings_table.def")
for p in problems:
    print(p)
print(f"check_settings: {len(declared)} settings declared; {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
