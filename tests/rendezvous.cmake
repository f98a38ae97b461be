# The rendezvous of real processes (tests/rendezvous.test.cpp, tags
# [rendezvous][multiprocess]) launches tests/rendezvous_peer.cpp as separate
# processes, by hand and through dopt-run. Each such test gets the label
# "multiprocess" and a 60 s TIMEOUT (the backstop for a hang); like
# launcher.cmake, the properties are set by a script that ctest includes after
# catch_discover_tests registered the names.
if(TARGET dopt_tests)
  add_executable(dopt_rendezvous_peer rendezvous_peer.cpp)
  target_link_libraries(dopt_rendezvous_peer PRIVATE dopt::dopt)
  add_dependencies(dopt_tests dopt_rendezvous_peer)
  if(TARGET dopt-run)
    add_dependencies(dopt_tests dopt-run)
  endif()
  set(_mp_props_script [=[
set(_exe "@EXE@")
if(EXISTS "${_exe}")
  execute_process(COMMAND "${_exe}" "[multiprocess]" --list-test-names-only
    OUTPUT_VARIABLE _names RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc GREATER_EQUAL 0)
    file(GLOB _reg_files "@DIR@/dopt_tests_tests-*.cmake")
    set(_registered "")
    foreach(_f IN LISTS _reg_files)
      file(READ "${_f}" _c)
      string(APPEND _registered "${_c}")
    endforeach()
    string(REPLACE "\n" ";" _names "${_names}")
    foreach(_name IN LISTS _names)
      string(STRIP "${_name}" _name)
      foreach(_full IN ITEMS "it: ${_name}" "it:${_name}")
        string(FIND "${_registered}" "[==[${_full}]==]" _at)
        if(_name AND _at GREATER_EQUAL 0)
          set_tests_properties("${_full}" PROPERTIES TIMEOUT 60 LABELS "integration;multiprocess")
        endif()
      endforeach()
    endforeach()
  endif()
endif()
]=])
  string(REPLACE "@EXE@" "$<TARGET_FILE:dopt_tests>" _mp_props_script "${_mp_props_script}")
  string(REPLACE "@DIR@" "${CMAKE_CURRENT_BINARY_DIR}" _mp_props_script "${_mp_props_script}")
  file(GENERATE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/rendezvous_test_properties.cmake"
       CONTENT "${_mp_props_script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES
               "${CMAKE_CURRENT_BINARY_DIR}/rendezvous_test_properties.cmake")
endif()
