# Huge pages for shared memory (ZeroBuddyUpdate::host_memory's segments):
# the "[huge]" unit tests again with /dev/shm mounted huge=always in a mount
# namespace of the test's own (root only; skipped with the reason elsewhere).
if(TARGET dopt_unit_tests)
  add_test(NAME "huge pages: shm segments and host_memory's note with /dev/shm mounted huge=always"
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/huge_shm_namespace.sh $<TARGET_FILE:dopt_unit_tests>)
  set_tests_properties("huge pages: shm segments and host_memory's note with /dev/shm mounted huge=always"
                       PROPERTIES LABELS "unit;namespaces" TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
