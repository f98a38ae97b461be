#!/usr/bin/env bash
# Runs a test peer as HOSTS "hosts" of PER_HOST ranks on this machine (each
# host a DOPT_HOST_ID of its own, so the ranks meet on the hierarchical plane:
# shared memory within a host, the TCP mesh between hosts) and requires every
# rank to exit 0 having run on that plane.
#   tests/as_hosts.sh HOSTS PER_HOST PEER ARGS...
set -u
hosts=$1 per=$2 peer=$3
shift 3
n=$((hosts * per))
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    DOPT_HOST_ID=host$((r / per)) DOPT_TIMEOUT_MS=${DOPT_TIMEOUT_MS:-60000} DOPT_DEBUG=1 \
    "$peer" "$@" >"$dir/$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((r = 0; r < n; r++)); do
  if ! wait "${pids[$r]}"; then rc=1; fi
  grep -q "runs on the hier plane" "$dir/$r.log" || { echo "rank $r did not run on the hier plane"; rc=1; }
  grep -q "^ok $r " "$dir/$r.log" || rc=1
  echo "--- rank $r:"
  tail -n 3 "$dir/$r.log"
done
rm -rf "$dir"
exit $rc
