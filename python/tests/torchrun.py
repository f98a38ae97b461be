#!/usr/bin/env python3
"""Runs a script under torchrun (plain static rendezvous, as users do) on a
free master port: torchrun.py NPROC SCRIPT ARGS... Exits 77 (CTest: skipped)
when this Python has no torch or dopt was not built for it."""
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
    nproc, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Debian's torch 1.13 spells the options with underscores; on Python 3.11
    # its log redirection (--redirects/--tee) avoids a crash of its own.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", nproc, "--master_port", str(port),
           "--redirects", "1", "--tee", "1", script] + args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
