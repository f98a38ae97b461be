#!/usr/bin/env bash
# The prepared device check of gpu/ (issue 8), for a machine with a GPU:
#   1. builds dopt with CUDA for sm_90 (dopt_unit_tests, dopt_bench_gpu_optim; -j16),
#   2. runs the GPU tests ([gpu]: fused kernels vs the CPU path, stream ordering,
#      NCCL) and then every unit test (ctest -L unit),
#   3. runs the GPU benchmarks: fused Adam and SGD at 10M and 100M parameters,
#      the device copy bandwidth, NCCL all_reduce with one rank per GPU (two or
#      more GPUs), and torch's fused/foreach Adam and SGD on the same GPU in the
#      same run (or "torch CUDA not available"),
#   4. prints a short table.
# Every step has a time limit so that the whole check ends within 8 minutes
# (CHECK_BUDGET_S, default 470 s). Results (logs, JSON lines) go to $OUT when
# set (the device runner's output folder), else to <build>/check-out.
# Exit status: 0 when the build and the GPU tests passed (benchmarks are
# reported, not judged), 1 otherwise. Without a GPU it builds, reports the
# tests skipped and "no CUDA device", and exits 0.
#
# Usage: gpu/check.sh [build-dir]      (default: build-gpu-check beside gpu/)
# Env:   CHECK_BUDGET_S, JOBS (16), CUDA_ARCH (90), PYTHON (torch's python), SIZES (10000000,100000000)
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-$ROOT/build-gpu-check}"
RESULTS="${OUT:-$BUILD/check-out}"
BUDGET="${CHECK_BUDGET_S:-470}"
JOBS="${JOBS:-16}"
ARCH="${CUDA_ARCH:-90}"
SIZES="${SIZES:-10000000,100000000}"
mkdir -p "$RESULTS"
STATUS_FILE="$RESULTS/status.txt"
: >"$STATUS_FILE"
SECONDS=0
overall=0

say() { echo "== [$(printf '%3d' "$SECONDS")s] $*"; }
note() { echo "$1: $2" >>"$STATUS_FILE"; say "$1: $2"; }
# Runs "$@" with at most min(limit, what is left of the budget) seconds.
limited() {
  local limit="$1"; shift
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 5 ]; then echo "budget exhausted before: $*" >&2; return 124; fi
  [ "$limit" -gt "$left" ] && limit="$left"
  timeout --kill-after=5 "$limit" "$@"
}

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in /usr/bin/python3 python3; do command -v "$c" >/dev/null 2>&1 && { PY="$c"; break; }; done
fi

say "machine"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$RESULTS/gpus.txt"
else
  echo "nvidia-smi not found" | tee "$RESULTS/gpus.txt"
fi

NVCC="${CUDACXX:-}"
[ -z "$NVCC" ] && for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-13.0/bin/nvcc; do [ -x "$c" ] && { NVCC="$c"; break; }; done
[ -z "$NVCC" ] && NVCC="$(command -v nvcc || true)"

say "configure ($BUILD, sm_$ARCH, nvcc ${NVCC:-not found})"
if limited 90 cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_CUDA=ON \
    ${NVCC:+-DCMAKE_CUDA_COMPILER="$NVCC"} -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DDOPT_ENABLE_BENCH=ON -DDOPT_ENABLE_EXAMPLES=OFF -DDOPT_ENABLE_TESTS=ON >"$RESULTS/configure.log" 2>&1; then
  note configure ok
else
  note configure "FAILED (see configure.log)"; tail -30 "$RESULTS/configure.log"; exit 1
fi

say "build (-j$JOBS)"
if limited 300 cmake --build "$BUILD" -j"$JOBS" --target dopt_unit_tests dopt_bench_gpu_optim >"$RESULTS/build.log" 2>&1; then
  note build ok
else
  note build "FAILED (see build.log)"; grep -E "error|Error" "$RESULTS/build.log" | head -30; exit 1
fi
UNIT="$(find "$BUILD" -name dopt_unit_tests -type f -perm -u+x | head -1)"
BENCH="$(find "$BUILD" -name dopt_bench_gpu_optim -type f -perm -u+x | head -1)"

say "GPU tests ([gpu])"
limited 180 "$UNIT" "[gpu]" -d yes >"$RESULTS/gpu_tests.log" 2>&1
rc=$?
tail -4 "$RESULTS/gpu_tests.log"
skipped=$(grep -c "skipped: no CUDA device" "$RESULTS/gpu_tests.log" || true)
summary="$(grep -E "^(All tests passed|test cases:)" "$RESULTS/gpu_tests.log" | tail -1)"
if [ "$rc" -eq 0 ]; then
  if [ "$skipped" -gt 0 ]; then note gpu_tests "$skipped skipped: no CUDA device (host-side ones ran: $summary)"; else note gpu_tests "passed ($summary)"; fi
