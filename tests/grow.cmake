# Growing a group between real processes (tests/replace_multiprocess.test.cpp,
# tags [replace][multiprocess]): tests/grow_peer.cpp is one rank, started by
# hand or by dopt-run. Label and timeout from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(grow)
endif()
