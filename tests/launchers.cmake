# A dopt program under torchrun (static and standalone), SLURM's environment
# and mpirun, and on the MPI plane (DOPT_BACKEND=mpi): tests/launchers.sh.
# A scenario whose launcher (or the MPI plane) is missing reports itself
# skipped with the reason.
if(TARGET dopt_collectives_peer AND TARGET dopt-run)
  set(_ln "${CMAKE_CURRENT_SOURCE_DIR}/launchers.sh")
  set(_ln_tests
    "torchrun|plain torchrun (its agent's store on MASTER_PORT), 2 ranks"
    "standalone|torchrun --standalone, 3 ranks"
    "slurm|SLURM's environment, 3 ranks"
    "mpi-battery|DOPT_BACKEND=mpi under mpirun, every collective, 3 ranks"
    "mpi-digest|DOPT_BACKEND=mpi bit for bit as shared memory, 4 ranks"
    "mpi-zero|ZeRO parity and Join on the MPI plane, 3 ranks"
    "mpi-plsgd|post-local SGD and the reducer on the MPI plane, 4 ranks")
  foreach(_t IN LISTS _ln_tests)
    string(REPLACE "|" ";" _parts "${_t}")
    list(GET _parts 0 _scenario)
    list(GET _parts 1 _what)
    add_test(NAME "launchers: ${_what}" COMMAND ${_ln} ${_scenario} ${PROJECT_BINARY_DIR})
    set_tests_properties("launchers: ${_what}" PROPERTIES
      LABELS "integration;multiprocess;launch" TIMEOUT 180 SKIP_RETURN_CODE 77)
  endforeach()
endif()
