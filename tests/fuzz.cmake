# The fuzz targets (fuzz/, scripts/fuzz.sh): "fuzz: build" compiles them with
# clang's libFuzzer in BUILD/fuzz (a project of its own), then each target
# runs for DOPT_FUZZ_SECONDS (default 30) on its seeded corpus. Label "fuzz":
# about 3 min to build and 3 min to run on 2 cores (ctest -L fuzz -j2).
# Without clang or libFuzzer every test reports itself skipped with the
# reason.
set(DOPT_FUZZ_SECONDS 30 CACHE STRING "Seconds each fuzz target runs under CTest (label fuzz)")
set(_fz "${PROJECT_SOURCE_DIR}/scripts/fuzz.sh")
set(_fzdir "${PROJECT_BINARY_DIR}/fuzz")
add_test(NAME "fuzz: build the targets with libFuzzer" COMMAND ${_fz} build ${_fzdir})
set_tests_properties("fuzz: build the targets with libFuzzer" PROPERTIES
  LABELS fuzz TIMEOUT 900 SKIP_RETURN_CODE 77 FIXTURES_SETUP dopt_fuzz_build)
foreach(_t handshake tcp_frames basp_frames rpc_decode safetensors state_dict)
  add_test(NAME "fuzz: ${_t}" COMMAND ${_fz} run ${_fzdir} ${_t} ${DOPT_FUZZ_SECONDS})
  set_tests_properties("fuzz: ${_t}" PROPERTIES
    LABELS fuzz TIMEOUT 300 SKIP_RETURN_CODE 77 FIXTURES_REQUIRED dopt_fuzz_build)
endforeach()
