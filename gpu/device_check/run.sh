#!/usr/bin/env bash
# The device check, on a bare GPU machine (docs/gpu.md, "The device check"):
# nothing is built or installed there. It unpacks the payload that
# gpu/device_check/prepare.sh made here (.device-check/, carried with the
# working tree), finds NCCL on the machine (torch's wheel, or beside the
# toolkit), then, each step time-limited so that the whole run stays within
# CHECK_BUDGET_S (default 420 s):
#   1. the machine: nvidia-smi, nvcc, torch, NCCL,
#   2. the GPU tests (dopt_gpu_tests, every [gpu] and host test; those that
#      abort a communicator last, in a process of their own),
#   3. the GPU example (ZeRO(Adam) on CUDA against the CPU run, bitwise),
#   4. the benchmarks: fused Adam and SGD at 10M and 100M parameters, the
#      device copy bandwidth, a bitwise check of the benchmarked steps
#      against the CPU optimizer (dopt_bench_gpu_optim),
#   5. torch's fused and foreach Adam and SGD on the same GPU, same sizes,
#      with the python3 that imports torch (bench/compare_gpu_optim_torch.py),
#   6. a summary with the table for docs/performance.md.
# Results: $OUT/summary.txt, $OUT/gpu_tests.log and $OUT/results.tar.gz (every
# log and JSON file): three files, within what the device runner returns.
# Exit status: 0 when the GPU tests and the example passed, 1 otherwise.
#
# Usage (repository root):  bash gpu/device_check/run.sh
# Env: OUT (results folder; default /tmp/dopt-device-check), CHECK_BUDGET_S,
#      DOPT_DEVICE_CHECK_DIR (payload folder; default .device-check), SIZES, PYTHON.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PAYLOAD_DIR="${DOPT_DEVICE_CHECK_DIR:-$ROOT/.device-check}"
OUT="${OUT:-/tmp/dopt-device-check}"
BUDGET="${CHECK_BUDGET_S:-420}"
SIZES="${SIZES:-10000000,100000000}"
RES="$(mktemp -d /tmp/dopt-check-results.XXXXXX)"
WORK="$(mktemp -d /tmp/dopt-check-payload.XXXXXX)"
mkdir -p "$OUT"
STATUS="$RES/status.txt"
: >"$STATUS"
SECONDS=0
overall=0

say() { echo "== [$(printf '%3d' "$SECONDS")s] $*"; }
note() { echo "$1: $2" >>"$STATUS"; say "$1: $2"; }
# Runs "$@" for at most min(limit, what is left of the budget) seconds.
limited() {
  local limit="$1"; shift
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 5 ]; then echo "budget exhausted before: $*" >&2; return 124; fi
  [ "$limit" -gt "$left" ] && limit="$left"
  timeout --kill-after=5 "$limit" "$@"
}
finish() {
  say "summary"
  if [ -n "${PY:-}" ]; then
    "$PY" "$ROOT/gpu/device_check/summarize.py" "$RES" >"$RES/summary.txt" 2>&1 || cat "$STATUS" >>"$RES/summary.txt"
  else
    python3 "$ROOT/gpu/device_check/summarize.py" "$RES" >"$RES/summary.txt" 2>&1 || cp "$STATUS" "$RES/summary.txt"
  fi
  echo "check: done in ${SECONDS}s (budget ${BUDGET}s), exit $overall" >>"$RES/summary.txt"
  cat "$RES/summary.txt"
  cp "$RES/summary.txt" "$OUT/summary.txt"
  [ -f "$RES/gpu_tests.log" ] && cp "$RES/gpu_tests.log" "$OUT/gpu_tests.log"
  tar -C "$RES" -czf "$OUT/results.tar.gz" .
  rm -rf "$WORK"
  exit "$overall"
}

say "payload"
if [ ! -f "$PAYLOAD_DIR/payload.tar.gz" ]; then
  note payload "MISSING: $PAYLOAD_DIR/payload.tar.gz (run gpu/device_check/prepare.sh on the build machine and carry .device-check)"
  overall=1; finish
fi
tar -C "$WORK" -xzf "$PAYLOAD_DIR/payload.tar.gz"
cp "$WORK/manifest.txt" "$RES/manifest.txt"
note payload "$(head -1 "$WORK/manifest.txt")"

# The python3 that imports torch (the plain python3 on the GPU image).
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c "import torch" >/dev/null 2>&1; then PY="$(command -v "$c")"; break; fi
  done
fi
[ -z "$PY" ] && command -v python3 >/dev/null 2>&1 && PY="$(command -v python3)"

# NCCL: torch's wheel (nvidia-nccl-cu13: nvidia/nccl/lib), else beside the toolkit, else anywhere.
NCCL_DIR=""
if [ -n "$PY" ]; then
  d="$("$PY" -c 'import os, nvidia.nccl as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)"
  [ -n "$d" ] && [ -e "$d/libnccl.so.2" ] && NCCL_DIR="$d"
