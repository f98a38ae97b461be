# Losing a rank and going on, between real processes
# (tests/survive_multiprocess.test.cpp, tags [survive][multiprocess]):
# tests/survive_peer.cpp is one rank, started by hand or by dopt-run
# --on-failure continue. Label and timeout from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  # The reference run it shares with the simulated tests (zero_survive_reference.hpp).
  dopt_test_peer(survive distributed/src)
endif()
# PostLocalSGDOptimizer and the Reducer (tests/survive_replicated_peer.cpp):
# the scenarios of the unit tests (distributed/src/survive/survive_replicated_scenarios.hpp).
if(TARGET dopt_tests)
  dopt_test_peer(survive_replicated distributed/src)
endif()
