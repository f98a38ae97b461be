#!/usr/bin/env bash
# Installs dopt's build and test dependencies from Debian when they are missing.
# Usage: scripts/install-deps.sh [--with-torch]
# Besides the C++ toolchain and libraries, it installs what the optional
# components and their tests need: the Python package (pybind11-dev,
# python3-dev; its tests compare with python3-torch, which is also the
# benchmarks' peer), the libtorch interop (libtorch-dev), the MPI plane and
# its tests (libopenmpi-dev, openmpi-bin) and the multi-host tests' network
# namespaces (iproute2: ip, tc), and ccache (CI's second configuration reuses
# the first one's objects). --with-torch is
# accepted for compatibility (torch is always installed now).
set -euo pipefail
pkgs=(cmake g++ make python3 libcaf-dev libboost-dev catch2 libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libdlpack-dev libeigen3-dev
      libxxhash-dev libssl-dev pybind11-dev python3-dev python3-torch python3-numpy libtorch-dev
      libopenmpi-dev openmpi-bin iproute2 ccache)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "install-deps: all packages present" >&2
fi
