#!/usr/bin/env python3
"""torch's own test suites, run as they are, once with torch's class and once
with only the import swapped for dopt's; fails when a test that passes with
torch's fails (or does not run) with dopt's (CTest label torch-suite).

    torch_suite.py zero|functional [--work DIR] [--cache DIR]

The test files come from Debian's source package of pytorch, the version of
the installed python3-torch (``apt-get source --download-only --tar-only``
with a deb-src line of this machine's Debian suite), fetched at test time and
cached (``--cache``, default $DOPT_TORCH_SRC_CACHE or ~/.cache/dopt/torch-src).
Nothing of torch's goes into dopt's repository.

Both copies get the same harness fixes, which torch's own run needs on this
machine (docs/testing.md, "torch's own suites"):

* ``expecttest`` (imported by torch's test utilities) is not packaged in
  Debian: a stand-in module with its two names (``TestCase``, ``ACCEPT``);
* Python 3.11 refuses a dataclass instance as a field default, which
  torch 1.13's ``torch.distributed._shard`` uses (DDP imports it): a
  ``sitecustomize`` restores Python 3.10's rule for those defaults;
* the GPU guards (``@skip_if_no_gpu``) are lifted, and ``device_ids=[rank]``
  becomes None on a machine without CUDA, so the tests that run on CPU with
  gloo run here.

Exempt: ``test_same_dense_param_type`` (dopt accepts parameters of mixed
dense dtypes on purpose; docs/torch-differences.md).

Each copy's results come from a recording unittest result (installed by the
same sitecustomize when DOPT_SUITE_RESULTS is set), not from its printout.
Exits 0 when dopt's passing set holds torch's, 1 otherwise, 77 (skipped)
when torch or the source package cannot be had.
"""
import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import time

SUITES = {
    "zero": {
        "member": "test/distributed/optim/test_zero_redundancy_optimizer.py",
        "swap": ("from torch.distributed.optim import ZeroRedundancyOptimizer\n",
                 "from dopt import ZeroRedundancyOptimizer\n"),
        "exempt": {"test_same_dense_param_type"},
        "timeout": 900,
    },
    "functional": {
        "member": "test/test_functional_optim.py",
        "swap": ("from torch.distributed.optim.utils import functional_optim_map, register_functional_optim\n",
                 "from dopt.functional import functional_optim_map, register_functional_optim\n"),
        "exempt": set(),
        "timeout": 300,
    },
}

EXPECTTEST = '''"""Stand-in for expecttest (not packaged in Debian): the names torch's test utilities use."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
'''

SITECUSTOMIZE = '''"""Harness fixes for torch 1.13's suites on Python 3.11 (see torch_suite.py)."""
import dataclasses
import json
import os
import unittest

_get_field = dataclasses._get_field


def _get_field_310(cls, a_name, a_type, *rest):
    # Python 3.11 refuses any unhashable default; 3.10 refused list, dict and set only.
    default = cls.__dict__.get(a_name, dataclasses.MISSING)
    if isinstance(default, dataclasses.Field):
        default = default.default
    t = type(default)
    if dataclasses.is_dataclass(t) and t.__hash__ is None:
        t.__hash__ = object.__hash__
        try:
            return _get_field(cls, a_name, a_type, *rest)
        finally:
            t.__hash__ = None
    return _get_field(cls, a_name, a_type, *rest)


dataclasses._get_field = _get_field_310

_out = os.environ.get("DOPT_SUITE_RESULTS")
if _out:
    class _Recording(unittest.TextTestResult):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.outcomes = {}

        def _note(self, test, what, detail=""):
            self.outcomes[test.id()] = [what, detail]

        def addSuccess(self, test):
            super().addSuccess(test)
            self._note(test, "passed")

        def addError(self, test, err):
            super().addError(test, err)
            self._note(test, "error", self._exc_info_to_string(err, test)[-4000:])

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._note(test, "failed", self._exc_info_to_string(err, test)[-4000:])

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._note(test, "skipped", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._note(test, "passed", "expected failure")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._note(test, "failed", "unexpected success")

        def stopTestRun(self):
            super().stopTestRun()
            with open(_out, "w") as f:
                json.dump(self.outcomes, f, indent=1)

    unittest.TextTestRunner.resultclass = _Recording
'''


def note(msg):
    print(f"torch_suite: {msg}", flush=True)


def torch_source_version():
    """The Debian source package and version of the installed python3-torch."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${source:Package} ${source:Version}", "python3-torch"],
                             check=True, capture_output=True, text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return (out[0], out[1]) if len(out) == 2 else None


def debian_source_line():
    """A deb-src line for this machine's Debian suite and mirror."""
    suite, mirror = None, "http://deb.debian.org/debian"
    for line in pathlib.Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            suite = line.split("=", 1)[1].strip().strip('"')
    for f in [pathlib.Path("/etc/apt/sources.list")] + sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*")):
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        m = re.search(r"^URIs:\s*(\S*debian)\s*$", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S*/debian)\s", text, re.M)
        if m:
            mirror = m.group(1)
            break
    return f"deb-src {mirror} {suite} main" if suite else None