fi
if [ -z "$NCCL_DIR" ] && [ -n "$PY" ]; then  # another wheel layout (nvidia/cu13/lib, ...)
  for sp in $("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    f="$(timeout 20 find "$sp/nvidia" "$sp/torch/lib" -name 'libnccl.so.2' 2>/dev/null | head -1)"
    [ -n "$f" ] && { NCCL_DIR="$(dirname "$f")"; break; }
  done
fi
if [ -z "$NCCL_DIR" ]; then
  for d in /usr/local/cuda/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libnccl.so.2" ] && { NCCL_DIR="$d"; break; }
  done
fi
if [ -z "$NCCL_DIR" ]; then
  f="$(timeout 30 find / -xdev -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)"
  [ -n "$f" ] && NCCL_DIR="$(dirname "$f")"
fi
export LD_LIBRARY_PATH="$WORK/lib${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The machine's libstdc++ may be older than the build machine's: then use the packed one.
if ldd "$WORK/bin/dopt_gpu_tests" 2>&1 | grep -q -E "not found|version .* not found"; then
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$WORK/lib/fallback"
  echo "using the packed libstdc++/libgcc_s" >>"$RES/machine.txt"
fi
ldd "$WORK/bin/dopt_gpu_tests" >"$RES/ldd.txt" 2>&1
if grep -q "not found" "$RES/ldd.txt"; then
  note libraries "MISSING: $(grep 'not found' "$RES/ldd.txt" | tr -s ' \t' ' ' | tr '\n' ';')"
  overall=1; finish
fi
note nccl "${NCCL_DIR:-not found}"

say "machine"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  (nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 || echo "nvidia-smi failed")
  (nvcc --version 2>/dev/null | tail -1 || echo "no nvcc")
  echo "python: ${PY:-none}"
  [ -n "$PY" ] && "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")' 2>&1
  echo "nccl dir: ${NCCL_DIR:-none}"
  uname -a
  (. /etc/os-release 2>/dev/null; echo "os: ${PRETTY_NAME:-?}")
} >>"$RES/machine.txt" 2>&1
cat "$RES/machine.txt"

say "GPU tests (dopt_gpu_tests)"
# The tests that abort a communicator run last, in a process of their own: if
# an abort ever broke the CUDA context, it would not take the others with it.
limited 210 "$WORK/bin/dopt_gpu_tests" -d yes "~[abort]" >"$RES/gpu_tests.log" 2>&1
rc=$?
echo "==== [abort] tests, in their own process" >>"$RES/gpu_tests.log"
limited 60 "$WORK/bin/dopt_gpu_tests" -d yes "[abort]" >>"$RES/gpu_tests.log" 2>&1
rc2=$?
[ "$rc" -eq 0 ] && rc=$rc2
skipped=$(grep -c "skipped: no CUDA device" "$RES/gpu_tests.log" || true)
summary="$(grep -E "^(All tests passed|test cases:)" "$RES/gpu_tests.log" | tr '\n' ' ')"
if [ "$rc" -eq 0 ] && [ "$skipped" -eq 0 ]; then note gpu_tests "passed ($summary)"
elif [ "$rc" -eq 0 ]; then note gpu_tests "NOT RUN: $skipped skipped, no CUDA device ($summary)"; overall=1
else
  note gpu_tests "FAILED rc=$rc ($summary; see gpu_tests.log)"; overall=1
  grep -B3 -A12 "FAILED:" "$RES/gpu_tests.log" | head -60
fi

say "GPU example (dopt-example-gpu)"
limited 90 "$WORK/bin/dopt-example-gpu" >"$RES/example.log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then note example "passed: $(tail -1 "$RES/example.log")"
elif [ "$rc" -eq 77 ]; then note example "NOT RUN: no CUDA device"; overall=1
else note example "FAILED rc=$rc: $(tail -2 "$RES/example.log" | tr '\n' ' ')"; overall=1; fi

say "dopt benchmarks"
limited 120 "$WORK/bin/dopt_bench_gpu_optim" --sizes "$SIZES" >"$RES/dopt_bench.jsonl" 2>"$RES/dopt_bench.err"
rc=$?
[ "$rc" -eq 0 ] && note dopt_bench ok || note dopt_bench "FAILED rc=$rc (see dopt_bench.err)"
cat "$RES/dopt_bench.jsonl"

say "torch on the same GPU"
if [ -n "$PY" ]; then
  PYTHONUNBUFFERED=1 limited 150 "$PY" "$ROOT/bench/compare_gpu_optim_torch.py" --sizes "$SIZES" \
    >"$RES/torch_bench.jsonl" 2>"$RES/torch_bench.err"
  rc=$?
  [ "$rc" -eq 0 ] && note torch_bench ok || note torch_bench "FAILED rc=$rc (see torch_bench.err)"
else
  echo '{"bench": "torch", "skipped": "torch CUDA not available: no python3"}' >"$RES/torch_bench.jsonl"
  note torch_bench "no python3"
fi
cat "$RES/torch_bench.jsonl"
finish
