# Losing a rank and going on, between real processes
# (tests/survive_multiprocess.test.cpp, tags [survive][multiprocess]):
# tests/survive_peer.cpp is one rank, started by hand or by dopt-run
# --on-failure continue. Label and timeout from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  add_executable(dopt_survive_peer survive_peer.cpp)
  target_link_libraries(dopt_survive_peer PRIVATE dopt::dopt)
  # The reference run it shares with the simulated tests (zero_survive_reference.hpp).
  target_include_directories(dopt_survive_peer PRIVATE "${PROJECT_SOURCE_DIR}/distributed/src")
  add_dependencies(dopt_tests dopt_survive_peer)
endif()
# PostLocalSGDOptimizer and the Reducer (tests/survive_replicated_peer.cpp):
# the scenarios of the unit tests (distributed/src/survive/survive_replicated_scenarios.hpp).
if(TARGET dopt_tests)
  add_executable(dopt_survive_replicated_peer survive_replicated_peer.cpp)
  target_link_libraries(dopt_survive_replicated_peer PRIVATE dopt::dopt)
  target_include_directories(dopt_survive_replicated_peer PRIVATE "${PROJECT_SOURCE_DIR}/distributed/src")
  add_dependencies(dopt_tests dopt_survive_replicated_peer)
endif()
