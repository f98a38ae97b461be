# The rendezvous of real processes (tests/rendezvous.test.cpp, tags
# [rendezvous][multiprocess]) launches tests/rendezvous_peer.cpp as separate
# processes, by hand and through dopt-run. Each such test gets the label
# "multiprocess" and a 60 s TIMEOUT (the backstop for a hang); the
# properties come from dopt_catch_test_properties (cmake/DoptHelpers.cmake).
if(TARGET dopt_tests)
  dopt_test_peer(rendezvous)
  if(TARGET dopt-run)
    add_dependencies(dopt_tests dopt-run)
  endif()
  dopt_catch_test_properties("[multiprocess]" "integration;multiprocess" 60)
endif()
