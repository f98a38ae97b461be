# CTest cannot run a Catch test whose name holds ';' (catch_discover_tests
# splits it into two entries that match nothing, and they pass without
# running): no test name may hold one.
if(TARGET dopt_tests AND TARGET dopt_unit_tests)
  set(_catch_binaries $<TARGET_FILE:dopt_tests> $<TARGET_FILE:dopt_unit_tests>)
  foreach(_t dopt_gpu_tests)  # (dopt_libtorch_tests runs as one CTest test, names unsplit)
    if(TARGET ${_t})
      list(APPEND _catch_binaries $<TARGET_FILE:${_t}>)
    endif()
  endforeach()
  add_test(NAME "lint: no Catch test name holds a ';' (CTest would skip the test silently)"
           COMMAND sh -c "for b in \"$@\"; do \"$b\" --list-test-names-only; done | grep -n ';' && exit 1 || exit 0"
                   sh ${_catch_binaries})
  set_tests_properties("lint: no Catch test name holds a ';' (CTest would skip the test silently)"
                       PROPERTIES LABELS lint TIMEOUT 60)
endif()
