# A dopt program under torchrun (static and standalone; dopt-train under the
# elastic agent's restarts and growth), SLURM's environment,
# a real srun and sbatch (tests/slurm_cluster.sh starts a SLURM cluster on
# this machine) and mpirun, and on the MPI plane (DOPT_BACKEND=mpi):
# tests/launchers.sh.
# A scenario whose launcher (or the MPI plane) is missing reports itself
# skipped with the reason. Entries: scenario|what[|timeout in s, default 180].
if(TARGET dopt_collectives_peer AND TARGET dopt-run)
  set(_ln "${CMAKE_CURRENT_SOURCE_DIR}/launchers.sh")
  set(_ln_tests
    "torchrun|plain torchrun (its agent's store on MASTER_PORT), 2 ranks"
    "standalone|torchrun --standalone, 3 ranks"
    "elastic-restart|torchrun's elastic agent (c10d, --nnodes 1:2, --max_restarts 3): a worker SIGKILLed, dopt-train resumes in round 1 and ends as an uninterrupted run|120"
    "static-restart|torchrun's static rendezvous with --max_restarts 3: rank 0 SIGKILLed, dopt-train resumes in round 1 and ends as an uninterrupted run|120"
    "elastic-grow|torchrun's elastic agent: a second agent joins, dopt-train --elastic resumes at 4 ranks where the 2 stopped|120"
    "elastic-shrink|torchrun's elastic agent: the second node dies, dopt-train --elastic resumes its 4 ranks' checkpoint at 2|120"
    "slurm|SLURM's environment, 3 ranks"
    "srun|a real srun and sbatch on a SLURM cluster of this machine, 2 to 4 ranks|240"
    "mpi-battery|DOPT_BACKEND=mpi under mpirun, every collective, 3 ranks"
    "mpi-digest|DOPT_BACKEND=mpi bit for bit as shared memory, 4 ranks"
    "mpi-zero|ZeRO parity and Join on the MPI plane, 3 ranks"
    "mpi-plsgd|post-local SGD and the reducer on the MPI plane, 4 ranks")
  foreach(_t IN LISTS _ln_tests)
    string(REPLACE "|" ";" _parts "${_t}")
    list(GET _parts 0 _scenario)
    list(GET _parts 1 _what)
    set(_timeout 180)
    list(LENGTH _parts _n)
    if(_n GREATER 2)
      list(GET _parts 2 _timeout)
    endif()
    add_test(NAME "launchers: ${_what}" COMMAND ${_ln} ${_scenario} ${PROJECT_BINARY_DIR})
    set_tests_properties("launchers: ${_what}" PROPERTIES
      LABELS "integration;multiprocess;launch" TIMEOUT ${_timeout} SKIP_RETURN_CODE 77)
  endforeach()
endif()
