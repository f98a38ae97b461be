# dopt_add_component(<name> [DEPS <targets>...] [PRIVATE_DEPS <targets>...])
#
# A component is a folder <name>/ holding its public header tree
# <name>/dopt/<name>/*.hpp, its sources <name>/src/*.cpp and its unit tests
# beside them as <name>/src/*.test.cpp. It becomes the library dopt_<name>.
# Unit tests are collected into the global property DOPT_UNIT_TEST_SOURCES and
# compiled into one binary (tests/), because Catch2 compiles slowly.
# The wall is a folder (docs/architecture.md, tests/check_wall.py): every
# header of <name>/dopt/<name>/ and of <name>/dopt/<name>/detail/ (template
# machinery the public headers include) is installed; <name>/dopt/<name>/internal/
# (headers the library's components share) and <name>/src/ never are. The
# installed headers are collected in the global property DOPT_INSTALLED_HEADERS
# (as "<include dir>|<dopt/<name>/file.hpp>") for the self-containment check.
function(dopt_add_component name)
  cmake_parse_arguments(ARG "" "" "DEPS;PRIVATE_DEPS" ${ARGN})
  set(dir "${CMAKE_CURRENT_SOURCE_DIR}")
  file(GLOB_RECURSE all_sources CONFIGURE_DEPENDS "${dir}/src/*.cpp")
  set(lib_sources "")
  set(test_sources "")
  foreach(src IN LISTS all_sources)
    if(src MATCHES "\\.test\\.cpp$")
      list(APPEND test_sources "${src}")
    else()
      list(APPEND lib_sources "${src}")
    endif()
  endforeach()
  if(lib_sources)
    add_library(dopt_${name} ${lib_sources})
    set(scope PUBLIC)
  else()  # header-only so far
    add_library(dopt_${name} INTERFACE)
    set(scope INTERFACE)
  endif()
  add_library(dopt::${name} ALIAS dopt_${name})
  target_include_directories(dopt_${name} ${scope}
    $<BUILD_INTERFACE:${dir}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(dopt_${name} ${scope} ${ARG_DEPS})
  if(lib_sources AND ARG_PRIVATE_DEPS)
    target_link_libraries(dopt_${name} PRIVATE ${ARG_PRIVATE_DEPS})
  endif()
  target_compile_features(dopt_${name} ${scope} cxx_std_20)
  set_property(TARGET dopt_${name} PROPERTY EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY DOPT_UNIT_TEST_SOURCES ${test_sources})
  set_property(GLOBAL APPEND PROPERTY DOPT_COMPONENTS dopt_${name})
  dopt_install_headers("${dir}" ${name})
endfunction()

# dopt_install_headers(<component dir> <name>)
#
# Installs <dir>/dopt/<name>/*.hpp into include/dopt/<name>/ and
# <dir>/dopt/<name>/detail/*.hpp into include/dopt/<name>/detail/ (never
# internal/), and records them in DOPT_INSTALLED_HEADERS.
function(dopt_install_headers dir name)
  foreach(sub IN ITEMS "" "detail/")
    file(GLOB headers CONFIGURE_DEPENDS RELATIVE "${dir}" "${dir}/dopt/${name}/${sub}*.hpp")
    set(public "")
    foreach(h IN LISTS headers)
      list(APPEND public "${dir}/${h}")
      set_property(GLOBAL APPEND PROPERTY DOPT_INSTALLED_HEADERS "${dir}|${h}")
    endforeach()
    if(public)
      install(FILES ${public} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dopt/${name}/${sub})
    endif()
  endforeach()
endfunction()

# dopt_catch_test_properties(<tag> <labels> <timeout>)
#
# Adds the CTest labels <labels> (a ;-list) to every test of dopt_tests whose
# Catch tag is <tag>, and gives it a TIMEOUT. catch_discover_tests registers the names
# (as "it: <name>") only when ctest runs, so the properties are set by a script
# that ctest includes after that registration; it lists the tagged test names
# from the binary itself.
function(dopt_catch_test_properties tag labels timeout)
  string(MAKE_C_IDENTIFIER "${tag}" id)
  set(script [=[
set(_exe "@EXE@")
if(EXISTS "${_exe}")
  execute_process(COMMAND "${_exe}" "@TAG@" --list-test-names-only
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
          # Labels add up over the calls (a test with several tags gets every
          # tag's labels, after catch_discover_tests' "integration"); the
          # timeout of the last matching call wins.
          string(MAKE_C_IDENTIFIER "${_full}" _key)
          if(NOT DEFINED _dopt_labels_${_key})
            set(_dopt_labels_${_key} integration)
          endif()
          list(APPEND _dopt_labels_${_key} @LABELS@)
          list(REMOVE_DUPLICATES _dopt_labels_${_key})
          set_tests_properties("${_full}" PROPERTIES TIMEOUT @TIMEOUT@ LABELS "${_dopt_labels_${_key}}")
        endif()
      endforeach()
    endforeach()
  endif()
endif()
]=])
  string(REPLACE "@EXE@" "$<TARGET_FILE:dopt_tests>" script "${script}")
  string(REPLACE "@DIR@" "${CMAKE_CURRENT_BINARY_DIR}" script "${script}")
  string(REPLACE "@TAG@" "${tag}" script "${script}")
  string(REPLACE "@TIMEOUT@" "${timeout}" script "${script}")
  string(REPLACE "@LABELS@" "${labels}" script "${script}")
  set(out "${CMAKE_CURRENT_BINARY_DIR}/${id}_test_properties.cmake")
  file(GENERATE OUTPUT "${out}" CONTENT "${script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${out}")
endfunction()
