# Collectives between real processes (tests/collectives.test.cpp, tags
# [collectives][multiprocess]): tests/collectives_peer.cpp is one rank,
# started by dopt-run, by mpirun (when OpenMPI is installed) or by hand.
# The [multiprocess] label and 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  dopt_test_peer(collectives)
  find_program(DOPT_MPIRUN NAMES mpirun)
  if(DOPT_MPIRUN)
    target_compile_definitions(dopt_tests PRIVATE DOPT_MPIRUN="${DOPT_MPIRUN}")
  endif()
endif()
