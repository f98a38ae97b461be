#!/usr/bin/env bash
# `pip install ./python` as docs/python.md says, offline: a venv that sees
# Debian's python3-torch, pip with --no-build-isolation --no-index (nothing
# downloaded), the C++ core built by setup.py with CMake (in build-pip/ of the
# checkout: ccache, when the build uses it, finds build/'s objects there).
# Then, from another folder: import the installed dopt (not the build tree's),
# one ZeRO step at a world of one against torch.optim.Adam, and the launcher
# entry point dopt-torchrun with 2 ranks.
#   pip_install.sh PYTHON CHECKOUT WORK
# Exits 77 (skipped) when this Python cannot make a venv with pip.
set -euo pipefail
python=$1 checkout=$2 work=$3
venv="$work/pip-venv"
rm -rf "$venv"
if ! "$python" -m venv --system-site-packages "$venv" >/dev/null 2>&1 || [[ ! -x "$venv/bin/pip" ]]; then
  echo "skipped: $python -m venv with pip is not available (apt-get install python3-venv python3-pip)"
  exit 77
fi
start=$(date +%s)
(cd "$checkout" && env -u PYTHONPATH "$venv/bin/pip" install --no-build-isolation --no-index ./python)
echo "pip_install: installed in $(( $(date +%s) - start )) s"
cd "$work"
env -u PYTHONPATH "$venv/bin/python" - <<'PY'
import sys

import torch

import dopt

assert dopt.__file__.startswith(sys.prefix), f"imported {dopt.__file__}, not the venv's"
ours = [torch.arange(6.0, requires_grad=True)]
theirs = [torch.arange(6.0, requires_grad=True)]
z = dopt.ZeroRedundancyOptimizer(ours, torch.optim.Adam, lr=0.1)
t = torch.optim.Adam(theirs, lr=0.1)
for p in ours + theirs:
    p.grad = torch.linspace(-1, 1, 6)
z.step()
t.step()
assert z.uses_dopt_kernels and torch.equal(ours[0], theirs[0]), (ours, theirs)
print("pip_install: the installed package steps bitwise torch.optim.Adam")
PY
cat > "$work/pip-launch.py" <<'PY'
import torch
import torch.distributed as dist

import dopt

dist.init_process_group("gloo")
assert dopt.get_world_size() == dist.get_world_size() == 2
t = torch.ones(3) * (dist.get_rank() + 1)
dopt.get_world().all_reduce(t)
assert t.tolist() == [3.0, 3.0, 3.0], t
print(f"pip_install: rank {dist.get_rank()} of dopt-torchrun: all_reduce ok")
PY
port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
env -u PYTHONPATH OMP_NUM_THREADS=1 "$venv/bin/dopt-torchrun" --nproc_per_node 2 --master_port "$port" "$work/pip-launch.py"
echo "pip_install: PASS"
