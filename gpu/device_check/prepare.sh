#!/usr/bin/env bash
# Prepares the device check for a bare GPU machine (docs/gpu.md, "The device
# check"): builds the GPU test, benchmark and example binaries HERE (for
# sm_90, CUDA on), and packs them with the shared libraries they load that a
# bare image lacks (CAF, the CUDA runtime; libstdc++/libgcc_s as a fallback)
# into one archive in an ignored folder, which travels with the working tree.
# NCCL is not packed (200 MB): run.sh uses the NCCL of the GPU machine
# (torch's wheel, nvidia/nccl/lib/libnccl.so.2, or one beside its toolkit).
#
# Usage: gpu/device_check/prepare.sh [--build-dir DIR] [--out DIR] [--no-build] [--check] [--arch N]
#   --build-dir DIR  the CUDA-on build to use or make (default: build-device-check)
#   --out DIR        where the payload goes (default: .device-check, ignored by git)
#   --no-build       use the binaries already in --build-dir (any CUDA architecture)
#   --check          only the checks that run here: the payload is made, it and
#                    the working tree fit the 64 MiB that travels, every binary
#                    resolves its libraries from the payload (libcuda and libnccl
#                    come from the GPU machine) and starts (lists its tests).
#                    Implies --no-build; the CTest "gpu-prep" runs this.
#   --arch N         CUDA architecture to build for (default 90: H100/H200)
# Exit status 0 when the payload is ready and every check passed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-device-check"
OUTDIR="$ROOT/.device-check"
BUILD_IT=1
ARCH=90
LIMIT=$((64 * 1024 * 1024))
while (($#)); do
  case "$1" in
    --build-dir) BUILD="$(cd "$2" 2>/dev/null && pwd || echo "$2")"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    --no-build) BUILD_IT=0; shift ;;
    --check) BUILD_IT=0; shift ;;
    --arch) ARCH="$2"; shift 2 ;;
    *) echo "prepare.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BINS=(tests/dopt_gpu_tests bench/dopt_bench_gpu_optim examples/gpu/dopt-example-gpu)
TARGETS=(dopt_gpu_tests dopt_bench_gpu_optim dopt-example-gpu)
say() { echo "prepare: $*"; }
fail() { echo "prepare: FAILED: $*" >&2; exit 1; }

if ((BUILD_IT)); then
  NVCC="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  [[ -x "$NVCC" ]] || NVCC="$(command -v nvcc || true)"
  [[ -n "$NVCC" ]] || fail "no nvcc (set CUDACXX)"
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  generator=()
  if command -v ninja >/dev/null && [[ ! -f "$BUILD/CMakeCache.txt" ]]; then generator=(-G Ninja); fi
  say "configuring $BUILD (CUDA on, sm_$ARCH)"
  cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDOPT_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DDOPT_ENABLE_TESTS=ON \
    -DDOPT_ENABLE_BENCH=ON -DDOPT_ENABLE_EXAMPLES=ON "${launcher[@]}" >/dev/null
  say "building ${TARGETS[*]} (-j${JOBS:-2})"
  cmake --build "$BUILD" -j"${JOBS:-2}" --target "${TARGETS[@]}"
fi

for b in "${BINS[@]}"; do [[ -x "$BUILD/$b" ]] || fail "$BUILD/$b is missing: build ${TARGETS[*]} first"; done

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib/fallback"
for b in "${BINS[@]}"; do
  cp "$BUILD/$b" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$(basename "$b")" 2>/dev/null || true
done
# The libraries the binaries load, except the C library, the driver and NCCL.
# libstdc++ and libgcc_s go to lib/fallback: run.sh adds them only when the
# machine's own are older than what the binaries need.
mapfile -t libs < <(for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1 " " $3}' | sort -u)
for entry in "${libs[@]}"; do
  name="${entry%% *}"
  path="${entry#* }"
  case "$name" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*|libnccl.so.*) ;;
    libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$STAGE/lib/fallback/$name" ;;
    *) cp -L "$path" "$STAGE/lib/$name" ;;
  esac
done
commit="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -1)"
{
  echo "commit: $commit${dirty:+ (with uncommitted changes)}"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
  echo "build dir: $BUILD"
  echo "cuda architectures: $(grep -E '^CMAKE_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2)"
  echo "nvcc: $(grep -E '^CMAKE_CUDA_COMPILER:' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2)"
  echo "binaries: ${BINS[*]##*/}"
  echo "libraries: $(cd "$STAGE/lib" && ls -1 | grep -v fallback | tr '\n' ' ')"
  echo "fallback: $(cd "$STAGE/lib/fallback" && ls -1 | tr '\n' ' ')"
} >"$STAGE/manifest.txt"

mkdir -p "$OUTDIR"
rm -f "$OUTDIR/payload.tar.gz" "$OUTDIR/manifest.txt"
tar -C "$STAGE" -czf "$OUTDIR/payload.tar.gz" bin lib manifest.txt
cp "$STAGE/manifest.txt" "$OUTDIR/manifest.txt"
payload=$(du -cb "$OUTDIR"/* | tail -1 | cut -f1)
# What travels: tracked files, untracked files git does not ignore, and the payload.
tree=$(cd "$ROOT" && { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 -r du -cb 2>/dev/null |
       awk '$2 == "total" {s += $1} END {print s + 0}')
total=$((payload + tree))
say "payload $OUTDIR: $((payload / 1024)) KiB; working tree $((tree / 1024)) KiB; together $((total / 1024)) KiB of $((LIMIT / 1024)) KiB"
((total < LIMIT)) || fail "the working tree and the payload exceed 64 MiB"

# The binaries resolve every library from the payload, except the driver and
# NCCL, which the GPU machine has. Their RUNPATH (the toolkit here) is not
# trusted: LD_LIBRARY_PATH comes first, as in run.sh.
CHECK="$(mktemp -d)"
trap 'rm -rf "$STAGE" "$CHECK"' EXIT
tar -C "$CHECK" -xzf "$OUTDIR/payload.tar.gz"
for b in "$CHECK"/bin/*; do
  missing=$(LD_LIBRARY_PATH="$CHECK/lib" ldd "$b" | awk '/not found/ {print $1}' | grep -v -E '^(libcuda|libnccl)\.so' || true)
  [[ -z "$missing" ]] || fail "$(basename "$b") needs libraries that are not packed: $missing"
  for lib in $(LD_LIBRARY_PATH="$CHECK/lib" ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1 "=" $3}'); do
    name="${lib%%=*}"
    if [[ -e "$CHECK/lib/$name" && "${lib#*=}" != "$CHECK/lib/$name" ]]; then
      fail "$(basename "$b") loads $name from ${lib#*=}, not from the payload"
    fi
  done
done
# (Catch2 2's --list-test-names-only exits with the number of tests.)
LD_LIBRARY_PATH="$CHECK/lib" "$CHECK/bin/dopt_gpu_tests" --list-test-names-only >"$CHECK/list.txt" 2>&1 || true
n=$(grep -c . "$CHECK/list.txt" || true)
((n > 0)) || fail "dopt_gpu_tests lists no tests"
say "ok: $(cd "$CHECK/bin" && ls | tr '\n' ' ')start and resolve their libraries from the payload; dopt_gpu_tests lists $n tests"
say "next: on the GPU machine, in the repository root: bash gpu/device_check/run.sh (with $OUTDIR carried)"
