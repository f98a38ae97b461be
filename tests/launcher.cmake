# dopt-run's integration tests (tests/launcher.test.cpp, tag [launch]) run the
# launcher binary, so dopt_tests depends on it; each gets the extra label
# "launch" and a 60 s TIMEOUT, the backstop for a launcher that would hang.
# catch_discover_tests registers them (as "it: <name>") when ctest runs, so the
# properties are set by a script that ctest includes after that registration:
# it lists the [launch] test names from the binary itself.
if(TARGET dopt_tests AND TARGET dopt-run)
  add_dependencies(dopt_tests dopt-run)
  set(_launch_props_script [=[
set(_exe "@EXE@")
if(EXISTS "${_exe}")
  execute_process(COMMAND "${_exe}" "[launch]" --list-test-names-only
    OUTPUT_VARIABLE _names RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc GREATER_EQUAL 0)
    # What catch_discover_tests registered, to learn the exact prefix.
    file(GLOB _reg_files "@DIR@/dopt_tests_tests-*.cmake")
    set(_registered "")
    foreach(_f IN LISTS _reg_files)
      file(READ "${_f}" _c)
      string(APPEND _registered "${_c}")
    endforeach()
    string(REPLACE "\n" ";" _names "${_names}")
    foreach(_name IN LISTS _names)
      string(STRIP "${_name}" _name)
      # Catch.cmake drops the blank of TEST_PREFIX "it: " on some versions.
      foreach(_full IN ITEMS "it: ${_name}" "it:${_name}")
        string(FIND "${_registered}" "[==[${_full}]==]" _at)
        if(_name AND _at GREATER_EQUAL 0)
          set_tests_properties("${_full}" PROPERTIES TIMEOUT 60 LABELS "integration;launch")
        endif()
      endforeach()
    endforeach()
  endif()
endif()
]=])
  string(REPLACE "@EXE@" "$<TARGET_FILE:dopt_tests>" _launch_props_script "${_launch_props_script}")
  string(REPLACE "@DIR@" "${CMAKE_CURRENT_BINARY_DIR}" _launch_props_script "${_launch_props_script}")
  file(GENERATE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/launcher_test_properties.cmake"
       CONTENT "${_launch_props_script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES
               "${CMAKE_CURRENT_BINARY_DIR}/launcher_test_properties.cmake")
endif()
