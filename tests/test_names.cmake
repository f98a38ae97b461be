# CTest cannot run a Catch test whose name holds ';' (catch_discover_tests
# splits it into two entries that match nothing, and they pass without
# running): no test name may hold one.
if(TARGET dopt_tests AND TARGET dopt_unit_tests)
  add_test(NAME "lint: no Catch test name holds a ';' (CTest would skip the test silently)"
           COMMAND sh -c "! { \"$1\" --list-test-names-only; \"$2\" --list-test-names-only; } | grep -n ';'"
                   sh $<TARGET_FILE:dopt_tests> $<TARGET_FILE:dopt_unit_tests>)
  set_tests_properties("lint: no Catch test name holds a ';' (CTest would skip the test silently)"
                       PROPERTIES LABELS lint TIMEOUT 60)
endif()
