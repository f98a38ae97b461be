#!/usr/bin/env python3
"""Checks check_docs.py's link check on a small tree with planted broken links.

The tree holds links that must pass (to files, to headings as GitHub names
them, to a repeated heading's -1, to an <a id>, to the page itself) and links
that must be reported (a missing file, a missing anchor, a link relative to
the wrong folder, one leading out of the repository); links in code spans and
code blocks and links with a scheme must be ignored. Exit status 0 when the
check reports exactly the planted broken links, 1 otherwise.

Usage: check_docs_links_test.py (no arguments; the tree is made in a temporary folder).
"""
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_docs  # noqa: E402

README = """# Project
[fine](docs/a.md#intro) and [missing file](docs/missing.md)
[folder](docs) and [root-relative](/docs/a.md#repeat)
"""

DOC_A = """# Intro
## `step_async` (C++)
## Ports: MASTER_PORT + 1
## Repeat
## Repeat
## See [the results](../bench/results/r.md)
<a id="custom"></a>
[self](#repeat-1) [self missing](#repeat-2) [code](#step_async-c) [punct](#ports-master_port--1)
[to results](../bench/results/r.md#results) [custom](#custom) [heading with a link](#see-the-results)
a code span `[code](nowhere.md)` is no link; [external](https://example.com/x#y) is not followed
```md
[in a block](nowhere.md)
# not a heading
```
[image](pic.png) [out](../../outside.md)
[in a block's heading](#not-a-heading)
- a list item with a block:

      ```sh
      [in an indented block](nowhere.md)
      ```
"""

RESULTS = """# Results
[doc](../../docs/a.md#ports-master_port--1) [wrong folder](a.md#intro) [title](../../README.md "the README")
"""

EXPECTED = [
    ("README.md:2:", "docs/missing.md does not exist"),
    ("docs/a.md:8:", "docs/a.md has no heading or <a id> with the anchor #repeat-2"),
    ("docs/a.md:15:", "docs/pic.png does not exist"),
    ("docs/a.md:15:", "../../outside.md: leads out of the repository"),
    ("docs/a.md:16:", "the anchor #not-a-heading"),
    ("bench/results/r.md:2:", "bench/results/a.md does not exist"),
]


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        (root / "docs").mkdir(parents=True)
        (root / "bench" / "results").mkdir(parents=True)
        (root / "README.md").write_text(README, encoding="utf-8")
        (root / "docs" / "a.md").write_text(DOC_A, encoding="utf-8")
        (root / "bench" / "results" / "r.md").write_text(RESULTS, encoding="utf-8")
        problems, nlinks = check_docs.broken_links(root.resolve())
    failures = []
    for where, what in EXPECTED:
        if not any(p.startswith(where) and what in p for p in problems):
            failures.append(f"not reported: {where} {what}")
    for p in problems:
        if not any(p.startswith(where) and what in p for where, what in EXPECTED):
            failures.append(f"reported, but the link is fine: {p}")
    if nlinks != 18:
        failures.append(f"{nlinks} links followed, 18 expected (code spans, blocks and external links are not)")
    for f in failures:
        print(f)
    print(f"check_docs_links_test: {len(EXPECTED)} planted broken links, {len(problems)} reported; "
          f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
