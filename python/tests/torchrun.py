#!/usr/bin/env python3
"""Runs a script under torchrun (plain static rendezvous, as users do) on a
free master port: torchrun.py [--torch-launcher] NPROC SCRIPT ARGS...

By default through ``python3 -m dopt.run`` (torchrun with torch 1.13's
Python 3.11 bug mended, as docs/python.md says to launch); with
``--torch-launcher`` through torch's own ``python3 -m torch.distributed.run``
with the flags this Python needs (``--redirects 1 --tee 1``). Exits 77
(CTest: skipped) when this Python has no torch or dopt was not built for it."""
import os
import socket
import subprocess
import sys


def main():
    try:
        import torch  # noqa: F401
        import torch.distributed.run  # noqa: F401
    except ImportError as e:
        print(f"skipped: this Python ({sys.executable}) has no torch: {e} (apt-get install python3-torch)")
        return 77
    argv = sys.argv[1:]
    torch_launcher = argv[:1] == ["--torch-launcher"]
    if torch_launcher:
        argv = argv[1:]
    nproc, script, args = argv[0], argv[1], argv[2:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Debian's torch 1.13 spells the options with underscores; on Python 3.11
    # its own launcher needs --redirects/--tee to avoid a crash of its own.
    if torch_launcher:
        launcher = ["torch.distributed.run", "--redirects", "1", "--tee", "1"]
    else:
        launcher = ["dopt.run"]
    cmd = [sys.executable, "-m", *launcher, "--nproc_per_node", nproc, "--master_port", str(port), script] + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
