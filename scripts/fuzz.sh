#!/usr/bin/env bash
# The fuzz targets of fuzz/ (libFuzzer with Debian's clang; docs/testing.md,
# "Fuzzing"):
#   scripts/fuzz.sh build BUILD_DIR            configure and build them (clang++)
#   scripts/fuzz.sh run BUILD_DIR TARGET [S]   run TARGET for S seconds (default
#                                              $DOPT_FUZZ_SECONDS, else 30) on
#                                              fuzz/corpus/TARGET plus what earlier
#                                              runs found (BUILD_DIR/corpus/TARGET)
#   scripts/fuzz.sh seeds BUILD_DIR            rewrite fuzz/corpus/ with make_seeds
# Exit 77 (CTest: skipped) with the reason when clang or libFuzzer is missing.
# A crash or a sanitizer report fails the run; the input is kept in
# BUILD_DIR/crashes/ and the command that reproduces it is printed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cmd=${1:-}
build=${2:-}
[[ -n "$cmd" && -n "$build" ]] || { echo "usage: scripts/fuzz.sh build|run|seeds BUILD_DIR [TARGET [SECONDS]]"; exit 2; }
cxx=${DOPT_FUZZ_CXX:-clang++}

case "$cmd" in
  build)
    if ! command -v "$cxx" >/dev/null; then
      echo "skipped: no $cxx (Debian: apt-get install clang libclang-rt-14-dev)"
      exit 77
    fi
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe/p.cpp"
    if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>"$probe/err"; then
      echo "skipped: $cxx cannot link -fsanitize=fuzzer,address,undefined (Debian: apt-get install libclang-rt-14-dev):"
      head -3 "$probe/err"
      exit 77
    fi
    cmake -S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" -j"${DOPT_JOBS:-2}"
    ;;
  run)
    target=${3:?target}
    secs=${4:-${DOPT_FUZZ_SECONDS:-30}}
    exe="$build/fuzz_$target"
    [[ -x "$exe" ]] || { echo "skipped: $exe is not built (scripts/fuzz.sh build $build)"; exit 77; }
    mkdir -p "$build/corpus/$target" "$build/crashes"
    # New inputs go to the build's corpus; the seeds in the repository stay as they are.
    set +e
    "$exe" "$build/corpus/$target" "$root/fuzz/corpus/$target" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$build/crashes/$target-" 2>"$build/$target.log"
    rc=$?
    set -e
    grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)" "$build/$target.log" || true
    if [[ $rc != 0 ]]; then
      tail -40 "$build/$target.log"
      echo "FAIL: fuzz_$target found a crash: $(ls -t "$build"/crashes/"$target"-* 2>/dev/null | head -1)"
      echo "reproduce: $exe CRASH_FILE; then add the input to a regression test"
      exit 1
    fi
    ;;
  seeds)
    rm -rf "$root/fuzz/corpus"
    "$build/make_seeds" "$root/fuzz/corpus"
    ;;
  *)
    echo "usage: scripts/fuzz.sh build|run|seeds BUILD_DIR [TARGET [SECONDS]]"
    exit 2
    ;;
esac
