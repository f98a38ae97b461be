# DiLoCo between real processes (tests/diloco_multiprocess.test.cpp, tags
# [diloco][multiprocess]): tests/diloco_peer.cpp is one rank, started by
# dopt-run or by hand. It shares the float64 reference of the unit tests
# (distributed/src/local_sgd/diloco_reference.hpp).
if(TARGET dopt_tests)
  dopt_test_peer(diloco distributed/src)
  # The same scenario on the hierarchical plane (shared memory within a
  # "host", TCP between them; tests/as_hosts.sh), 3 hosts x 1 and 2 x 2 ranks.
  foreach(_shape "3 1" "2 2")
    string(REPLACE " " ";" _args "${_shape}")
    string(REPLACE " " " hosts x " _name "${_shape}")
    add_test(NAME "hier: DiLoCo (reference, wire formats, resume), ${_name} ranks"
             COMMAND "${CMAKE_CURRENT_SOURCE_DIR}/as_hosts.sh" ${_args} $<TARGET_FILE:dopt_diloco_peer> diloco
                     "${CMAKE_CURRENT_BINARY_DIR}")
    set_tests_properties("hier: DiLoCo (reference, wire formats, resume), ${_name} ranks" PROPERTIES
                         LABELS "integration;multiprocess" TIMEOUT 120)
  endforeach()
endif()
