# Multi-host tests: each "host" a network namespace of its own on this machine
# (tests/multihost.sh makes and removes them). Root only: elsewhere each test
# reports itself skipped with the reason. Label multihost; run one at a time
# (they start 4 processes each, and bind fixed ports inside their namespaces).
if(TARGET dopt_collectives_peer AND TARGET dopt-run)
  set(_mh "${CMAKE_CURRENT_SOURCE_DIR}/multihost.sh")
  set(_mh_tests
    "battery|every collective exact, 2 hosts x 2 ranks on the hierarchical plane"
    "digest|every collective bit for bit as on one host, 2 hosts x 2 ranks"
    "digest1|every collective bit for bit as on one host, 2 hosts x 1 rank (the TCP ring)"
    "zero|ZeroRedundancyOptimizer parity, 2 hosts x 2 ranks"
    "plsgd|post-local SGD parity, 2 hosts x 2 ranks"
    "slow|the battery over 100 Mbit/s links, default timeouts"
    "cut|a link cut during all_reduce: every rank fails in time naming the lost ranks"
    "ipv6|the battery over IPv6 only"
    "portrange|every listener within DOPT_PORT_RANGE"
    "samename|two namespaces with one host name: hierarchical plane, and flat TCP with every interface bound"
    "sharedshm|two network namespaces sharing /dev/shm: the shared-memory plane"
    "ipc|two processes in separate IPC namespaces on one network: hierarchical plane"
    "unreachable|an advertised address nobody has: every rank fails naming it"
    "mpirun|mpirun across the namespaces: the battery, and DOPT_BACKEND=mpi bit for bit as one host"
    "torchrun|torchrun's c10d rendezvous across 2 hosts whose own name is 127.0.1.1: the battery")
  foreach(_t IN LISTS _mh_tests)
    string(REPLACE "|" ";" _parts "${_t}")
    list(GET _parts 0 _scenario)
    list(GET _parts 1 _what)
    add_test(NAME "multihost: ${_what}"
             COMMAND ${_mh} ${_scenario} ${PROJECT_BINARY_DIR})
    set_tests_properties("multihost: ${_what}" PROPERTIES
      LABELS "multihost;multiprocess" TIMEOUT 150 RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
  endforeach()
endif()
# One rank per "host" (DOPT_HOST_ID per rank, no root needed): the
# hierarchical plane's TCP ring path, at an uneven world size.
if(TARGET dopt_collectives_peer)
  add_test(NAME "hier: every collective exact, 3 hosts x 1 rank (the TCP ring)"
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/as_hosts.sh 3 1 $<TARGET_FILE:dopt_collectives_peer> battery)
  set_tests_properties("hier: every collective exact, 3 hosts x 1 rank (the TCP ring)"
                       PROPERTIES LABELS "integration;multiprocess" TIMEOUT 120)
endif()
