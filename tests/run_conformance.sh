#!/bin/sh
# One conformance test: replay a case with dopt-replay, then check the output
# with the case set's checker.
#   run_conformance.sh DOPT_REPLAY PYTHON3 CHECK_REPLAY_PY CASE_DIR OUT.safetensors
set -eu
if [ "$#" -ne 5 ]; then
  echo "usage: $0 DOPT_REPLAY PYTHON3 CHECK_REPLAY_PY CASE_DIR OUT.safetensors" >&2
  exit 2
fi
replay=$1 python=$2 checker=$3 case_dir=$4 out=$5
mkdir -p "$(dirname "$out")"
rm -f "$out"
"$replay" "$case_dir" --out "$out"
exec "$python" "$checker" --quiet "$case_dir" "$out"
