#!/usr/bin/env bash
# Installs dopt's build and test dependencies from Debian when they are missing.
# Usage: scripts/install-deps.sh [--with-slurm] [--with-torch]
# Besides the C++ toolchain and libraries, it installs what the optional
# components and their tests need: the Python package (pybind11-dev,
# python3-dev; its tests compare with python3-torch, which is also the
# benchmarks' peer; `pip install ./python` in a venv needs python3-venv,
# python3-pip, python3-setuptools and python3-wheel), the libtorch interop (libtorch-dev), the MPI plane and
# its tests (libopenmpi-dev, openmpi-bin) and the multi-host tests' network
# namespaces (iproute2: ip, tc), ccache (scripts/test.sh builds through it: CI's
# second configuration and the pip test reuse the first build's objects), and
# clang with its libFuzzer runtime (clang, libclang-rt-14-dev) for the fuzz
# targets (fuzz/, scripts/fuzz.sh).
# SLURM, for the real srun test (tests/slurm_cluster.sh: slurmctld slurmd
# slurm-client munge), is installed without its Recommends: 6 packages,
# 3.2 MB, 11 s to install here from apt's cache (with Recommends: 33
# packages, 8.2 MB, 4 s to download and 26 s to install). Its packages are
# services: where systemd runs the machine, Debian enables and starts them on
# install (munge at least), so there SLURM is installed only with
# --with-slurm; in a container without systemd (CI), where nothing is
# started (invoke-rc.d finds no runlevel), always. The test starts daemons of
# its own (own config, socket and ports) and skips without the packages.
# --with-torch is accepted for compatibility (torch is always installed now).
set -euo pipefail
pkgs=(cmake g++ make python3 libcaf-dev libboost-dev libboost-context-dev catch2 libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libdlpack-dev libeigen3-dev
      libxxhash-dev libssl-dev pybind11-dev python3-dev python3-torch python3-numpy python3-venv python3-pip
      python3-setuptools python3-wheel libtorch-dev
      libopenmpi-dev openmpi-bin iproute2 ccache clang libclang-rt-14-dev)
lean=()  # installed without Recommends
with_slurm=0
for arg in "$@"; do [[ "$arg" == --with-slurm ]] && with_slurm=1; done
if ((with_slurm)) || [[ ! -d /run/systemd/system ]]; then
  lean+=(slurmctld slurmd slurm-client munge)
fi
is_missing() { ! dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_lean=()
for p in "${pkgs[@]}"; do is_missing "$p" && missing+=("$p"); done
for p in "${lean[@]}"; do is_missing "$p" && missing_lean+=("$p"); done
all=("${missing[@]}" "${missing_lean[@]}")
if ((${#all[@]})); then
  echo "install-deps: installing ${all[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ((${#missing_lean[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_lean[@]}" >/dev/null
  fi
else
  echo "install-deps: all packages present" >&2
fi
