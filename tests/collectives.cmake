# Collectives between real processes (tests/collectives.test.cpp, tags
# [collectives][multiprocess]): tests/collectives_peer.cpp is one rank,
# started by dopt-run, by mpirun (when OpenMPI is installed) or by hand.
# The [multiprocess] label and 60 s timeout come from tests/rendezvous.cmake.
if(TARGET dopt_tests)
  add_executable(dopt_collectives_peer collectives_peer.cpp)
  target_link_libraries(dopt_collectives_peer PRIVATE dopt::dopt)
  add_dependencies(dopt_tests dopt_collectives_peer)
  find_program(DOPT_MPIRUN NAMES mpirun)
  if(DOPT_MPIRUN)
    target_compile_definitions(dopt_tests PRIVATE DOPT_MPIRUN="${DOPT_MPIRUN}")
  endif()
endif()
