# A hostile environment (issue 41): strangers on every port of a running job
# and of a rendezvous (tests/hostile.test.cpp, tag [hostile]), a /dev/shm
# with no room (tests/shm_full.sh, in a mount namespace of its own; root
# only, skipped with the reason elsewhere). Label "hostile" (with
# "reliability"): ctest -L hostile, about 40 s on 2 cores.
if(TARGET dopt_tests)
  dopt_catch_test_properties("[hostile]" "integration;multiprocess;reliability;hostile" 180)
  if(TARGET dopt-train)
    add_dependencies(dopt_tests dopt-train dopt-run)
  endif()
endif()
if(TARGET dopt-train AND TARGET dopt-run)
  add_test(NAME "hostile: a /dev/shm without room is an error naming it, never a SIGBUS"
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/shm_full.sh ${PROJECT_BINARY_DIR})
  set_tests_properties("hostile: a /dev/shm without room is an error naming it, never a SIGBUS"
                       PROPERTIES LABELS "integration;reliability;hostile;namespaces" TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
