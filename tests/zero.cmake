# ZeroRedundancyOptimizer and Join between real processes
# (tests/zero_multiprocess.test.cpp, tags [zero][multiprocess]):
# tests/zero_peer.cpp is one rank, started by dopt-run or by hand. The
# [multiprocess] label and 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  add_executable(dopt_zero_peer zero_peer.cpp)
  target_link_libraries(dopt_zero_peer PRIVATE dopt::dopt)
  add_dependencies(dopt_tests dopt_zero_peer)
endif()
