#!/bin/sh
# One conformance test: replay a case with dopt-replay, then check the output
# with the case set's checker.
#   run_conformance.sh DOPT_REPLAY PYTHON3 CHECK_REPLAY_PY CASE_DIR OUT.safetensors [CHECK_BITWISE_PY]
# With CHECK_BITWISE_PY, the output must also be byte-identical to torch's.
set -eu
if [ "$#" -ne 5 ] && [ "$#" -ne 6 ]; then
  echo "usage: $0 DOPT_REPLAY PYTHON3 CHECK_REPLAY_PY CASE_DIR OUT.safetensors [CHECK_BITWISE_PY]" >&2
  exit 2
fi
replay=$1 python=$2 checker=$3 case_dir=$4 out=$5 bitwise=${6:-}
mkdir -p "$(dirname "$out")"
rm -f "$out"
"$replay" "$case_dir" --out "$out"
"$python" "$checker" --quiet "$case_dir" "$out"
if [ -n "$bitwise" ]; then
  exec "$python" "$bitwise" "$case_dir" "$out"
fi
