# ZeroRedundancyOptimizer and Join between real processes
# (tests/zero_multiprocess.test.cpp, tags [zero][multiprocess]):
# tests/zero_peer.cpp is one rank, started by dopt-run or by hand. The
# [multiprocess] label and 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(zero)
endif()