else
  note gpu_tests "FAILED rc=$rc ($summary; see gpu_tests.log)"; overall=1
  grep -B3 -A12 "FAILED:" "$RESULTS/gpu_tests.log" | head -80
fi

say "all unit tests (ctest -L unit)"
(cd "$BUILD" && limited 150 ctest -L unit -j"$(( JOBS > 8 ? 8 : JOBS ))" --timeout 120 >"$RESULTS/ctest_unit.log" 2>&1)
rc=$?
line="$(grep -E "tests passed" "$RESULTS/ctest_unit.log" | tail -1)"
nskip=$(grep -c "(Skipped)" "$RESULTS/ctest_unit.log" || true)
if [ "$rc" -eq 0 ]; then note unit_tests "$line, $nskip skipped"; else note unit_tests "FAILED rc=$rc: $line"; overall=1; grep -E "\*\*\*Failed|Timeout" "$RESULTS/ctest_unit.log" | head -20; fi

say "dopt GPU benchmarks"
limited 150 "$BENCH" --sizes "$SIZES" >"$RESULTS/dopt_gpu_bench.jsonl" 2>"$RESULTS/dopt_gpu_bench.err"
rc=$?
[ "$rc" -eq 0 ] && note dopt_bench ok || note dopt_bench "FAILED rc=$rc (see dopt_gpu_bench.err)"
cat "$RESULTS/dopt_gpu_bench.jsonl"

say "torch on the same GPU"
if [ -n "$PY" ]; then
  limited 150 "$PY" "$ROOT/bench/compare_gpu_optim_torch.py" --sizes "$SIZES" >"$RESULTS/torch_gpu_bench.jsonl" 2>"$RESULTS/torch_gpu_bench.err"
  rc=$?
  [ "$rc" -eq 0 ] && note torch_bench ok || note torch_bench "FAILED rc=$rc (see torch_gpu_bench.err)"
else
  echo '{"bench": "torch", "skipped": "torch CUDA not available: no python3"}' >"$RESULTS/torch_gpu_bench.jsonl"
  note torch_bench "no python3"
fi
cat "$RESULTS/torch_gpu_bench.jsonl"

say "summary"
if [ -n "$PY" ]; then
  "$PY" - "$RESULTS" <<'PYEOF'
import json, os, sys
d = sys.argv[1]
def rows(name):
    p = os.path.join(d, name)
    out = []
    if os.path.exists(p):
        for line in open(p):
            line = line.strip()
            if line.startswith("{"):
                try: out.append(json.loads(line))
                except ValueError: pass
    return out
dopt, torch = rows("dopt_gpu_bench.jsonl"), rows("torch_gpu_bench.jsonl")
print(open(os.path.join(d, "status.txt")).read().rstrip())
print()
if any(r.get("bench") == "none" for r in dopt):
    print("dopt benchmarks: no CUDA device")
steps = [r for r in dopt if r.get("bench") == "fused_step"]
tsteps = {(r["optimizer"], r["params"], r["impl"]): r for r in torch if r.get("bench") == "torch_step" and "ms_per_step" in r}
tskip = [r["skipped"] for r in torch if r.get("bench") == "torch"]
if steps:
    print(f"{'step':<6} {'params':>11} {'dopt ms':>9} {'dopt GB/s':>10} {'torch fused ms':>15} {'torch foreach ms':>17}")
    for r in steps:
        f = tsteps.get((r["optimizer"], r["params"], "fused"))
        e = tsteps.get((r["optimizer"], r["params"], "foreach"))
        fs = f"{f['ms_per_step']:.3f}" if f else "-"
        es = f"{e['ms_per_step']:.3f}" if e else "-"
        print(f"{r['optimizer']:<6} {r['params']:>11} {r['ms_per_step']:>9.3f} {r['gb_per_s']:>10.1f} {fs:>15} {es:>17}")
for s in tskip:
    print("torch:", s)
for r in dopt:
    if r.get("bench") == "fused_step_streams":
        print(f"Adam {r['params']} params as two halves on {r['streams']} stream(s): {r['ms_per_step']:.3f} ms per step")
    if r.get("bench") == "copy":
        print(f"copy {r['method']:<20} {r['bytes'] / 2**30:.0f} GiB: {r['gb_per_s']:.1f} GB/s (read + write)")
    if r.get("bench") == "nccl_all_reduce":
        if "skipped" in r: print("nccl all_reduce:", r["skipped"])
        else: print(f"nccl all_reduce {r['ranks']} ranks {r['bytes'] >> 20} MiB: {r['ms']:.3f} ms, "
                    f"algbw {r['algbw_gb_per_s']:.1f} GB/s, busbw {r['busbw_gb_per_s']:.1f} GB/s")
PYEOF
else
  cat "$STATUS_FILE"
fi
say "done in ${SECONDS}s (budget ${BUDGET}s), exit $overall"
exit "$overall"
