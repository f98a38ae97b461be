# dopt-run's integration tests (tests/launcher.test.cpp, tag [launch]) run the
# launcher binary, so dopt_tests depends on it; each gets the extra label
# "launch" and a 60 s TIMEOUT, the backstop for a launcher that would hang.
if(TARGET dopt_tests AND TARGET dopt-run)
  add_dependencies(dopt_tests dopt-run)
  dopt_catch_test_properties("[launch]" "integration;launch" 60)
endif()
