# The device check's preparation (gpu/device_check/prepare.sh), checked on
# every CUDA-on build without a GPU: the payload is made from this build's
# binaries, it and the working tree fit the 64 MiB that travels to a GPU
# machine, the binaries resolve their libraries from it and start; then
# run.sh runs from that payload as it would on a GPU machine and, finding no
# device, reports the GPU tests as not run and still writes its three result
# files. (The real preparation builds for sm_90 in its own folder, which takes
# minutes: developers run it before a GPU session, docs/gpu.md.)
# (The bench and example targets are defined after tests/, hence the options.)
if(TARGET dopt_gpu_tests AND DOPT_ENABLE_BENCH AND DOPT_ENABLE_EXAMPLES)
  set(_dc_out ${PROJECT_BINARY_DIR}/device-check-test)
  add_test(NAME "gpu-prep: payload made from this build, under 64 MiB, libraries resolved"
           COMMAND bash ${PROJECT_SOURCE_DIR}/gpu/device_check/prepare.sh --check
                   --build-dir ${PROJECT_BINARY_DIR} --out ${_dc_out}/payload)
  set_tests_properties("gpu-prep: payload made from this build, under 64 MiB, libraries resolved" PROPERTIES
                       LABELS gpu-prep FIXTURES_SETUP dopt_device_check_payload TIMEOUT 300)
  add_test(NAME "gpu-prep: run.sh from the payload without a GPU reports the tests not run"
           COMMAND bash -c "rm -rf \"$1\" && DOPT_DEVICE_CHECK_DIR=\"$2\" OUT=\"$1\" SIZES=100000 CHECK_BUDGET_S=240 \
bash \"$3\"; rc=$?; test $rc -eq 1 && test -s \"$1/summary.txt\" && test -s \"$1/gpu_tests.log\" && \
test -s \"$1/results.tar.gz\" && grep -q 'gpu_tests: NOT RUN' \"$1/summary.txt\" && \
grep -q 'libraries\\|nccl:' \"$1/summary.txt\" && ! grep -q 'payload: MISSING' \"$1/summary.txt\""
                   _ ${_dc_out}/out ${_dc_out}/payload ${PROJECT_SOURCE_DIR}/gpu/device_check/run.sh)
  set_tests_properties("gpu-prep: run.sh from the payload without a GPU reports the tests not run" PROPERTIES
                       LABELS gpu-prep FIXTURES_REQUIRED dopt_device_check_payload TIMEOUT 300)
endif()
