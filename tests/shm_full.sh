#!/usr/bin/env bash
# /dev/shm without room: with a private 32 MiB /dev/shm holding
# 1 MiB free (a mount namespace of this test's own: the machine's /dev/shm is
# not touched), a 2-rank job must fail with an error that names /dev/shm, the
# bytes needed and free and the setting that moves the job to TCP, on the
# rank that hit it, never die of SIGBUS (exit 135); with that setting
# (DOPT_TRANSPORT=tcp) the same job runs. Root only; elsewhere it reports
# itself skipped (77) with the reason.
#   tests/shm_full.sh BUILD_DIR
set -u
build=$1
. "$(dirname "$0")/mount_namespace.sh"
require_mount_namespace
exec unshare -m --propagation private bash -c '
  build=$0
  if ! mount -t tmpfs -o size=32m tmpfs /dev/shm; then
    echo "skipped: cannot mount a tmpfs on /dev/shm"
    exit 77
  fi
  head -c $((31 * 1024 * 1024)) /dev/zero > /dev/shm/filler
  df -B1 /dev/shm | tail -1
  run() {
    timeout 60 "$build/tools/dopt-run" --nproc-per-node 2 "$build/tools/dopt-train" --steps 20 \
      --quiet > /tmp/shm_full.$$.out 2>&1
    rc=$?
    cat /tmp/shm_full.$$.out
    out=$(cat /tmp/shm_full.$$.out)
    rm -f /tmp/shm_full.$$.out
  }
  fail() { echo "FAIL: $*"; exit 1; }
  run
  echo "exit status: $rc"
  [ "$rc" = 1 ] || fail "the job must exit 1 (not $rc; 135 is SIGBUS)"
  grep -q "killed by signal 7 (SIGBUS)" <<<"$out" && fail "a rank died of SIGBUS"
  grep -Eq "\[rank [01]\] .*shm \[rank [01]\]: cannot reserve [0-9]+ bytes of /dev/shm for /dopt-[^ ]+: only [0-9]+ bytes are free there \(No space left on device\)" <<<"$out" \
    || fail "no error naming /dev/shm, the bytes needed and free on the rank that hit it"
  grep -q "or move the job off shared memory with DOPT_TRANSPORT=tcp on every rank" <<<"$out" \
    || fail "the error does not name DOPT_TRANSPORT=tcp"
  export DOPT_TRANSPORT=tcp
  run
  echo "exit status with DOPT_TRANSPORT=tcp: $rc"
  [ "$rc" = 0 ] || fail "with DOPT_TRANSPORT=tcp the job must run (exit $rc)"
  grep -q "dopt-train: 20 steps in" <<<"$out" || fail "no report of 20 steps"
  echo "ok"
' "$build"
