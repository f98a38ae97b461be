#!/usr/bin/env bash
# Runs the huge-page checks of dopt_unit_tests ("[huge]") with a tmpfs mounted
# huge=always over /dev/shm, in a mount namespace of its own: the machine's
# /dev/shm is not touched. Root only; elsewhere (or where the kernel has no
# huge pages for tmpfs) it reports itself skipped (77) with the reason.
#   tests/huge_shm_namespace.sh UNIT_TESTS
set -u
unit=$1
. "$(dirname "$0")/mount_namespace.sh"
require_mount_namespace
thp=/sys/kernel/mm/transparent_hugepage
if grep -q '\[deny\]' $thp/shmem_enabled 2>/dev/null; then
  echo "skipped: $thp/shmem_enabled is deny (no huge pages for any tmpfs)"
  exit 77
fi
if [ "$(cat $thp/hpage_pmd_size 2>/dev/null)" != 2097152 ]; then
  echo "skipped: huge pages here are not 2 MiB ($thp/hpage_pmd_size: $(cat $thp/hpage_pmd_size 2>/dev/null || echo none))"
  exit 77
fi
exec unshare -m --propagation private bash -c '
  if ! mount -t tmpfs -o huge=always,size=1g tmpfs /dev/shm 2>/dev/null; then
    echo "skipped: cannot mount a tmpfs with huge=always (no transparent huge pages for tmpfs in this kernel?)"
    exit 77
  fi
  grep " /dev/shm " /proc/self/mounts
  DOPT_TEST_EXPECT_HUGE_SHM=1 "$0" "[huge]"' "$unit"