def fetch_tarball(cache):
    """The pytorch .orig.tar of the installed version, downloaded once into cache."""
    sv = torch_source_version()
    if sv is None:
        return None, "python3-torch is not installed (scripts/install-deps.sh installs it)"
    package, version = sv
    upstream = version.split(":")[-1].rsplit("-", 1)[0]
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{package}_{upstream}.orig.tar.*"))
    if found:
        return found[0], None
    line = debian_source_line()
    if line is None:
        return None, "cannot tell this machine's Debian suite (/etc/os-release)"
    (cache / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "sources.list").write_text(line + "\n")
    opts = [f"-oDir::Etc::SourceList={cache / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={cache / 'lists'}", "-oAPT::Sandbox::User=root", "-qq"]
    note(f"fetching Debian's source of {package} {version} ({line})")
    t0 = time.time()
    r = subprocess.run(["apt-get", *opts, "update"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, "apt-get update (deb-src) failed: " + r.stderr.strip()[-500:]
    r = subprocess.run(["apt-get", *opts, "source", "--download-only", "--tar-only", f"{package}={version}"],
                       cwd=cache, capture_output=True, text=True)
    found = sorted(cache.glob(f"{package}_{upstream}.orig.tar.*"))
    if not found:
        return None, f"apt-get source {package}={version} gave no .orig.tar: " + (r.stderr or r.stdout).strip()[-500:]
    note(f"fetched {found[0].name} ({found[0].stat().st_size // 1024} KiB) in {time.time() - t0:.1f} s")
    return found[0], None


def extract(tarball, member):
    with tarfile.open(tarball) as tar:
        for m in tar.getmembers():
            if m.name.endswith("/" + member) and m.name.count("/") == member.count("/") + 1:
                return tar.extractfile(m).read().decode()
    raise SystemExit(f"torch_suite: {member} is not in {tarball}")


def lift_gpu_guards(text):
    """The harness fix both copies get: GPU guards lifted, CPU device ids."""
    text = re.sub(r"^(\s*)@common_distributed\.skip_if_no_gpu\s*$", r"\1# (GPU guard lifted by torch_suite.py)",
                  text, flags=re.M)
    return text.replace("device_ids=[self.rank],", "device_ids=[self.rank] if torch.cuda.is_available() else None,")


def run_copy(path, env, results, timeout, log):
    env = dict(env, DOPT_SUITE_RESULTS=str(results))
    t0 = time.time()
    with open(log, "w") as out:
        try:
            subprocess.run([sys.executable, path.name, "-v"], cwd=path.parent, env=env, stdout=out,
                           stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            note(f"{path.name} ran past {timeout} s (log: {log})")
    took = time.time() - t0
    if not results.exists():
        tail = pathlib.Path(log).read_text(errors="replace")[-3000:]
        note(f"{path.parent.name} copy recorded no results; the end of its log ({log}):\n{tail}")
        return {}, took
    return json.loads(results.read_text()), took


def short(test_id):
    return test_id.split(".", 1)[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite", choices=sorted(SUITES))
    ap.add_argument("--work", default=os.environ.get("DOPT_TEST_TMP", "/tmp"))
    ap.add_argument("--cache", default=os.environ.get("DOPT_TORCH_SRC_CACHE",
                                                      str(pathlib.Path.home() / ".cache/dopt/torch-src")))
    args = ap.parse_args()
    spec = SUITES[args.suite]
    try:
        import torch  # noqa: F401
    except ImportError:
        note("skipped: this Python has no torch")
        return 77
    tarball, why = fetch_tarball(pathlib.Path(args.cache))
    if tarball is None:
        note("skipped: " + why)
        return 77
    work = pathlib.Path(args.work) / f"torch-suite-{args.suite}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "shim").mkdir(parents=True)
    (work / "shim" / "expecttest.py").write_text(EXPECTTEST)
    (work / "shim" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    original = lift_gpu_guards(extract(tarball, spec["member"]))
    old, new = spec["swap"]
    if original.count(old) != 1:
        raise SystemExit(f"torch_suite: the import to swap is not in {spec['member']} exactly once: {old!r}")
    name = pathlib.Path(spec["member"]).name
    copies = {"torch": work / "torch" / name, "dopt": work / "dopt" / name}
    for side, path in copies.items():
        path.parent.mkdir()
        path.write_text(original if side == "torch" else original.replace(old, new))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(work / "shim")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("DOPT_SUITE_RESULTS", None)
    # torch's run_tests() writes JUnit XML through the unpackaged xmlrunner
    # whenever CI is set (common_utils.IS_CI); torch's own copy dies on that
    # import in a CI job just as dopt's does, so neither copy sees CI.
    env.pop("CI", None)
    outcome = {}
    for side, path in copies.items():
        outcome[side], took = run_copy(path, env, work / f"{side}.json", spec["timeout"], work / f"{side}.log")
        counts = {}
        for what, _ in outcome[side].values():
            counts[what] = counts.get(what, 0) + 1
        note(f"{side:5s} copy: {len(outcome[side])} tests in {took:.0f} s: "
             + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    torch_passed = {t for t, (what, _) in outcome["torch"].items() if what == "passed"}
    dopt_passed = {t for t, (what, _) in outcome["dopt"].items() if what == "passed"}
    if not torch_passed:
        note("FAIL: no test passed with torch's own class; the harness is broken (log: "
             f"{work / 'torch.log'})")
        return 1
    exempt = {t for t in torch_passed if t.rsplit(".", 1)[-1] in spec["exempt"]}
    missing = sorted(torch_passed - dopt_passed - exempt)
    for t in sorted(torch_passed | dopt_passed):
        mark = "both" if t in torch_passed and t in dopt_passed else (
            "EXEMPT" if t in exempt else ("MISSING" if t in missing else "dopt only"))
        note(f"  {mark:9s} {short(t)}")
    for t in missing:
        what, detail = outcome["dopt"].get(t, ["not run", ""])
        note(f"dopt copy, {short(t)}: {what}\n{detail}")
    note(f"{len(torch_passed)} pass with torch's class, {len(dopt_passed)} with dopt's, "
         f"{len(exempt)} exempt, {len(missing)} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
