# Losing a rank and going on, between real processes
# (tests/survive_multiprocess.test.cpp, tags [survive][multiprocess]):
# tests/survive_peer.cpp is one rank, started by hand or by dopt-run
# --on-failure continue. Label and timeout from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  add_executable(dopt_survive_peer survive_peer.cpp)
  target_link_libraries(dopt_survive_peer PRIVATE dopt::dopt)
  add_dependencies(dopt_tests dopt_survive_peer)
endif()
